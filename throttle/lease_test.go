package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// windowBucket is a test bucket with fixed windows aligned on its clock's
// start: at most limit grants per window, Decision.Reset the time until
// the window ends, as the Redis token bucket and fixed window report it.
// It counts what it grants and what comes back, per window, on its own.
type windowBucket struct {
	clock    clockwork.Clock
	start    time.Time
	limit    int64
	interval time.Duration

	mu       sync.Mutex
	window   int64
	used     int64
	granted  map[int64]int64 // window → permits granted (refunds deducted)
	refunded atomic.Int64
}

func newWindowBucket(clock clockwork.Clock, limit int64, interval time.Duration) *windowBucket {
	return &windowBucket{clock: clock, start: clock.Now(), limit: limit, interval: interval, granted: map[int64]int64{}}
}

func (w *windowBucket) roll() (window int64, left time.Duration) {
	since := w.clock.Since(w.start)
	window = int64(since / w.interval)
	if window != w.window {
		w.window, w.used = window, 0
	}
	return window, time.Duration(window+1)*w.interval - since
}

func (w *windowBucket) Take(_ context.Context, _ string, n int64, _ time.Duration) (Decision, error) {
	if n > w.limit {
		return Decision{}, fmt.Errorf("window: %d > %d: %w", n, w.limit, ErrExceedsLimit)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	window, left := w.roll()
	if w.used+n > w.limit {
		return Decision{Delay: left, Limit: w.limit, Remaining: w.limit - w.used, Reset: left}, nil
	}
	w.used += n
	w.granted[window] += n
	return Decision{Granted: true, Limit: w.limit, Remaining: w.limit - w.used, Reset: left}, nil
}

// Refund takes permits back into the current window only.
func (w *windowBucket) Refund(_ context.Context, _ string, n int64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	window, _ := w.roll()
	n = min(n, w.used)
	w.used -= n
	w.granted[window] -= n
	w.refunded.Add(n)
	return nil
}

func (w *windowBucket) grantedIn(window int64) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.granted[window]
}

// counting wraps a bucket, counting calls and the most calls in flight at
// once, and passing refunds and pauses on.
type counting struct {
	Bucket
	calls, refunds, refunded atomic.Int64
	inflight, maxInflight    atomic.Int64
	pauses                   atomic.Int64
	// gate, if set, is received from before each call reaches the bucket.
	gate chan struct{}
	// entered, if set, gets a value as each call starts.
	entered chan struct{}
}

func (c *counting) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (Decision, error) {
	c.calls.Add(1)
	in := c.inflight.Add(1)
	defer c.inflight.Add(-1)
	for {
		old := c.maxInflight.Load()
		if in <= old || c.maxInflight.CompareAndSwap(old, in) {
			break
		}
	}
	if c.entered != nil {
		c.entered <- struct{}{}
	}
	if c.gate != nil {
		<-c.gate
	}
	return c.Bucket.Take(ctx, key, n, maxWait)
}

func (c *counting) Refund(ctx context.Context, key string, n int64) error {
	c.refunds.Add(1)
	c.refunded.Add(n)
	if r, ok := c.Bucket.(Refunder); ok {
		return r.Refund(ctx, key, n)
	}
	return nil
}

func (c *counting) Pause(ctx context.Context, key string, d time.Duration) error {
	c.pauses.Add(1)
	if p, ok := c.Bucket.(Pauser); ok {
		return p.Pause(ctx, key, d)
	}
	return nil
}

