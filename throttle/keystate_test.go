package throttle_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
)

// liveLimited is a bucket built with one limit (what Fallback reports) whose
// decisions report another, raised or lowered live, as a Redis bucket's do
// after SetLimit. It grants everything.
type liveLimited struct {
	built, live int64
	interval    time.Duration
}

func (b *liveLimited) Take(context.Context, string, int64, time.Duration) (throttle.Decision, error) {
	return throttle.Decision{Granted: true, Limit: b.live, Remaining: b.live / 2, Reset: b.interval / 2}, nil
}

func (b *liveLimited) Fallback() (int64, time.Duration, int64) { return b.built, b.interval, 1 }

// TestAdaptiveRateFollowsALiveLimit: a bucket built at 100 per second whose
// limit was raised live to 1000, then one refusal without a hint: the rate
// is paced at 0.9 of the limit in force (900), not of the limit read at New
// (90), and the ceiling it may climb back to is 1000.
func TestAdaptiveRateFollowsALiveLimit(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	b := &liveLimited{built: 100, live: 1000, interval: time.Second}
	lim := throttle.New(b, throttle.WithClock(clock))
	for _, key := range []string{"", "tenant"} {
		k := lim.Key(key)
		for range 10 {
			require.NoError(t, k.Acquire(ctx, 0))
		}
		require.NoError(t, k.Report(ctx, throttle.Answer{Refused: true}))
		s, err := lim.Key(key).AdaptiveState(ctx)
		require.NoError(t, err)
		assert.InDelta(t, 900, s.Rate, 1, "key %q: 0.9 of the live limit 1000", key)
	}
}

// steppingClock is a fake clock whose wall time (Now) can step back, as a
// host's does under NTP or after a VM resumes, while Since, Until and its
// timers stay monotonic, as time.Now's monotonic reading does.
type steppingClock struct {
	*clockwork.FakeClock
	back atomic.Int64
}

func (c *steppingClock) Now() time.Time {
	return c.FakeClock.Now().Add(-time.Duration(c.back.Load()))
}

// sleeping returns a channel closed once n goroutines sleep on clock.
func sleeping(clock *clockwork.FakeClock, n int) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = clock.BlockUntilContext(ctx, n)
		close(ch)
	}()
	return ch
}

// refuseOnce refuses its first call for delay, then grants everything.
type refuseOnce struct {
	delay   time.Duration
	refused atomic.Bool
}

func (b *refuseOnce) Take(context.Context, string, int64, time.Duration) (throttle.Decision, error) {
	if b.refused.CompareAndSwap(false, true) {
		return throttle.Decision{Delay: b.delay, Remaining: 0}, nil
	}
	return throttle.Decision{Granted: true, Remaining: -1}, nil
}

// TestWallClockStepBackDoesNotShutAKeyOut: one refusal closes a key for
// a second; the host's clock then steps back an hour. Once that second
// has passed (on the monotonic clock), the key grants again, and a caller
// may wait for it: no one is told that the key is closed for an hour.
func TestWallClockStepBackDoesNotShutAKeyOut(t *testing.T) {
	for _, key := range []string{"", "tenant"} {
		t.Run("key "+key, func(t *testing.T) {
			ctx := context.Background()
			clock := &steppingClock{FakeClock: clockwork.NewFakeClock()}
			lim := throttle.New(&refuseOnce{delay: time.Second}, throttle.WithClock(clock)).Key(key)
			require.ErrorIs(t, lim.Acquire(ctx, 0), throttle.ErrTimeout)
			clock.back.Store(int64(time.Hour))
			clock.Advance(500 * time.Millisecond)
			done := result(func() error { return lim.Acquire(ctx, time.Second) })
			select {
			case err := <-done:
				t.Fatalf("a caller that may wait a second for the rest of the refusal's second returned at once: %v", err)
			case <-sleeping(clock.FakeClock, 1):
			}
			clock.Advance(500 * time.Millisecond)
			require.NoError(t, <-done, "a caller waiting out the refusal's second")
			require.NoError(t, lim.Acquire(ctx, 10*time.Millisecond), "the key grants again")
		})
	}
}

// stallingAdaptive is a bucket that grants everything and keeps an
// adaptive state that is active with an increase due; its SwapAdaptive
// (the write of the increase) stalls until released or its context ends,
// and records when it returned.
type stallingAdaptive struct {
	release  chan struct{}
	entered  chan struct{}
	mu       sync.Mutex
	returned time.Time
}

func (b *stallingAdaptive) Take(context.Context, string, int64, time.Duration) (throttle.Decision, error) {
	return throttle.Decision{Granted: true, Limit: 100, Remaining: 50, Reset: time.Second}, nil
}

func (b *stallingAdaptive) Fallback() (int64, time.Duration, int64) { return 100, time.Second, 1 }

func (b *stallingAdaptive) state() throttle.AdaptiveState {
	long := time.Now().Add(-time.Hour)
	return throttle.AdaptiveState{Rate: 50, Peak: 100, Step: 4, Decreased: long, Increased: long, Refused: long, Version: 1, At: time.Now()}
}

