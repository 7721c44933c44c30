package throttle_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
)

// TestLocalRefundGoesToNoQueuedCaller: an abandoned
// reservation's refund must not hand its slot to a caller queued behind
// it, which would put two permits in one slot. With burst 1 and 10 per
// second, permits are at least 100 ms apart whatever is refunded.
func TestLocalRefundGoesToNoQueuedCaller(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := newLocal(t, clock, 10, time.Second, throttle.WithLocalBurst(1))
	lim := throttle.New(b, throttle.WithClock(clock))
	ctx := context.Background()
	require.NoError(t, lim.Acquire(ctx, 0), "the burst of one at t=0")

	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	a := result(func() error { return lim.Acquire(actx, time.Second) }) // slot at 100 ms
	waitForSleepers(t, clock, 1)
	bch := result(func() error { return lim.Acquire(ctx, time.Second) }) // slot at 200 ms
	waitForSleepers(t, clock, 2)
	cancel()
	require.Error(t, <-a, "the first reservation is abandoned")
	c := result(func() error { return lim.Acquire(ctx, time.Second) })
	waitForSleepers(t, clock, 2) // B and C queue

	clock.Advance(200 * time.Millisecond)
	require.NoError(t, <-bch, "B's slot at 200 ms")
	// C must still sleep: its slot cannot be B's.
	bctx, bcancel := context.WithTimeout(ctx, 2*time.Second)
	defer bcancel()
	require.NoError(t, clock.BlockUntilContext(bctx, 1), "C got B's slot: two permits at 200 ms with burst 1")
	select {
	case err := <-c:
		t.Fatalf("C returned at 200 ms (%v): two permits in one slot", err)
	default:
	}
	clock.Advance(100 * time.Millisecond)
	require.NoError(t, <-c)
}

// TestLeasedWeightedTakeAcrossPeriodEnd: a weighted take that uses the
// lease's left-over permits and fetches the rest must not hand out the old
// period's permits in the new period, on top of the new period's full
// limit.
func TestLeasedWeightedTakeAcrossPeriodEnd(t *testing.T) {
	clock := clockwork.NewFakeClock()
	start := clock.Now()
	inner := &periodBucket{clock: clock, start: start, limit: 10, interval: time.Second}
	l := throttle.New(inner, throttle.WithClock(clock), throttle.WithLeasing(throttle.Leasing{Share: 1}))
	t.Cleanup(func() { _ = l.Close() })
	ctx := context.Background()
	handed := map[int64]int64{} // period → permits handed out, by the time Acquire returned
	take := func(n int64) bool {
		err := l.AcquireN(ctx, n, 0)
		if err != nil {
			require.ErrorIs(t, err, throttle.ErrTimeout)
			return false
		}
		handed[int64(clock.Since(start)/time.Second)] += n
		return true
	}
	require.True(t, take(1))
	clock.Advance(10 * time.Millisecond)
	require.True(t, take(1)) // a batch with left-overs
	clock.Advance(980 * time.Millisecond)
	inner.setLatency(20 * time.Millisecond) // the next refill reaches the store after the period's end
	require.True(t, take(6))
	inner.setLatency(0)
	for take(1) {
	}
	assert.LessOrEqual(t, handed[1], int64(10), "period 1 handed out %d, limit 10 (period 0: %d)", handed[1], handed[0])
}

// periodBucket grants at most limit per aligned period, reporting the
// time to the period's end as Reset. Each Take first lets latency pass on
// the clock, as a slow round trip would.
type periodBucket struct {
	clock    *clockwork.FakeClock
	start    time.Time
	limit    int64
	interval time.Duration

	mu      sync.Mutex
	latency time.Duration
	period  int64
	used    int64
}

func (p *periodBucket) setLatency(d time.Duration) { p.mu.Lock(); p.latency = d; p.mu.Unlock() }

func (p *periodBucket) Take(_ context.Context, _ string, n int64, _ time.Duration) (throttle.Decision, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.latency > 0 {
		p.clock.Advance(p.latency)
	}
	since := p.clock.Since(p.start)
	if k := int64(since / p.interval); k != p.period {
		p.period, p.used = k, 0
	}
	reset := time.Duration(p.period+1)*p.interval - since
	if p.used+n > p.limit {
		return throttle.Decision{Delay: reset, Limit: p.limit, Remaining: p.limit - p.used, Reset: reset}, nil
	}
	p.used += n
	return throttle.Decision{Granted: true, Limit: p.limit, Remaining: p.limit - p.used, Reset: reset}, nil
}