func newLeasedT(t testing.TB, inner Bucket, opts ...LeasedOption) *Leased {
	t.Helper()
	l, err := NewLeased(inner, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestNewLeasedRefusesBadConfig(t *testing.T) {
	inner := newWindowBucket(clockwork.NewFakeClock(), 10, time.Second)
	tests := []struct {
		inner Bucket
		opts  []LeasedOption
		want  string
	}{
		{nil, nil, "inner = <nil>"},
		{inner, []LeasedOption{WithLeaseHorizon(0)}, "horizon = 0s"},
		{inner, []LeasedOption{WithLeaseHorizon(-time.Second)}, "horizon = -1s"},
		{inner, []LeasedOption{WithLeaseTTL(-time.Millisecond)}, "ttl = -1ms"},
		{inner, []LeasedOption{WithLeaseShare(0)}, "share = 0"},
		{inner, []LeasedOption{WithLeaseShare(1.5)}, "share = 1.5"},
		{inner, []LeasedOption{WithLeaseShare(math.NaN())}, "share = NaN"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			l, err := NewLeased(tt.inner, tt.opts...)
			require.ErrorIs(t, err, ErrInvalid)
			assert.Nil(t, l)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	l := newLeasedT(t, inner)
	_, err := l.Take(context.Background(), "", 0, 0)
	require.ErrorIs(t, err, ErrInvalid)
}

// TestLeasedNeverExceedsTheWindow drives a Leased over a fixed-window
// bucket with demand far above the limit, at uneven times, and counts the
// permits handed out per window itself: never more than the limit, and
// nearly all of it used, with few calls to the inner bucket.
func TestLeasedNeverExceedsTheWindow(t *testing.T) {
	clock := clockwork.NewFakeClock()
	const limit, interval = 1000, time.Second
	inner := &counting{Bucket: newWindowBucket(clock, limit, interval)}
	l := newLeasedT(t, inner, WithClock(clock), withoutLeaseSweeper())
	ctx := context.Background()
	start := clock.Now()
	perWindow := map[int64]int64{}
	var handed int64
	for i := range 4000 {
		clock.Advance(time.Duration(i%3) * time.Millisecond)
		for range 1 + i%5 { // 1–5 callers now; ~3000 asked per second
			n := int64(1 + i%3)
			d, err := l.Take(ctx, "", n, 0)
			require.NoError(t, err)
			if d.Granted {
				perWindow[int64(clock.Since(start)/interval)] += n
				handed += n
			} else {
				require.Positive(t, d.Delay, "a refusal names when to come back")
			}
		}
	}
	windows := int64(clock.Since(start) / interval)
	for w := range windows {
		assert.LessOrEqual(t, perWindow[w], int64(limit), "window %d", w)
		assert.GreaterOrEqual(t, perWindow[w], int64(0.95*limit), "window %d: demand is far above the limit, the limit should be nearly all used", w)
	}
	assert.Less(t, float64(inner.calls.Load())/float64(handed), 0.1, "inner calls per permit: %d calls for %d permits", inner.calls.Load(), handed)
}

// TestLeasedConcurrentNeverExceedsTheWindow is the same with goroutines
// racing for permits, on two keys; the clock moves between rounds.
func TestLeasedConcurrentNeverExceedsTheWindow(t *testing.T) {
	clock := clockwork.NewFakeClock()
	const limit, interval = 500, 100 * time.Millisecond
	wb := newWindowBucket(clock, limit, interval)
	inner := &counting{Bucket: wb}
	l := newLeasedT(t, inner, WithClock(clock), withoutLeaseSweeper())
	start := clock.Now()
	const callers, rounds, perRound = 8, 200, 20 // 8·20 asked per 5 ms: 3× the limit
	var perWindow [rounds * 5 * time.Millisecond / interval]atomic.Int64
	for range rounds {
		w := int64(clock.Since(start) / interval)
		var wg sync.WaitGroup
		for g := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := ""
				if g%2 == 1 {
					key = "tenant"
				}
				for range perRound {
					d, err := l.Take(context.Background(), key, 1, 0)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Granted { // the window bucket has one budget for all keys
						perWindow[w].Add(1)
					}
				}
			}()
		}
		wg.Wait()
		clock.Advance(5 * time.Millisecond)
	}
	for w := range perWindow {
		n := perWindow[w].Load()
		assert.LessOrEqual(t, n, int64(limit), "window %d", w)
		assert.LessOrEqual(t, n, wb.grantedIn(int64(w)), "window %d: handed out more than the inner bucket granted in it", w)
		assert.GreaterOrEqual(t, n, int64(0.9*limit), "window %d: demand is 3× the limit", w)
	}
	assert.LessOrEqual(t, inner.maxInflight.Load(), int64(2), "at most one refill in flight per key (two keys here)")
}

// TestLeasedTokensExpireWithThePeriod: permits left in a lease when the
// inner bucket's period ends are not handed out in the next one.
func TestLeasedTokensExpireWithThePeriod(t *testing.T) {
	clock := clockwork.NewFakeClock()
	const limit, interval = 100, time.Second
	wb := newWindowBucket(clock, limit, interval)
	inner := &counting{Bucket: wb}
	l := newLeasedT(t, inner, WithClock(clock), withoutLeaseSweeper(), WithLeaseShare(0.5))
	ctx := context.Background()

	clock.Advance(100 * time.Millisecond)
	for range 40 { // a quick ramp: batches grow 1, 4, 16, ...
		d, err := l.Take(ctx, "", 1, 0)
		require.NoError(t, err)
		require.True(t, d.Granted)
		assert.Equal(t, 900*time.Millisecond, d.Reset, "a lease ends with the period it was taken in")
	}
	left := l.held("")
	require.Positive(t, left, "the ramp should leave permits in the lease")
	require.Equal(t, int64(40)+left, wb.grantedIn(0))

	clock.Advance(900 * time.Millisecond) // window 1 begins
	calls := inner.calls.Load()
	d, err := l.Take(ctx, "", 1, 0)
	require.NoError(t, err)
	require.True(t, d.Granted)
	assert.Equal(t, calls+1, inner.calls.Load(), "an expired lease must not serve: the first take of a period asks the inner bucket")
	handed := int64(1)
	for {
		d, err := l.Take(ctx, "", 1, 0)
		require.NoError(t, err)
		if !d.Granted {
			assert.Equal(t, interval, d.Delay, "dry: come back when window 1 ends")
			break
		}
		handed++
	}
	assert.Equal(t, int64(limit), handed, "window 1 hands out exactly its own limit, none of window 0's leftovers")
}

// TestLeasedOverLocalKeepsTheWidenedGuarantee runs a Leased with a TTL over
// a Local (GCRA) bucket, with demand that comes and goes so that leases are
// held, and checks the guarantee its doc states, by counting hand-outs
// itself: at most burst + rate·(t+ttl) in any span t.
func TestLeasedOverLocalKeepsTheWidenedGuarantee(t *testing.T) {
	clock := clockwork.NewFakeClock()
	const limit, burst, interval, ttl = 200, 20, time.Second, 30 * time.Millisecond
	local, err := NewLocal(limit, interval, WithClock(clock), WithBurst(burst))
	require.NoError(t, err)
	inner := &counting{Bucket: local}
	l := newLeasedT(t, inner, WithClock(clock), withoutLeaseSweeper(), WithLeaseTTL(ttl), WithLeaseShare(0.5))
	ctx := context.Background()
	start := clock.Now()
	var grants []time.Duration
	for i := range 6000 {
		clock.Advance(time.Duration(1+i%4) * time.Millisecond)
		if (i/50)%3 == 2 {
			continue // a quiet spell: leases are held, then used when demand returns
		}
		for range 1 + i%7 {
			d, err := l.Take(ctx, "", 1, 0)
			require.NoError(t, err)
			if d.Granted {
				assert.LessOrEqual(t, d.Reset, ttl, "a lease lives at most its TTL")
				grants = append(grants, clock.Since(start))
			}
		}
	}
	emission := int64(interval / limit)
	lo := 0
	for hi := range grants {
		for ; lo < hi; lo++ {
			span := int64(grants[hi] - grants[lo])
			if n := int64(hi - lo + 1); (n-burst)*emission <= span+int64(ttl) {
				break
			}
		}
		if n := int64(hi - lo + 1); (n-burst)*emission > int64(grants[hi]-grants[lo])+int64(ttl) {
			t.Fatalf("%d grants within %v: more than burst + rate·(t+ttl)", n, grants[hi]-grants[lo])
		}
	}
	total := clock.Since(start)
	active := float64(total) * 2 / 3
	assert.Greater(t, float64(len(grants)), 0.8*limit*active/float64(interval), "busy two thirds of the time, the rate should be well used")
	assert.Less(t, inner.calls.Load(), int64(len(grants))/3, "leasing must save inner calls")
}

// TestLeasedTTLExpiry: a lease past its TTL does not serve, even though the
// inner bucket's Reset is longer.
func TestLeasedTTLExpiry(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &counting{Bucket: newWindowBucket(clock, 1000, time.Hour)}
	l := newLeasedT(t, inner, WithClock(clock), withoutLeaseSweeper(), WithLeaseTTL(10*time.Millisecond))
	ctx := context.Background()
	for range 30 {
		_, err := l.Take(ctx, "", 1, 0)
		require.NoError(t, err)
	}
	require.Positive(t, l.held(""))
	calls := inner.calls.Load()
	clock.Advance(9 * time.Millisecond)
	d, err := l.Take(ctx, "", 1, 0)
	require.NoError(t, err)
	require.True(t, d.Granted)
	require.Equal(t, calls, inner.calls.Load(), "within its TTL the lease serves")
	assert.Equal(t, time.Millisecond, d.Reset)
	clock.Advance(time.Millisecond)
	_, err = l.Take(ctx, "", 1, 0)
	require.NoError(t, err)
	assert.Equal(t, calls+1, inner.calls.Load(), "at its TTL the lease is void")
}

// TestLeasedWeighted: takes of n > 1 use what the lease holds and fetch
// the rest in the same call; permits are conserved.
func TestLeasedWeighted(t *testing.T) {
	clock := clockwork.NewFakeClock()
	wb := newWindowBucket(clock, 1000, time.Second)
	inner := &counting{Bucket: wb}
	l := newLeasedT(t, inner, WithClock(clock), withoutLeaseSweeper())
	ctx := context.Background()
	var handed int64
	for i := range 150 {
		n := int64(1 + i%9)
		d, err := l.Take(ctx, "", n, 0)
		require.NoError(t, err)
		require.True(t, d.Granted)
		handed += n
	}
	assert.Equal(t, wb.grantedIn(0), handed+l.held(""), "every permit the inner bucket granted is handed out or still held")
	assert.Less(t, inner.calls.Load(), int64(50))

	// A take bigger than what is held: the held permits count toward it.
	held := l.held("")
	require.Positive(t, held)
	before := wb.grantedIn(0)
	d, err := l.Take(ctx, "", held+5, 0)
	require.NoError(t, err)
	require.True(t, d.Granted)
	handed += held + 5
	assert.Equal(t, wb.grantedIn(0), handed+l.held(""))
	assert.GreaterOrEqual(t, wb.grantedIn(0)-before, int64(5))

	_, err = l.Take(ctx, "", 1001, 0)
	require.ErrorIs(t, err, ErrExceedsLimit, "n above the inner limit can never be granted")
	require.NoError(t, l.Close())
	assert.Equal(t, handed, wb.grantedIn(0), "Close hands the rest back")
}

// TestLeasedRefillIsSingleflight: many callers find the lease dry at once;
// one refill at a time reaches the inner bucket, the others wait for it.
func TestLeasedRefillIsSingleflight(t *testing.T) {
	for _, key := range []string{"", "tenant"} {
		t.Run(fmt.Sprintf("key %q", key), func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			local, err := NewLocal(10_000, time.Second, WithClock(clock))
			require.NoError(t, err)
			inner := &counting{Bucket: local, gate: make(chan struct{}), entered: make(chan struct{})}
			l := newLeasedT(t, inner, WithClock(clock), withoutLeaseSweeper())
			const callers = 64
			var wg sync.WaitGroup
			var granted atomic.Int64
			started := make(chan struct{}, callers)
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					started <- struct{}{}
					d, err := l.Take(context.Background(), key, 1, 0)
					if err == nil && d.Granted {
						granted.Add(1)
					}
				}()
			}
			for range callers {
				<-started
			}
			// Let each refill through as it comes; the callers pile up
			// behind the one in flight.
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
		loop:
			for {
				select {
				case <-inner.entered:
					inner.gate <- struct{}{}
				case <-done:
					break loop
				}
			}
			assert.Equal(t, int64(callers), granted.Load())
			assert.Equal(t, int64(1), inner.maxInflight.Load(), "never two refills of one key at once")
			assert.LessOrEqual(t, inner.calls.Load(), int64(8), "batches grow 1, 4, 16, 64: a handful of round trips for %d callers", callers)
		})
	}
}