func (b *stallingAdaptive) PaceAdaptive(context.Context, string, int64, time.Duration, time.Duration) (throttle.AdaptivePace, error) {
	return throttle.AdaptivePace{Granted: true, State: b.state()}, nil
}

func (b *stallingAdaptive) SwapAdaptive(ctx context.Context, _ string, old, _ throttle.AdaptiveState, _ time.Duration) (throttle.AdaptiveState, bool, error) {
	if old.Version < 0 {
		return b.state(), false, nil // a read
	}
	select {
	case b.entered <- struct{}{}:
	default:
	}
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	b.mu.Lock()
	b.returned = time.Now()
	b.mu.Unlock()
	return throttle.AdaptiveState{}, false, ctx.Err()
}

// TestAcquireDoesNotWaitForTheAdaptiveIncrease: a key adapting, an
// increase due, and the store stalls as the increase is written: Acquire
// with a 20 ms wait returns without waiting for that write (which used to
// hold it for the store timeout, 100 ms).
func TestAcquireDoesNotWaitForTheAdaptiveIncrease(t *testing.T) {
	b := &stallingAdaptive{release: make(chan struct{}), entered: make(chan struct{}, 1)}
	lim := throttle.New(b)
	defer lim.Close()
	ctx := context.Background()
	s, err := lim.Key("").AdaptiveState(ctx)
	require.NoError(t, err)
	require.True(t, s.Active(), "the key adapts")
	require.NoError(t, lim.Acquire(ctx, 20*time.Millisecond))
	acquired := time.Now()
	select {
	case <-b.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the increase was never written")
	}
	b.mu.Lock()
	returned := b.returned
	b.mu.Unlock()
	assert.True(t, returned.IsZero() || returned.After(acquired), "Acquire returned at %v, after the stalled write ended at %v", acquired, returned)
	close(b.release)
}

// countingWrapper is a wrapper a user might write: it counts the calls
// that reach the bucket, and offers Unwrap.
type countingWrapper struct {
	throttle.Bucket
	calls atomic.Int64
}

func (c *countingWrapper) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	c.calls.Add(1)
	return c.Bucket.Take(ctx, key, n, maxWait)
}

func (c *countingWrapper) Unwrap() throttle.Bucket { return c.Bucket }

// TestUserWrapperAroundLocalKeepsRefundsAndTheAdaptiveRate: through a
// user's counting wrapper, an abandoned reservation of a Local bucket is
// still given back exactly, and a refusal still slows the key (the
// Limiter finds the bucket's limit through Unwrap).
func TestUserWrapperAroundLocalKeepsRefundsAndTheAdaptiveRate(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	w := &countingWrapper{Bucket: newLocal(t, clock, 1, time.Second, throttle.WithLocalBurst(1))}
	lim := throttle.New(w, throttle.WithClock(clock))
	defer lim.Close()
	require.NoError(t, lim.Acquire(ctx, 0))
	cctx, cancel := context.WithCancel(ctx)
	done := result(func() error { return lim.Acquire(cctx, 2*time.Second) }) // reserves the slot at 1 s
	waitForSleepers(t, clock, 1)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	clock.Advance(time.Second)
	require.NoError(t, lim.Acquire(ctx, 0), "the abandoned slot was given back")

	require.NoError(t, lim.Report(ctx, throttle.Answer{Refused: true}))
	s, err := lim.Key("").AdaptiveState(ctx)
	require.NoError(t, err)
	assert.True(t, s.Active(), "the refusal slows the key")
	assert.Positive(t, w.calls.Load())
}

// foreverStore grants with a Reset of Forever while up, and fails while
// down.
type foreverStore struct{ down atomic.Bool }

func (s *foreverStore) Take(context.Context, string, int64, time.Duration) (throttle.Decision, error) {
	if s.down.Load() {
		return throttle.Decision{}, &throttle.BackendError{Op: "take", Err: context.DeadlineExceeded}
	}
	return throttle.Decision{Granted: true, Limit: 100, Remaining: 50, Reset: throttle.Forever}, nil
}

func (s *foreverStore) Fallback() (int64, time.Duration, int64) { return 100, throttle.Forever, 1 }

// TestHugeResetsAndTTLsDoNotOverflow: a bucket that reports a Reset and an
// interval of Forever, with leasing whose TTL is Forever and FailLocal,
// through an outage and a pause of Forever: no time wraps around into the
// past (a lease valid "until" a negative time, a pause already over).
func TestHugeResetsAndTTLsDoNotOverflow(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	s := &foreverStore{}
	lim := throttle.New(s, throttle.WithClock(clock), throttle.WithLeasing(throttle.Leasing{TTL: throttle.Forever, Share: 1}))
	defer lim.Close()
	for range 20 {
		require.NoError(t, lim.Acquire(ctx, 0))
	}
	s.down.Store(true)
	for range 5 {
		require.NoError(t, lim.Acquire(ctx, 0), "leased permits are the store's: served while it is down")
	}
	require.NoError(t, lim.Report(ctx, throttle.Answer{Refused: true, Retry: true, RetryAfter: throttle.Forever}))
	clock.Advance(time.Minute)
	require.ErrorIs(t, lim.Acquire(ctx, 0), throttle.ErrTimeout, "paused")
}
