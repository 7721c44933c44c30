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

// onDemandBucket grants limit permits per period of interval on its clock, a
// period starting at the first take after the last one ended (as the Redis
// token bucket refills on demand). Its Decisions count the period: Limit,
// Remaining after the take, Reset until the period ends.
type onDemandBucket struct {
	clock    clockwork.Clock
	limit    int64
	interval time.Duration
	periodic bool

	mu       sync.Mutex
	start    time.Time
	left     int64
	refunded int64
}

func newOnDemandBucket(clock clockwork.Clock, limit int64, interval time.Duration) *onDemandBucket {
	return &onDemandBucket{clock: clock, limit: limit, interval: interval, periodic: true}
}

func (b *onDemandBucket) Take(_ context.Context, _ string, n int64, _ time.Duration) (throttle.Decision, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now()
	if b.start.IsZero() || now.Sub(b.start) >= b.interval {
		b.start, b.left = now, b.limit
	}
	reset := b.interval - now.Sub(b.start)
	if b.left < n {
		return throttle.Decision{Delay: reset, Limit: b.limit, Remaining: b.left, Reset: reset}, nil
	}
	b.left -= n
	return throttle.Decision{Granted: true, Limit: b.limit, Remaining: b.left, Reset: reset}, nil
}

func (b *onDemandBucket) Refund(_ context.Context, _ string, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.left += n
	b.refunded += n
	return nil
}

func (b *onDemandBucket) Fallback() (int64, time.Duration, int64) { return b.limit, b.interval, 1 }
func (b *onDemandBucket) Periodic() bool                          { return b.periodic }

func (b *onDemandBucket) refunds() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refunded
}

// acquireAll starts n Acquires of key with maxWait, and returns the channel
// each sends its result to.
func acquireAll(ctx context.Context, k throttle.Keyed, n int, maxWait time.Duration) chan error {
	done := make(chan error, n)
	for range n {
		go func() { done <- k.Acquire(ctx, maxWait) }()
	}
	return done
}

// receive takes exactly want results from done, failing on an error, and
// then checks that no other result is there once sleepers callers sleep.
func receive(t *testing.T, clock *clockwork.FakeClock, done chan error, want, sleepers int) {
	t.Helper()
	for range want {
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatalf("a grant did not come")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, clock.BlockUntilContext(ctx, sleepers), "callers waiting for their place")
	select {
	case err := <-done:
		t.Fatalf("a grant came before its place in the period (err %v)", err)
	default:
	}
}

func TestAPeriodsGrantsAreSpreadOverThePeriod(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newOnDemandBucket(clock, 10, time.Second), throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	done := acquireAll(ctx, lim.Key("api"), 10, 5*time.Second)
	receive(t, clock, done, 1, 9) // the period's first permit goes at once
	for i := 8; i >= 0; i-- {
		clock.Advance(95 * time.Millisecond)
		receive(t, clock, done, 1, i) // then one every tenth of 95 % of the interval
	}
}

func TestGrantsAskedSparselyAreNotHeldBack(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newOnDemandBucket(clock, 10, time.Second), throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	for range 5 { // one every 150 ms: each place has passed when it is asked
		require.NoError(t, lim.Acquire(ctx, 0))
		clock.Advance(150 * time.Millisecond)
	}
	// The sixth, 750 ms into the period: its place (475 ms) has passed.
	receive(t, clock, acquireAll(ctx, lim.Key(""), 1, 5*time.Second), 1, 0)
}

func TestSpreadingNeedsAPeriodicBucketAndAnIntervalOfAMinuteAtMost(t *testing.T) {
	for name, b := range map[string]*onDemandBucket{
		"not periodic":   {limit: 10, interval: time.Second},
		"daily interval": {limit: 10, interval: 24 * time.Hour, periodic: true},
	} {
		t.Run(name, func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			b.clock = clock
			lim := throttle.New(b, throttle.WithClock(clock))
			defer lim.Close()
			receive(t, clock, acquireAll(context.Background(), lim.Key(""), 10, 5*time.Second), 10, 0)
		})
	}
}

func TestLeasedPermitsAreNotSpread(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newOnDemandBucket(clock, 10, time.Second), throttle.WithClock(clock), throttle.WithLeasing(throttle.Leasing{}))
	defer lim.Close()
	receive(t, clock, acquireAll(context.Background(), lim.Key(""), 10, 5*time.Second), 10, 0)
}

