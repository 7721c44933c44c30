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
	if r, ok := BucketAs[Refunder](c.Bucket); ok {
		return r.Refund(ctx, key, n)
	}
	return nil
}

func (c *counting) Pause(ctx context.Context, key string, d time.Duration) error {
	c.pauses.Add(1)
	if p, ok := BucketAs[Pauser](c.Bucket); ok {
		return p.Pause(ctx, key, d)
	}
	return nil
}

// leasedLimiter is a Limiter over inner with leasing c, on clock.
func leasedLimiter(t testing.TB, inner Bucket, clock clockwork.Clock, c Leasing, opts ...LimiterOption) *Limiter {
	t.Helper()
	lim := New(inner, append([]LimiterOption{WithClock(clock), WithLeasing(c)}, opts...)...)
	t.Cleanup(func() { _ = lim.Close() })
	return lim
}

// leaseHeld returns the valid permits key's lease holds now.
func (l *Limiter) leaseHeld(key string) int64 {
	st := l.state(key)
	defer l.release(st)
	if b := st.lease.cur.Load(); b != nil && l.tb.now() < b.expires {
		return b.left.Load()
	}
	return 0
}

func TestLeasingRefusesBadConfig(t *testing.T) {
	inner := newWindowBucket(clockwork.NewFakeClock(), 10, time.Second)
	for _, tt := range []struct {
		c    Leasing
		want string
	}{
		{Leasing{Horizon: -time.Second}, "Horizon = -1s"},
		{Leasing{TTL: -time.Millisecond}, "TTL = -1ms"},
		{Leasing{Share: 1.5}, "Share = 1.5"},
		{Leasing{Share: -1}, "Share = -1"},
		{Leasing{Share: math.NaN()}, "Share = NaN"},
	} {
		t.Run(tt.want, func(t *testing.T) {
			lim := New(inner, WithLeasing(tt.c))
			err := lim.Acquire(context.Background(), 0)
			require.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

// TestLeasingNeverExceedsTheWindow drives a leasing Limiter over a
// fixed-window bucket with demand far above the limit, at uneven times,
// and counts the permits handed out per window itself: never more than
// the limit, and nearly all of it used, with few calls to the bucket.
func TestLeasingNeverExceedsTheWindow(t *testing.T) {
	clock := clockwork.NewFakeClock()
	const limit, interval = 1000, time.Second
	inner := &counting{Bucket: newWindowBucket(clock, limit, interval)}
	lim := leasedLimiter(t, inner, clock, Leasing{})
	ctx := context.Background()
	start := clock.Now()
	perWindow := map[int64]int64{}
	var handed int64
	for i := range 4000 {
		clock.Advance(time.Duration(i%3) * time.Millisecond)
		for range 1 + i%5 { // 1–5 callers now; ~3000 asked per second
			n := int64(1 + i%3)
			if err := lim.AcquireN(ctx, n, 0); err == nil {
				perWindow[int64(clock.Since(start)/interval)] += n
				handed += n
			} else {
				require.ErrorIs(t, err, ErrTimeout)
			}
		}
	}
	windows := int64(clock.Since(start) / interval)
	for w := range windows {
		assert.LessOrEqual(t, perWindow[w], int64(limit), "window %d", w)
		assert.GreaterOrEqual(t, perWindow[w], int64(0.95*limit), "window %d: demand is far above the limit, the limit should be nearly all used", w)
	}
	assert.Less(t, float64(inner.calls.Load())/float64(handed), 0.1, "bucket calls per permit: %d calls for %d permits", inner.calls.Load(), handed)
}

// TestLeasingConcurrentNeverExceedsTheWindow is the same with goroutines
// racing for permits, on two keys; the clock moves between rounds.
func TestLeasingConcurrentNeverExceedsTheWindow(t *testing.T) {
	clock := clockwork.NewFakeClock()
	const limit, interval = 500, 100 * time.Millisecond
	wb := newWindowBucket(clock, limit, interval)
	inner := &counting{Bucket: wb}
	lim := leasedLimiter(t, inner, clock, Leasing{})
	start := clock.Now()
	const callers, rounds, perRound = 8, 200, 20 // 8·20 asked per 5 ms: 3× the limit
	var perWindow [rounds * 5 * time.Millisecond / interval]atomic.Int64
	for range rounds {
		w := int64(clock.Since(start) / interval)
		var wg sync.WaitGroup
		for g := range callers {
			wg.Go(func() {
				key := ""
				if g%2 == 1 {
					key = "tenant"
				}
				for range perRound {
					if lim.Key(key).Acquire(context.Background(), 0) == nil { // the window bucket has one budget for all keys
						perWindow[w].Add(1)
					}
				}
			})
		}
		wg.Wait()
		clock.Advance(5 * time.Millisecond)
	}
	for w := range perWindow {
		n := perWindow[w].Load()
		assert.LessOrEqual(t, n, int64(limit), "window %d", w)
		assert.LessOrEqual(t, n, wb.grantedIn(int64(w)), "window %d: handed out more than the bucket granted in it", w)
		assert.GreaterOrEqual(t, n, int64(0.9*limit), "window %d: demand is 3× the limit", w)
	}
	assert.LessOrEqual(t, inner.maxInflight.Load(), int64(2), "at most one refill in flight per key (two keys here)")
}

// TestLeasedPermitsExpireWithThePeriod: permits left in a lease when the
// bucket's period ends are not handed out in the next one.
func TestLeasedPermitsExpireWithThePeriod(t *testing.T) {
	clock := clockwork.NewFakeClock()
	const limit, interval = 100, time.Second
	wb := newWindowBucket(clock, limit, interval)
	inner := &counting{Bucket: wb}
	lim := leasedLimiter(t, inner, clock, Leasing{Share: 0.5})
	ctx := context.Background()

	clock.Advance(100 * time.Millisecond)
	for range 40 { // a quick ramp: batches grow 1, 4, 16, ...
		require.NoError(t, lim.Acquire(ctx, 0))
	}
	left := lim.leaseHeld("")
	require.Positive(t, left, "the ramp should leave permits in the lease")
	require.Equal(t, int64(40)+left, wb.grantedIn(0))

	clock.Advance(900 * time.Millisecond) // window 1 begins
	calls := inner.calls.Load()
	require.NoError(t, lim.Acquire(ctx, 0))
	assert.Equal(t, calls+1, inner.calls.Load(), "an expired lease must not serve: the first take of a period asks the bucket")
	handed := int64(1)
	for lim.Acquire(ctx, 0) == nil {
		handed++
	}
	assert.Equal(t, int64(limit), handed, "window 1 hands out exactly its own limit, none of window 0's leftovers")
}

// TestLeasingOverLocalKeepsTheWidenedGuarantee leases with a TTL from a
// Local (GCRA) bucket, with demand that comes and goes so that leases are
// held, and checks the guarantee Leasing's doc states, by counting
// hand-outs itself: at most burst + rate·(t+ttl) in any span t.
func TestLeasingOverLocalKeepsTheWidenedGuarantee(t *testing.T) {
	clock := clockwork.NewFakeClock()
	const limit, burst, interval, ttl = 200, 20, time.Second, 30 * time.Millisecond
	local, err := NewLocal(limit, interval, WithClock(clock), WithLocalBurst(burst))
	require.NoError(t, err)
	inner := &counting{Bucket: local}
	lim := leasedLimiter(t, inner, clock, Leasing{TTL: ttl, Share: 0.5})
	ctx := context.Background()
	start := clock.Now()
	var grants []time.Duration
	for i := range 6000 {
		clock.Advance(time.Duration(1+i%4) * time.Millisecond)
		if (i/50)%3 == 2 {
			continue // a quiet spell: leases are held, then used when demand returns
		}
		for range 1 + i%7 {
			if lim.Acquire(ctx, 0) == nil {
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
	assert.Less(t, inner.calls.Load(), int64(len(grants))/3, "leasing must save bucket calls")
}

// TestLeasingTTLExpiry: a lease past its TTL does not serve, even though
// the bucket's Reset is longer.
func TestLeasingTTLExpiry(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &counting{Bucket: newWindowBucket(clock, 1000, time.Hour)}
	lim := leasedLimiter(t, inner, clock, Leasing{TTL: 10 * time.Millisecond})
	ctx := context.Background()
	for range 30 {
		require.NoError(t, lim.Acquire(ctx, 0))
	}
	require.Positive(t, lim.leaseHeld(""))
	calls := inner.calls.Load()
	clock.Advance(9 * time.Millisecond)
	require.NoError(t, lim.Acquire(ctx, 0))
	require.Equal(t, calls, inner.calls.Load(), "within its TTL the lease serves")
	clock.Advance(time.Millisecond)
	require.NoError(t, lim.Acquire(ctx, 0))
	assert.Equal(t, calls+1, inner.calls.Load(), "at its TTL the lease is void")
}

// TestLeasingWeighted: takes of n > 1 use what the lease holds and fetch
// the rest in the same call; permits are conserved.
func TestLeasingWeighted(t *testing.T) {
	clock := clockwork.NewFakeClock()
	wb := newWindowBucket(clock, 1000, time.Second)
	inner := &counting{Bucket: wb}
	lim := leasedLimiter(t, inner, clock, Leasing{})
	ctx := context.Background()
	var handed int64
	for i := range 150 {
		n := int64(1 + i%9)
		require.NoError(t, lim.AcquireN(ctx, n, 0))
		handed += n
	}
	assert.Equal(t, wb.grantedIn(0), handed+lim.leaseHeld(""), "every permit the bucket granted is handed out or still held")
	assert.Less(t, inner.calls.Load(), int64(50))

	// A take bigger than what is held: the held permits count toward it.
	held := lim.leaseHeld("")
	require.Positive(t, held)
	before := wb.grantedIn(0)
	require.NoError(t, lim.AcquireN(ctx, held+5, 0))
	handed += held + 5
	assert.Equal(t, wb.grantedIn(0), handed+lim.leaseHeld(""))
	assert.GreaterOrEqual(t, wb.grantedIn(0)-before, int64(5))

	require.ErrorIs(t, lim.AcquireN(ctx, 1001, 0), ErrExceedsLimit, "n above the bucket's limit can never be granted")
}

// TestLeasingRefillIsSingleflight: many callers find the lease dry at
// once; one refill at a time reaches the bucket, the others wait for it.
func TestLeasingRefillIsSingleflight(t *testing.T) {
	for _, key := range []string{"", "tenant"} {
		t.Run(fmt.Sprintf("key %q", key), func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			local, err := NewLocal(10_000, time.Second, WithClock(clock))
			require.NoError(t, err)
			inner := &counting{Bucket: local, gate: make(chan struct{}), entered: make(chan struct{})}
			lim := leasedLimiter(t, inner, clock, Leasing{})
			const callers = 64
			var wg sync.WaitGroup
			var granted atomic.Int64
			for range callers {
				wg.Go(func() {
					if lim.Key(key).Acquire(context.Background(), Forever) == nil {
						granted.Add(1)
					}
				})
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

// TestLeasingWaiterHonoursItsContext: a caller waiting for another's
// refill leaves when its context ends, without asking the bucket.
func TestLeasingWaiterHonoursItsContext(t *testing.T) {
	clock := clockwork.NewFakeClock()
	local, err := NewLocal(100, time.Second, WithClock(clock))
	require.NoError(t, err)
	inner := &counting{Bucket: local, gate: make(chan struct{}), entered: make(chan struct{})}
	lim := leasedLimiter(t, inner, clock, Leasing{})
	first := make(chan error, 1)
	go func() { first <- lim.Acquire(context.Background(), Forever) }()
	<-inner.entered // the first caller's refill is in flight
	ctx, cancel := context.WithCancel(context.Background())
	second := make(chan error, 1)
	go func() { second <- lim.Acquire(ctx, Forever) }()
	cancel()
	require.ErrorIs(t, <-second, context.Canceled)
	inner.gate <- struct{}{}
	require.NoError(t, <-first)
	assert.Equal(t, int64(1), inner.calls.Load())
}

// TestLeasingDelayWhenDry: when the lease is empty and the bucket refuses,
// the Limiter sleeps exactly until the time the bucket named, and asks
// once then: no polling.
func TestLeasingDelayWhenDry(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &counting{Bucket: newWindowBucket(clock, 10, time.Second)}
	lim := leasedLimiter(t, inner, clock, Leasing{})
	ctx := context.Background()
	clock.Advance(300 * time.Millisecond)
	for range 10 {
		require.NoError(t, lim.Acquire(ctx, 0))
	}
	require.ErrorIs(t, lim.Acquire(ctx, 0), ErrTimeout)
	calls := inner.calls.Load()
	for range 100 {
		require.ErrorIs(t, lim.Acquire(ctx, 0), ErrTimeout)
	}
	assert.Equal(t, calls, inner.calls.Load(), "refusals until the named time come from memory")

	done := make(chan error, 1)
	go func() { done <- lim.Acquire(ctx, 2*time.Second) }()
	require.NoError(t, clock.BlockUntilContext(testCtx(t), 2)) // the gate's timer and the caller's deadline
	clock.Advance(699 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Acquire returned %v before the window ended", err)
	default:
	}
	clock.Advance(time.Millisecond)
	require.NoError(t, <-done)
	assert.Equal(t, calls+1, inner.calls.Load(), "one bucket call after the wait: no polling")
	require.NoError(t, lim.Acquire(ctx, 0), "the new window's lease serves")
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestLeasingKeysAreForgotten: once demand stops and its lease has
// expired, a key's state (lease included) is forgotten.
func TestLeasingKeysAreForgotten(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &counting{Bucket: newWindowBucket(clock, 100_000, time.Second)}
	lim := leasedLimiter(t, inner, clock, Leasing{})
	ctx := context.Background()
	for i := range 1000 {
		for range 5 {
			require.NoError(t, lim.Key(fmt.Sprint("k", i)).Acquire(ctx, 0))
		}
	}
	require.Equal(t, 1000, lim.states.count())
	clock.Advance(2 * time.Second) // the leases expired with their period; the keys idle
	for range 2 * stateShards {    // calls of any key sweep the shards in turn
		require.NoError(t, lim.Key("other").Acquire(ctx, 0))
	}
	assert.Equal(t, 1, lim.states.count(), "idle keys whose leases expired are forgotten")
}

// TestLeasingPause: a pause reported by the provider stops this instance
// at once (its lease is dropped) and reaches the bucket.
func TestLeasingPause(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &counting{Bucket: newWindowBucket(clock, 1000, time.Second)}
	lim := leasedLimiter(t, inner, clock, Leasing{})
	ctx := context.Background()
	for range 30 {
		require.NoError(t, lim.Acquire(ctx, 0))
	}
	require.Positive(t, lim.leaseHeld(""))
	require.NoError(t, lim.Report(ctx, Answer{Refused: true, Retry: true, RetryAfter: 200 * time.Millisecond}))
	assert.Equal(t, int64(1), inner.pauses.Load())
	err := lim.Acquire(ctx, 0)
	require.ErrorIs(t, err, ErrTimeout, "paused: the lease no longer serves")
	assert.Contains(t, err.Error(), "200ms")
	clock.Advance(200 * time.Millisecond)
	require.NoError(t, lim.Acquire(ctx, 0))
}

// TestLeasingStoreErrors: a store error goes through the failure policy,
// and the next call tries the store again.
func TestLeasingStoreErrors(t *testing.T) {
	clock := clockwork.NewFakeClock()
	fail := &failing{err: &BackendError{Op: "take", Err: errors.New("connection refused")}}
	lim := leasedLimiter(t, fail, clock, Leasing{}, WithFailurePolicy(FailClosed))
	err := lim.Key("k").Acquire(context.Background(), 0)
	var be *BackendError
	require.ErrorAs(t, err, &be)
	fail.err = nil
	require.NoError(t, lim.Key("k").Acquire(context.Background(), 0))
}

type failing struct{ err error }

func (f *failing) Take(context.Context, string, int64, time.Duration) (Decision, error) {
	if f.err != nil {
		return Decision{}, f.err
	}
	return Decision{Granted: true, Limit: 10, Reset: time.Second}, nil
}

// TestLeasingNoResetNoLease: a bucket that reports no Reset, with no TTL,
// gets one call per take: nothing is leased.
func TestLeasingNoResetNoLease(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &counting{Bucket: &gateOpen{}}
	lim := leasedLimiter(t, inner, clock, Leasing{})
	for range 20 {
		require.NoError(t, lim.Acquire(context.Background(), 0))
		assert.Zero(t, lim.leaseHeld(""))
	}
	assert.Equal(t, int64(20), inner.calls.Load())
}

type gateOpen struct{}

func (gateOpen) Take(context.Context, string, int64, time.Duration) (Decision, error) {
	return Decision{Granted: true, Limit: 100}, nil
}

// TestLeasingWaiterIgnoresTheRefillersOwnError: a caller asking for more
// than the bucket can grant fails alone; those who waited on its refill
// are served.
func TestLeasingWaiterIgnoresTheRefillersOwnError(t *testing.T) {
	clock := clockwork.NewFakeClock()
	wb := newWindowBucket(clock, 100, time.Second)
	inner := &counting{Bucket: wb, gate: make(chan struct{}), entered: make(chan struct{})}
	lim := leasedLimiter(t, inner, clock, Leasing{})
	big := make(chan error, 1)
	go func() { big <- lim.AcquireN(context.Background(), 500, Forever) }()
	<-inner.entered // the big caller's refill is in flight
	small := make(chan error, 1)
	go func() { small <- lim.Acquire(context.Background(), Forever) }()
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

// TestLeasingWaiterRefillsWithinItsWait: a caller that waited on another's
// refill, which failed when the store did not answer, refills itself only
// with what is left of its wait; with nothing left it times out at once
// instead of starting a store call with its whole wait anew.
func TestLeasingWaiterRefillsWithinItsWait(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &stalled{entered: make(chan struct{}), release: make(chan error)}
	lim := leasedLimiter(t, inner, clock, Leasing{}, WithFailurePolicy(FailClosed))
	const maxWait = 10 * time.Second
	first := make(chan error, 1)
	go func() { first <- lim.Acquire(context.Background(), maxWait) }()
	<-inner.entered // the first caller's refill meets a stalled store
	second := make(chan error, 1)
	ctx := &doneCalled{Context: context.Background(), called: make(chan struct{})}
	go func() { second <- lim.Acquire(ctx, maxWait) }()
	<-ctx.called           // the second caller waits on the refill (its wait began before)
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

// TestLeasingWaiterWaitsForTheRefillUntilItsWaitsEnd: a caller waiting
// on another's refill waits for it until the end of its wait, on the
// Limiter's clock, not only as long as a store call's bound of its own
// (storeMargin before the wait's end, on the real clock) would last: the
// refill it waits for is no store call of its.
func TestLeasingWaiterWaitsForTheRefillUntilItsWaitsEnd(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &slowFirstTake{entered: make(chan struct{}), release: make(chan struct{})}
	lim := leasedLimiter(t, inner, clock, Leasing{})
	first := make(chan error, 1)
	go func() { first <- lim.Acquire(context.Background(), Forever) }()
	<-inner.entered // the first caller's refill waits for the store
	second := make(chan error, 1)
	ctx := &doneCalled{Context: context.Background(), called: make(chan struct{})}
	go func() { second <- lim.Acquire(ctx, 20*time.Millisecond) }()
	<-ctx.called // the second caller waits on the refill; the fake clock stands still
	select {
	case err := <-second:
		t.Fatalf("the waiter gave up on the refill before its wait's end: %v", err)
	case <-time.After(100 * time.Millisecond): // a store call's bound (15 ms of the 20) is long past
	}
	close(inner.release)
	require.NoError(t, <-first)
	require.NoError(t, <-second)
}

// TestLeasingWaiterWhoseContextDeadlineEndsTheRefillWaitSaysSo: a caller
// whose wait is bounded by its context's deadline, and ends while another
// caller's refill is on its way, fails with ErrTimeout wrapping
// context.DeadlineExceeded, as every other end of such a wait does.
func TestLeasingWaiterWhoseContextDeadlineEndsTheRefillWaitSaysSo(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &slowFirstTake{entered: make(chan struct{}), release: make(chan struct{})}
	lim := leasedLimiter(t, inner, clock, Leasing{})
	first := make(chan error, 1)
	go func() { first <- lim.Acquire(context.Background(), Forever) }()
	<-inner.entered
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	second := make(chan error, 1)
	go func() { second <- lim.Acquire(ctx, Forever) }()
	bctx, bcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer bcancel()
	require.NoError(t, clock.BlockUntilContext(bctx, 1), "the second caller waits on the refill, on the Limiter's clock")
	clock.Advance(time.Hour) // the context's deadline, on the Limiter's clock
	err := <-second
	assert.ErrorIs(t, err, ErrTimeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "the context's deadline bounded the wait")
	close(inner.release)
	require.NoError(t, <-first)
}

// slowFirstTake is a bucket whose first Take waits until the test releases
// it; every Take grants.
type slowFirstTake struct {
	once             sync.Once
	entered, release chan struct{}
}

func (s *slowFirstTake) Take(context.Context, string, int64, time.Duration) (Decision, error) {
	s.once.Do(func() {
		close(s.entered)
		<-s.release
	})
	return Decision{Granted: true, Limit: 100, Remaining: 50, Reset: time.Second}, nil
}

// doneCalled is a context that closes called the first time its Done is
// called: when a caller first bounds something by it.
type doneCalled struct {
	context.Context
	once   sync.Once
	called chan struct{}
}

func (c *doneCalled) Done() <-chan struct{} {
	c.once.Do(func() { close(c.called) })
	return c.Context.Done()
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

// TestLeasingSpentWaitGetsTheShortLastCall: when a Limiter's wait has run
// out and it asks once more (left 0), a refill's store call gets the same
// short last call as any bucket call (minStoreCall), not the store timeout
// of a caller that may not wait at all.
func TestLeasingSpentWaitGetsTheShortLastCall(t *testing.T) {
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
			lim := leasedLimiter(t, inner, clock, Leasing{})
			before := time.Now()
			maxWait := time.Duration(0)
			if !tc.noWait {
				maxWait = time.Second
			}
			w := lim.newWaiter(context.Background(), demand{n: 1}, maxWait, 0)
			if !tc.noWait {
				w.deadline = lim.tb.now() // run out
			}
			c := w.decide(lim.root)
			after := time.Now()
			require.NoError(t, c.err)
			require.True(t, c.Granted)
			require.Equal(t, int64(1), inner.calls.Load())
			dl := time.Unix(0, inner.deadline.Load())
			require.False(t, dl.Before(before), "the store call has a deadline")
			// The deadline was set between before and after: measured from
			// both ends, a loaded machine's delays cannot move it out.
			assert.Greater(t, dl.Sub(before), tc.least, "the store call's deadline")
			assert.LessOrEqual(t, dl.Sub(after), tc.most, "the store call's deadline")
		})
	}
}

// deadlineOf is a bucket that grants and records its last call's deadline
// (0: none).
type deadlineOf struct {
	calls    atomic.Int64
	deadline atomic.Int64 // ns since the Unix epoch
}

func (b *deadlineOf) Take(ctx context.Context, _ string, _ int64, _ time.Duration) (Decision, error) {
	b.calls.Add(1)
	var dl int64
	if t, ok := ctx.Deadline(); ok {
		dl = t.UnixNano()
	}
	b.deadline.Store(dl)
	return Decision{Granted: true, Limit: 10, Reset: time.Second}, nil
}

// TestLeasingRefusalReachesTheCallersWaitingOnTheRefill: callers that
// waited on a refill the bucket refused are refused from memory until the
// time it named, not each with a store call of its own.
func TestLeasingRefusalReachesTheCallersWaitingOnTheRefill(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &counting{Bucket: newWindowBucket(clock, 10, time.Second)}
	lim := leasedLimiter(t, inner, clock, Leasing{})
	ctx := context.Background()
	for range 10 { // the window's permits
		require.NoError(t, lim.Acquire(ctx, 0))
	}
	calls := inner.calls.Load()
	inner.gate, inner.entered = make(chan struct{}), make(chan struct{})
	refiller := make(chan error, 1)
	go func() { refiller <- lim.Acquire(ctx, 500*time.Millisecond) }()
	<-inner.entered // the refill is at the bucket
	const callers = 16
	errs := make(chan error, callers)
	for range callers {
		cctx := &doneCalled{Context: ctx, called: make(chan struct{})}
		go func() { errs <- lim.Acquire(cctx, 500*time.Millisecond) }()
		<-cctx.called // waiting: on the refill, or at the gate
	}
	inner.gate <- struct{}{} // refused: the window is spent until 1 s
	go func() {              // any further call goes through, to be counted
		for range inner.entered {
			inner.gate <- struct{}{}
		}
	}()
	defer close(inner.entered)
	require.ErrorIs(t, <-refiller, ErrTimeout)
	for range callers {
		require.ErrorIs(t, <-errs, ErrTimeout)
	}
	assert.Equal(t, calls+1, inner.calls.Load(), "one refill, which the bucket refused")
}