// TestLeasedWaiterHonoursItsContext: a caller waiting for another's refill
// leaves when its context ends.
func TestLeasedWaiterHonoursItsContext(t *testing.T) {
	clock := clockwork.NewFakeClock()
	local, err := NewLocal(100, time.Second, WithClock(clock))
	require.NoError(t, err)
	inner := &counting{Bucket: local, gate: make(chan struct{}), entered: make(chan struct{})}
	waiting := make(chan struct{}, 1)
	l := newLeasedT(t, inner, WithClock(clock), withoutLeaseSweeper(), withLeaseWaitHook(func() { waiting <- struct{}{} }))
	first := make(chan error, 1)
	go func() {
		_, err := l.Take(context.Background(), "", 1, 0)
		first <- err
	}()
	<-inner.entered // the first caller's refill is in flight
	ctx, cancel := context.WithCancel(context.Background())
	second := make(chan error, 1)
	go func() {
		_, err := l.Take(ctx, "", 1, 0)
		second <- err
	}()
	<-waiting
	cancel()
	err = <-second
	require.ErrorIs(t, err, context.Canceled)
	inner.gate <- struct{}{}
	require.NoError(t, <-first)
	assert.Equal(t, int64(1), inner.calls.Load())
}

// TestLeasedDelayWhenDry: when the lease is empty and the inner bucket
// refuses, Take refuses with the inner Delay, answers from memory until
// then, and a Limiter sleeps exactly that long.
func TestLeasedDelayWhenDry(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &counting{Bucket: newWindowBucket(clock, 10, time.Second)}
	l := newLeasedT(t, inner, WithClock(clock), withoutLeaseSweeper())
	ctx := context.Background()
	clock.Advance(300 * time.Millisecond)
	for range 10 {
		d, err := l.Take(ctx, "", 1, 0)
		require.NoError(t, err)
		require.True(t, d.Granted)
	}
	d, err := l.Take(ctx, "", 1, 0)
	require.NoError(t, err)
	require.False(t, d.Granted)
	assert.Equal(t, 700*time.Millisecond, d.Delay)
	calls := inner.calls.Load()
	for range 100 {
		d, err := l.Take(ctx, "", 1, 0)
		require.NoError(t, err)
		require.False(t, d.Granted)
	}
	assert.Equal(t, calls, inner.calls.Load(), "refusals until the named time come from memory")

	lim := New(l, WithClock(clock))
	done := make(chan error, 1)
	go func() { done <- lim.Acquire(ctx, 2*time.Second) }()
	require.NoError(t, clock.BlockUntilContext(testCtx(t), 1))
	clock.Advance(699 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Acquire returned %v before the window ended", err)
	default:
	}
	clock.Advance(time.Millisecond)
	require.NoError(t, <-done)
	assert.Equal(t, calls+1, inner.calls.Load(), "one inner call after the wait: no polling")

	err = lim.Acquire(ctx, 0)
	require.NoError(t, err, "the new window's lease serves")
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestLeasedRefundsOnClose: Close hands back what the leases hold, for
// every key, and later takes go straight to the inner bucket.
func TestLeasedRefundsOnClose(t *testing.T) {
	clock := clockwork.NewFakeClock()
	wb := newWindowBucket(clock, 1000, time.Second)
	inner := &counting{Bucket: wb}
	l, err := NewLeased(inner, WithClock(clock), withoutLeaseSweeper())
	require.NoError(t, err)
	ctx := context.Background()
	for range 30 {
		for _, key := range []string{"", "a", "b"} {
			_, err := l.Take(ctx, key, 1, 0)
			require.NoError(t, err)
		}
	}
	held := l.held("") + l.held("a") + l.held("b")
	require.Positive(t, held)
	require.NoError(t, l.Close())
	assert.Equal(t, held, inner.refunded.Load(), "every held permit goes back")
	assert.Zero(t, l.held("")+l.held("a")+l.held("b"))
	assert.Equal(t, int64(90), wb.grantedIn(0), "the inner budget: only the 3 × 30 used")

	calls := inner.calls.Load()
	_, err = l.Take(ctx, "", 1, 0)
	require.NoError(t, err)
	_, err = l.Take(ctx, "", 1, 0)
	require.NoError(t, err)
	assert.Equal(t, calls+2, inner.calls.Load(), "after Close every take goes to the inner bucket")
	require.NoError(t, l.Close(), "Close twice is fine")
}

// TestLeasedIdleKeyHoldsNothing: once demand stops, a sweep hands the
// lease back and a later one forgets the key.
func TestLeasedIdleKeyHoldsNothing(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &counting{Bucket: newWindowBucket(clock, 1000, time.Hour)}
	const horizon = 50 * time.Millisecond
	l := newLeasedT(t, inner, WithClock(clock), withoutLeaseSweeper(), WithLeaseHorizon(horizon))
	ctx := context.Background()
	for range 50 {
		for _, key := range []string{"", "tenant"} {
			_, err := l.Take(ctx, key, 1, 0)
			require.NoError(t, err)
		}
		clock.Advance(time.Millisecond)
	}
	held := l.held("") + l.held("tenant")
	require.Positive(t, held)

	// First sweep: demand was just seen, the lease is kept.
	l.sweep(l.now())
	assert.Equal(t, held, l.held("")+l.held("tenant"), "a busy lease is kept")
	// Demand stops.
	clock.Advance(horizon)
	l.sweep(l.now())
	assert.Zero(t, l.held(""), "idle: the lease goes back")
	assert.Zero(t, l.held("tenant"), "idle: the lease goes back")
	assert.Equal(t, held, inner.refunded.Load())
	for range 2 {
		clock.Advance(horizon)
		l.sweep(l.now())
	}
	_, ok := l.keys.Load("tenant")
	assert.False(t, ok, "a key idle for two sweeps is forgotten")

	// It comes back as new: a small first batch.
	calls := inner.calls.Load()
	d, err := l.Take(ctx, "tenant", 1, 0)
	require.NoError(t, err)
	require.True(t, d.Granted)
	assert.Equal(t, calls+1, inner.calls.Load())
	assert.Zero(t, l.held("tenant"), "a new key starts with just its own permits")
}

// TestLeasedSweepTrimsToDemand: when demand drops but does not stop, the
// sweep hands back what the lease holds beyond it.
func TestLeasedSweepTrimsToDemand(t *testing.T) {
	clock := clockwork.NewFakeClock()
	wb := newWindowBucket(clock, 10_000, 10*time.Second)
	inner := &counting{Bucket: wb}
	l := newLeasedT(t, inner, WithClock(clock), withoutLeaseSweeper(), WithLeaseHorizon(100*time.Millisecond), WithLeaseShare(0.5))
	ctx := context.Background()
	for range 200 { // 20 per ms: batches grow to 2000 (the horizon's worth)
		for range 20 {
			_, err := l.Take(ctx, "", 1, 0)
			require.NoError(t, err)
		}
		clock.Advance(time.Millisecond)
	}
	l.sweep(l.now())
	for range 10 { // now 1 per 10 ms
		clock.Advance(10 * time.Millisecond)
		_, err := l.Take(ctx, "", 1, 0)
		require.NoError(t, err)
	}
	before := l.held("")
	l.sweep(l.now())
	after := l.held("")
	assert.Less(t, after, before, "a lease far above demand is trimmed")
	assert.Positive(t, after, "but what the demand needs until the lease ends is kept")
	assert.Equal(t, before-after, inner.refunded.Load())
}

// TestLeasedBackgroundSweep: the sweep runs on the clock, once per horizon,
// and stops with Close.
func TestLeasedBackgroundSweep(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &counting{Bucket: newWindowBucket(clock, 1000, time.Hour)}
	swept := make(chan struct{}, 1)
	l, err := NewLeased(inner, WithClock(clock), WithLeaseHorizon(10*time.Millisecond),
		withLeaseSweepHook(func() { swept <- struct{}{} }))
	require.NoError(t, err)
	for range 40 {
		_, err := l.Take(context.Background(), "", 1, 0)
		require.NoError(t, err)
	}
	require.Positive(t, l.held(""))
	for range 2 {
		require.NoError(t, clock.BlockUntilContext(testCtx(t), 1), "the sweeper's ticker")
		clock.Advance(10 * time.Millisecond)
		<-swept
	}
	assert.Zero(t, l.held(""), "two sweeps without demand hand the lease back")
	assert.Positive(t, inner.refunded.Load())
	require.NoError(t, l.Close())
	select {
	case <-l.done:
	default:
		t.Fatal("Close returned with the sweeper still running")
	}
}

// TestLeasedPause: a pause stops this instance at once and reaches the
// inner bucket.
func TestLeasedPause(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &counting{Bucket: newWindowBucket(clock, 1000, time.Second)}
	l := newLeasedT(t, inner, WithClock(clock), withoutLeaseSweeper())
	ctx := context.Background()
	for range 30 {
		_, err := l.Take(ctx, "", 1, 0)
		require.NoError(t, err)
	}
	require.Positive(t, l.held(""))
	require.NoError(t, l.Pause(ctx, "", 200*time.Millisecond))
	assert.Equal(t, int64(1), inner.pauses.Load())
	d, err := l.Take(ctx, "", 1, 0)
	require.NoError(t, err)
	assert.False(t, d.Granted, "paused: the lease no longer serves")
	assert.Equal(t, 200*time.Millisecond, d.Delay)
	clock.Advance(200 * time.Millisecond)
	d, err = l.Take(ctx, "", 1, 0)
	require.NoError(t, err)
	assert.True(t, d.Granted)
}

// TestLeasedInnerErrors: a store error reaches the caller, wrapped as the
// inner bucket made it, and the next call tries again.
func TestLeasedInnerErrors(t *testing.T) {
	clock := clockwork.NewFakeClock()
	fail := &failing{err: &BackendError{Op: "take", Err: errors.New("connection refused")}}
	l := newLeasedT(t, fail, WithClock(clock), withoutLeaseSweeper())
	_, err := l.Take(context.Background(), "k", 1, 0)
	var be *BackendError
	require.ErrorAs(t, err, &be)
	fail.err = nil
	d, err := l.Take(context.Background(), "k", 1, 0)
	require.NoError(t, err)
	assert.True(t, d.Granted)
}

type failing struct{ err error }

func (f *failing) Take(context.Context, string, int64, time.Duration) (Decision, error) {
	if f.err != nil {
		return Decision{}, f.err
	}
	return Decision{Granted: true, Limit: 10, Reset: time.Second}, nil
}

// TestLeasedNoResetNoLease: an inner bucket that reports no Reset, with no
// TTL, gets one call per take: nothing is leased.
func TestLeasedNoResetNoLease(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &counting{Bucket: &gateOpen{}}
	l := newLeasedT(t, inner, WithClock(clock), withoutLeaseSweeper())
	for range 20 {
		d, err := l.Take(context.Background(), "", 1, 0)
		require.NoError(t, err)
		require.True(t, d.Granted)
		assert.Zero(t, l.held(""))
	}
	assert.Equal(t, int64(20), inner.calls.Load())
}

type gateOpen struct{}

func (gateOpen) Take(context.Context, string, int64, time.Duration) (Decision, error) {
	return Decision{Granted: true, Limit: 100}, nil
}

// TestLeasedWaiterIgnoresTheRefillersOwnError: a caller asking for more
// than the bucket can grant fails alone; those who waited on its refill
// are served.
func TestLeasedWaiterIgnoresTheRefillersOwnError(t *testing.T) {
	clock := clockwork.NewFakeClock()
	wb := newWindowBucket(clock, 100, time.Second)
	inner := &counting{Bucket: wb, gate: make(chan struct{}), entered: make(chan struct{})}
	waiting := make(chan struct{}, 1)
	l := newLeasedT(t, inner, WithClock(clock), withoutLeaseSweeper(), withLeaseWaitHook(func() { waiting <- struct{}{} }))
	big := make(chan error, 1)
	go func() {
		_, err := l.Take(context.Background(), "", 500, 0)
		big <- err
	}()
	<-inner.entered // the big caller's refill is in flight
	small := make(chan error, 1)
	go func() {
		d, err := l.Take(context.Background(), "", 1, 0)
		if err == nil && !d.Granted {
			err = errors.New("not granted")
		}
		small <- err
	}()
	<-waiting // the small caller waits on the big one's refill
	inner.gate <- struct{}{}
	require.ErrorIs(t, <-big, ErrExceedsLimit)
	go func() { // the small caller may refill on its own
		for range inner.entered {
			inner.gate <- struct{}{}
		}
	}()
	require.NoError(t, <-small)
	close(inner.entered)
}

// TestLeasedWaiterRefillsWithinItsWait: a caller that waited on another's
// refill, which failed when the store did not answer, refills itself only
// with what is left of its wait; with nothing left it times out at once
// instead of starting a store call with its whole wait anew.
func TestLeasedWaiterRefillsWithinItsWait(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &stalled{entered: make(chan struct{}), release: make(chan error)}
	waiting := make(chan struct{}, 1)
	l := newLeasedT(t, inner, WithClock(clock), withoutLeaseSweeper(), withLeaseWaitHook(func() { waiting <- struct{}{} }))
	const maxWait = 10 * time.Second
	first := make(chan error, 1)
	go func() {
		_, err := l.Take(context.Background(), "", 1, maxWait)
		first <- err
	}()
	<-inner.entered // the first caller's refill meets a stalled store
	second := make(chan error, 1)
	go func() {
		_, err := l.Take(context.Background(), "", 1, maxWait)
		second <- err
	}()
	<-waiting
	clock.Advance(maxWait) // both waits are spent while the store is stalled
	inner.release <- &BackendError{Op: "take", Err: context.DeadlineExceeded}
	var be *BackendError
	require.ErrorAs(t, <-first, &be)
	select {
	case err := <-second:
		require.ErrorIs(t, err, ErrTimeout)
	case <-inner.entered:
		inner.release <- &BackendError{Op: "take", Err: context.DeadlineExceeded}
		<-second
		t.Fatal("the waiter called the stalled store again with its whole wait, though none was left")
	}
	assert.Equal(t, int64(1), inner.calls.Load())
}

// stalled is a bucket whose store does not answer: each Take hangs until
// the test releases it with an error, or its context ends.
type stalled struct {
	calls   atomic.Int64
	entered chan struct{}
	release chan error
}

func (s *stalled) Take(ctx context.Context, _ string, _ int64, _ time.Duration) (Decision, error) {
	s.calls.Add(1)
	s.entered <- struct{}{}
	select {
	case err := <-s.release:
		return Decision{}, err
	case <-ctx.Done():
		return Decision{}, &BackendError{Op: "take", Err: ctx.Err()}
	}
}

// TestLeasedLimiterSpentWaitGetsTheShortLastCall: when a Limiter's wait has
// run out and it asks once more (left 0), a Leased bucket's store call gets
// the same short last call as any bucket (minStoreCall), not the store
// timeout of a caller that may not wait at all: with a stalled store, that
// made an Acquire over Leased return up to a store timeout past its wait.
func TestLeasedLimiterSpentWaitGetsTheShortLastCall(t *testing.T) {
	for _, tc := range []struct {
		name        string
		noWait      bool
		least, most time.Duration
	}{
		{"wait run out", false, 0, minStoreCall},
		{"no wait", true, DefaultStoreTimeout / 2, DefaultStoreTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			inner := &deadlineOf{}
			lim := New(newLeasedT(t, inner, WithClock(clock), withoutLeaseSweeper()), WithClock(clock))
			d, _, err := lim.decide(context.Background(), "", 1, 0, tc.noWait)
			require.NoError(t, err)
			require.True(t, d.Granted)
			require.Equal(t, int64(1), inner.calls.Load())
			left := time.Duration(inner.left.Load())
			assert.Greater(t, left, tc.least, "the store call's deadline")
			assert.LessOrEqual(t, left, tc.most, "the store call's deadline")
		})
	}
}

// deadlineOf is a bucket that grants and records how much time its last
// call's context had left (-1: no deadline).
type deadlineOf struct {
	calls atomic.Int64
	left  atomic.Int64
}

func (b *deadlineOf) Take(ctx context.Context, _ string, _ int64, _ time.Duration) (Decision, error) {
	b.calls.Add(1)
	left := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	b.left.Store(int64(left))
	return Decision{Granted: true, Limit: 10, Reset: time.Second}, nil
}