func TestACallerWithoutWaitIsNotHeldForItsPlace(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newOnDemandBucket(clock, 10, time.Second), throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	for i := range 10 {
		require.NoError(t, lim.Acquire(ctx, 0), "permit %d with maxWait 0", i)
	}
	assert.ErrorIs(t, lim.Acquire(ctx, 0), throttle.ErrTimeout, "the period is spent")
}

// A caller whose wait is shorter than the interval (two intervals when its
// context's deadline bounds it) is not spread: it could not wait for
// every place, and going at once when its place lay beyond its wait would
// put a period's spread grants next to the next period's burst.
func TestACallerWithAShortWaitIsNotSpread(t *testing.T) {
	for name, bound := range map[string]struct {
		maxWait time.Duration
		ctxWait time.Duration
	}{
		"maxWait below the interval":    {maxWait: 500 * time.Millisecond, ctxWait: time.Hour},
		"deadline below two intervals":  {maxWait: throttle.Forever, ctxWait: 1500 * time.Millisecond},
		"deadline below a minute's two": {maxWait: throttle.Forever, ctxWait: time.Minute},
	} {
		t.Run(name, func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			interval := time.Second
			if bound.ctxWait == time.Minute {
				interval = time.Minute
			}
			lim := throttle.New(newOnDemandBucket(clock, 10, interval), throttle.WithClock(clock))
			defer lim.Close()
			ctx, cancel := context.WithTimeout(context.Background(), bound.ctxWait)
			defer cancel()
			receive(t, clock, acquireAll(ctx, lim.Key(""), 10, bound.maxWait), 10, 0)
		})
	}
}

func TestACallerWhoseDeadlineIsTwoIntervalsAwayIsSpread(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newOnDemandBucket(clock, 10, time.Second), throttle.WithClock(clock))
	defer lim.Close()
	require.NoError(t, lim.Acquire(context.Background(), 0))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	done := acquireAll(ctx, lim.Key(""), 1, throttle.Forever) // its place is 95 ms on
	receive(t, clock, done, 0, 1)
	clock.Advance(95 * time.Millisecond)
	receive(t, clock, done, 1, 0)
}

func TestACallerThatLeavesBeforeItsPlaceGivesItsPermitBack(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := newOnDemandBucket(clock, 10, time.Second)
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	require.NoError(t, lim.Acquire(context.Background(), 0))
	ctx, cancel := context.WithCancel(context.Background())
	done := acquireAll(ctx, lim.Key(""), 1, 5*time.Second) // its place is 95 ms on
	receive(t, clock, done, 0, 1)
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("the caller did not leave")
	}
	assert.Equal(t, int64(1), b.refunds(), "its permit back in the bucket")
}

// A success reported on every call (as the Transport does) allocates
// nothing.
func TestReportingASuccessAllocatesNothing(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newOnDemandBucket(clock, 10, time.Second), throttle.WithClock(clock))
	defer lim.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, k := range []throttle.Keyed{lim.Key(""), lim.Key("api")} {
		allocs := testing.AllocsPerRun(100, func() { _ = k.Report(ctx, throttle.Answer{}) })
		assert.Zero(t, allocs, "key %q", k.Key())
	}
}

// A place less than a millisecond ahead is not waited for: a timer costs
// more than it spreads.
func TestAPlaceWithinAMillisecondIsNotWaitedFor(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newOnDemandBucket(clock, 10_000, time.Second), throttle.WithClock(clock))
	defer lim.Close()
	// Places 0 to 950 µs on (95 µs apart): all at once.
	receive(t, clock, acquireAll(context.Background(), lim.Key(""), 11, 5*time.Second), 11, 0)
	// The twelfth place is 1045 µs on: waited for.
	done := acquireAll(context.Background(), lim.Key(""), 1, 5*time.Second)
	receive(t, clock, done, 0, 1)
	clock.Advance(1045 * time.Microsecond)
	receive(t, clock, done, 1, 0)
}

// pausableBucket is an onDemandBucket that is also a Pauser: while paused
// it refuses, with the pause's end as the delay.
type pausableBucket struct {
	*onDemandBucket
	pmu   sync.Mutex
	until time.Time
}