// TestPauseForeverDoesNotOverflow: a pause of throttle.Forever (or any
// duration that overflows the clock's arithmetic) is clamped, never a
// no-op, by a leasing Limiter's report.
func TestPauseForeverDoesNotOverflow(t *testing.T) {
	clock := clockwork.NewFakeClock()
	ctx := context.Background()
	clock.Advance(time.Hour) // some time after the buckets' epoch
	lim := throttle.New(newLocal(t, clock, 10, time.Second), throttle.WithClock(clock), throttle.WithLeasing(throttle.Leasing{TTL: time.Second}))
	defer lim.Close()
	require.NoError(t, lim.Key("k").Acquire(ctx, 0))
	require.NoError(t, lim.Key("k").Report(ctx, throttle.Answer{Refused: true, Retry: true, RetryAfter: throttle.Forever}))
	clock.Advance(30 * time.Minute)
	assert.ErrorIs(t, lim.Key("k").Acquire(ctx, 0), throttle.ErrTimeout, "a leasing Limiter paused for ever still refuses half an hour later")
}

// keyedStore is a shared-store stand-in with a limit per key: while up it
// grants, reporting the key's limit, what is left and a period that ends
// in a second; while down it fails. It records the n of every Take.
type keyedStore struct {
	mu     sync.Mutex
	down   bool
	limits map[string]int64
	base   int64
	inst   int64
	asked  []int64
}

func (s *keyedStore) set(down bool) { s.mu.Lock(); s.down = down; s.mu.Unlock() }

func (s *keyedStore) Take(_ context.Context, key string, n int64, _ time.Duration) (throttle.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, n)
	if s.down {
		return throttle.Decision{}, &throttle.BackendError{Op: "take", Err: context.DeadlineExceeded}
	}
	lim := s.base
	if l, ok := s.limits[key]; ok {
		lim = l
	}
	return throttle.Decision{Granted: true, Limit: lim, Remaining: 0, Reset: time.Second}, nil
}

func (s *keyedStore) Fallback() (int64, time.Duration, int64) { return s.base, time.Second, s.inst }

// TestFailLocalKeepsPerKeyLimits: a tenant whose
// limit was lowered live keeps its own limit while the store is down, not
// the base key's.
func TestFailLocalKeepsPerKeyLimits(t *testing.T) {
	clock := clockwork.NewFakeClock()
	s := &keyedStore{base: 100, inst: 1, limits: map[string]int64{"tenant": 3}}
	lim := throttle.New(s, throttle.WithClock(clock))
	ctx := context.Background()
	require.NoError(t, lim.Key("tenant").Acquire(ctx, 0))
	s.set(true)
	granted := 0
	for range 30 { // 3 s in steps of 100 ms
		for lim.Key("tenant").Acquire(ctx, 0) == nil {
			granted++
		}
		clock.Advance(100 * time.Millisecond)
	}
	assert.LessOrEqual(t, granted, 9, "3 per second for 3 s at most; the base key's 100 per second would give far more")
	assert.Positive(t, granted)
}

// TestFailLocalAccountsForLocalGrantsOnRecovery: when the store answers
// again, the permits granted locally in the running interval are taken
// from the shared bucket before its grants resume.
func TestFailLocalAccountsForLocalGrantsOnRecovery(t *testing.T) {
	clock := clockwork.NewFakeClock()
	s := &keyedStore{base: 10, inst: 1}
	lim := throttle.New(s, throttle.WithClock(clock))
	ctx := context.Background()
	require.NoError(t, lim.Acquire(ctx, 0))
	s.set(true)
	local := 0
	for range 15 { // 1.5 s: nothing in the first second (the running period's unknown), then 10/s
		for lim.Acquire(ctx, 0) == nil {
			local++
		}
		clock.Advance(100 * time.Millisecond)
	}
	require.Positive(t, local)
	s.set(false)
	s.mu.Lock()
	s.asked = nil
	s.mu.Unlock()
	require.NoError(t, lim.Acquire(ctx, 0))
	s.mu.Lock()
	defer s.mu.Unlock()
	assert.Equal(t, []int64{1 + int64(local)}, s.asked, "the probe asks for its permit and the %d local grants at once", local)
	s.asked = nil
	s.mu.Unlock()
	require.NoError(t, lim.Acquire(ctx, 0))
	s.mu.Lock()
	assert.Equal(t, []int64{1}, s.asked, "accounted once")
}