func (b *pausableBucket) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	b.pmu.Lock()
	left := b.until.Sub(b.clock.Now())
	b.pmu.Unlock()
	if left > 0 {
		return throttle.Decision{Delay: left, Limit: b.limit, Remaining: -1, Reset: left}, nil
	}
	return b.onDemandBucket.Take(ctx, key, n, maxWait)
}

func (b *pausableBucket) Pause(_ context.Context, _ string, d time.Duration) error {
	b.pmu.Lock()
	defer b.pmu.Unlock()
	if until := b.clock.Now().Add(d); until.After(b.until) {
		b.until = until
	}
	return nil
}

// A pause the provider asks for (an answer with a retry time, reported to
// the Limiter) holds every caller of the key until it ends, including the
// callers whose grant came before the pause and who are still waiting
// for their place in the period: a grant that goes out during the pause
// is a call the provider asked not to get.
func TestACallerWaitingForItsPlaceDoesNotGoDuringAPauseReportedMeanwhile(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &pausableBucket{onDemandBucket: newOnDemandBucket(clock, 10, time.Second)}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := acquireAll(ctx, lim.Key(""), 10, throttle.Forever)
	receive(t, clock, done, 1, 9) // the first at once; 9 wait for their places

	// The provider refuses the first call: "come back in 5 s".
	require.NoError(t, lim.Report(ctx, throttle.Answer{Refused: true, Retry: true, RetryAfter: 5 * time.Second}))

	// 100 ms on, the second caller's place has come, but the pause holds
	// until 5 s: it asks anew and waits for the pause's end.
	clock.Advance(100 * time.Millisecond)
	receive(t, clock, done, 0, 9)
	assert.Equal(t, int64(1), b.refunds(), "the permit of the caller whose place came in the pause, given back")

	// At the pause's end, the callers are granted again.
	clock.Advance(4900 * time.Millisecond)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("no grant after the pause")
	}
	cancel()
	for range 8 {
		<-done
	}
}

// A caller refused for the rest of a period asks for the next one a
// hundredth of the interval after the period's end (at most 10 ms), so
// the fleet's periods start that much more than an interval apart: a
// period's first call delayed on its way by less than that still reaches
// a sliding window an interval after the previous period's first.
func TestACallerRefusedInAPeriodAsksAGapAfterItsEnd(t *testing.T) {
	for _, tc := range []struct {
		interval, gap time.Duration
	}{
		{time.Second, 10 * time.Millisecond},
		{500 * time.Millisecond, 5 * time.Millisecond},
		{10 * time.Second, 10 * time.Millisecond},
	} {
		t.Run(tc.interval.String(), func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			b := newOnDemandBucket(clock, 1, tc.interval)
			lim := throttle.New(b, throttle.WithClock(clock))
			defer lim.Close()
			ctx := context.Background()
			require.NoError(t, lim.Acquire(ctx, 0), "the period's one permit")
			// No deadline: the caller's one timer is its wait for the
			// next period.
			done := acquireAll(ctx, lim.Key(""), 1, throttle.Forever)
			bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			require.NoError(t, clock.BlockUntilContext(bctx, 1), "the refused caller sleeps")
			clock.Advance(tc.interval)
			require.NoError(t, clock.BlockUntilContext(bctx, 1), "at the period's end the caller still sleeps: the gap")
			select {
			case err := <-done:
				t.Fatalf("the caller asked at the period's end (err %v)", err)
			default:
			}
			clock.Advance(tc.gap)
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(5 * time.Second):
				t.Fatal("no grant after the gap")
			}
		})
	}
}

// releaseBucket grants its first take and refuses the others until
// release, naming it (Delay) before the period's end (Reset): a token
// bucket's sliding bound, holding the period's tokens until an earlier
// period's grants are an interval old.
type releaseBucket struct {
	clock        clockwork.Clock
	release, end time.Time

	mu      sync.Mutex
	granted int64
}

func (b *releaseBucket) Take(_ context.Context, _ string, n int64, _ time.Duration) (throttle.Decision, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now()
	if b.granted > 0 && now.Before(b.release) {
		return throttle.Decision{Delay: b.release.Sub(now), Limit: 10, Reset: b.end.Sub(now)}, nil
	}
	b.granted += n
	return throttle.Decision{Granted: true, Limit: 10, Remaining: 10 - b.granted, Reset: b.end.Sub(now)}, nil
}

func (b *releaseBucket) Fallback() (int64, time.Duration, int64) { return 10, time.Second, 1 }
func (b *releaseBucket) Periodic() bool                          { return true }

// A caller refused until a sliding bound lets the period's tokens go (a
// time before the period's end) also asks a gap after that time: the
// grants then follow the earlier ones exactly an interval on, and without
// the gap a call delayed on its way by a millisecond more than the earlier
// one met it in a provider's sliding window (loadtest -failover-at 2s
// -provider sliding -limit 100 -interval 500ms -maxwait 100ms: 5 refused,
// before the failover, in 1 of 3 runs).
func TestACallerRefusedUntilTheWindowLetsGoAsksAGapAfter(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &releaseBucket{clock: clock, release: clock.Now().Add(300 * time.Millisecond), end: clock.Now().Add(time.Second)}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	require.NoError(t, lim.Acquire(ctx, 0), "the first permit")
	done := acquireAll(ctx, lim.Key(""), 1, throttle.Forever)
	bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, clock.BlockUntilContext(bctx, 1), "the refused caller sleeps")
	clock.Advance(300 * time.Millisecond)
	require.NoError(t, clock.BlockUntilContext(bctx, 1), "at the release the caller still sleeps: the gap")
	select {
	case err := <-done:
		t.Fatalf("the caller asked at the release itself (err %v)", err)
	default:
	}
	clock.Advance(10 * time.Millisecond)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("no grant after the gap")
	}
}

// A caller whose wait covers the period's end gets the next period's
// permit: the gap after a period's end is waited only within the
// caller's wait, never turned into an ErrTimeout for a permit that comes
// in time.
func TestACallerRefusedForAPeriodsRestWithinItsWaitGetsTheNextPeriod(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := newOnDemandBucket(clock, 1, time.Second)
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	require.NoError(t, lim.Acquire(ctx, 0), "the period's one permit")
	clock.Advance(500 * time.Millisecond)
	// The next period starts in 500 ms; the caller waits up to 505 ms.
	done := acquireAll(ctx, lim.Key(""), 1, 505*time.Millisecond)
	bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	sleeping := make(chan error, 1)
	go func() { sleeping <- clock.BlockUntilContext(bctx, 1) }()
	select {
	case err := <-done:
		t.Fatalf("Acquire with 505 ms to wait, 500 ms before the next period = %v, want it to wait for that period", err)
	case err := <-sleeping:
		require.NoError(t, err)
	}
	clock.Advance(500 * time.Millisecond)
	select {
	case err := <-done:
		require.NoError(t, err, "the next period's permit, within the wait")
	case <-time.After(5 * time.Second):
		t.Fatal("no answer after the caller's wait")
	}
}

// The same holds for a caller that finds the key's gate closed by an
// earlier refusal of the period: the gate's reopening, a gap after the
// period's end, does not turn it away when the period starts within its
// wait.
func TestACallerQueuedAtAGateClosedForAPeriodsRestWithinItsWaitGetsTheNextPeriod(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := newOnDemandBucket(clock, 2, time.Second)
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	require.NoError(t, lim.Acquire(ctx, 0))
	require.NoError(t, lim.Acquire(ctx, 0))
	clock.Advance(500 * time.Millisecond)
	bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	fctx, stopFirst := context.WithCancel(ctx)
	defer stopFirst()
	first := acquireAll(fctx, lim.Key(""), 1, throttle.Forever) // refused: closes the gate
	require.NoError(t, clock.BlockUntilContext(bctx, 1), "the first refused caller sleeps")
	// The next period starts in 500 ms; this caller waits up to 505 ms.
	done := acquireAll(ctx, lim.Key(""), 1, 505*time.Millisecond)
	sleeping := make(chan error, 1)
	go func() { sleeping <- clock.BlockUntilContext(bctx, 2) }()
	select {
	case err := <-done:
		t.Fatalf("Acquire with 505 ms to wait, 500 ms before the next period = %v, want it to wait for that period", err)
	case err := <-sleeping:
		require.NoError(t, err)
	}
	clock.Advance(500 * time.Millisecond)
	select {
	case err := <-done:
		require.NoError(t, err, "the caller with 505 ms to wait: the next period's permit")
	case <-time.After(5 * time.Second):
		t.Fatal("no answer at the period's end for the caller whose wait ends before the gap's")
	}
	stopFirst()
	<-first // granted or stopped: it only closed the gate
}
