package throttle_test

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
)

// flaky is a shared-store stand-in: it grants everything while up, fails
// with a BackendError while down, and blocks until the call's context ends
// while hung. It implements Fallbacker with a fixed limit and instance count.
type flaky struct {
	mu        sync.Mutex
	down      bool
	hung      bool
	calls     atomic.Int64
	limit     int64
	interval  time.Duration
	instances int64
}

func (f *flaky) set(down, hung bool) {
	f.mu.Lock()
	f.down, f.hung = down, hung
	f.mu.Unlock()
}

func (f *flaky) Take(ctx context.Context, _ string, _ int64, _ time.Duration) (throttle.Decision, error) {
	f.calls.Add(1)
	f.mu.Lock()
	down, hung := f.down, f.hung
	f.mu.Unlock()
	if hung {
		<-ctx.Done()
		return throttle.Decision{}, &throttle.BackendError{Op: "take", Err: ctx.Err()}
	}
	if down {
		return throttle.Decision{}, &throttle.BackendError{Op: "take", Err: io.ErrUnexpectedEOF}
	}
	return throttle.Decision{Granted: true}, nil
}

func (f *flaky) Fallback() (int64, time.Duration, int64) { return f.limit, f.interval, f.instances }

// noFallback hides flaky's Fallback method.
type noFallback struct{ f *flaky }

func (n noFallback) Take(ctx context.Context, key string, k int64, w time.Duration) (throttle.Decision, error) {
	return n.f.Take(ctx, key, k, w)
}

// degradedCounter counts Degraded reports, by policy and outcome.
type degradedCounter struct {
	mu      sync.Mutex
	granted map[string]int
	refused map[string]int
}

func (c *degradedCounter) Acquired(string, int64, time.Duration, error)               {}
func (c *degradedCounter) BucketCall(string, throttle.Decision, time.Duration, error) {}
func (c *degradedCounter) Degraded(_ string, policy string, granted bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.granted == nil {
		c.granted, c.refused = map[string]int{}, map[string]int{}
	}
	if err == nil {
		panic("Degraded without the store's error")
	}
	if granted {
		c.granted[policy]++
	} else {
		c.refused[policy]++
	}
}

func (c *degradedCounter) counts(policy string) (granted, refused int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.granted[policy], c.refused[policy]
}

func TestFailurePolicyOpenGrantsWhileStoreFails(t *testing.T) {
	f := &flaky{down: true, limit: 10, interval: time.Second, instances: 1}
	obs := &degradedCounter{}
	lim := throttle.New(f, throttle.WithFailurePolicy(throttle.FailOpen), throttle.WithObserver(obs))
	for range 50 {
		require.NoError(t, lim.Acquire(context.Background(), 0))
	}
	g, r := obs.counts("open")
	assert.Equal(t, 50, g, "every degraded decision is reported")
	assert.Zero(t, r)
}

func TestFailurePolicyClosedReturnsTheStoreError(t *testing.T) {
	f := &flaky{down: true, limit: 10, interval: time.Second, instances: 1}
	obs := &degradedCounter{}
	lim := throttle.New(f, throttle.WithFailurePolicy(throttle.FailClosed), throttle.WithObserver(obs))
	err := lim.Acquire(context.Background(), time.Second)
	var be *throttle.BackendError
	require.ErrorAs(t, err, &be)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.NotErrorIs(t, err, throttle.ErrTimeout, "the wait did not run out: the store failed")
	_, r := obs.counts("closed")
	assert.Equal(t, 1, r)

	f.set(false, false)
	require.NoError(t, lim.Acquire(context.Background(), 0), "the shared bucket decides again at the next call")
}

func TestFailLocalGrantsTheInstanceShare(t *testing.T) {
	clock := clockwork.NewFakeClock()
	// 10 per second shared by 4 instances: 2 per second here.
	f := &flaky{down: true, limit: 10, interval: time.Second, instances: 4}
	obs := &degradedCounter{}
	lim := throttle.New(f, throttle.WithClock(clock), throttle.WithObserver(obs))
	granted := 0
	for range 20 {
		if lim.Acquire(context.Background(), 0) == nil {
			granted++
		}
	}
	assert.Equal(t, 2, granted, "FailLocal grants limit ÷ instances (rounded down) per interval")
	g, r := obs.counts("local")
	assert.Equal(t, 2, g)
	assert.Positive(t, r)

	clock.Advance(500 * time.Millisecond)
	require.NoError(t, lim.Acquire(context.Background(), 0), "the local share refills at its rate")
	require.ErrorIs(t, lim.Acquire(context.Background(), 0), throttle.ErrTimeout)

	// Back up: the shared bucket grants everything again at the next call.
	f.set(false, false)
	for range 10 {
		require.NoError(t, lim.Acquire(context.Background(), 0))
	}
}

func TestFailLocalWaitsForTheLocalShareWithinMaxWait(t *testing.T) {
	clock := clockwork.NewFakeClock()
	f := &flaky{down: true, limit: 1, interval: time.Second, instances: 1}
	lim := throttle.New(f, throttle.WithClock(clock))
	require.NoError(t, lim.Acquire(context.Background(), 0))
	done := result(func() error { return lim.Acquire(context.Background(), 2*time.Second) })
	waitForSleepers(t, clock, 1)
	clock.Advance(time.Second)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return after the local share refilled")
	}
	err := lim.Acquire(context.Background(), 100*time.Millisecond)
	require.ErrorIs(t, err, throttle.ErrTimeout, "no local permit within maxWait")
}

func TestFailLocalWithoutFallbackerFailsClosed(t *testing.T) {
	f := &flaky{down: true}
	obs := &degradedCounter{}
	lim := throttle.New(noFallback{f}, throttle.WithObserver(obs))
	var be *throttle.BackendError
	require.ErrorAs(t, lim.Acquire(context.Background(), 0), &be)
	_, r := obs.counts("closed")
	assert.Equal(t, 1, r)
}

func TestErrorsAboutTheCallAreNotDegraded(t *testing.T) {
	obs := &degradedCounter{}
	for _, policy := range []throttle.FailurePolicy{throttle.FailOpen, throttle.FailLocal, throttle.FailClosed} {
		lim := throttle.New(errBucket{throttle.ErrExceedsLimit}, throttle.WithFailurePolicy(policy), throttle.WithObserver(obs))
		require.ErrorIs(t, lim.Acquire(context.Background(), 0), throttle.ErrExceedsLimit, policy.String())
		lim = throttle.New(errBucket{throttle.Invalid("test", "key", "x", "bad")}, throttle.WithFailurePolicy(policy), throttle.WithObserver(obs))
		require.ErrorIs(t, lim.Acquire(context.Background(), 0), throttle.ErrInvalid, policy.String())
	}
	for _, p := range []string{"open", "local", "closed"} {
		g, r := obs.counts(p)
		assert.Zero(t, g+r, p)
	}
}

type errBucket struct{ err error }

func (e errBucket) Take(context.Context, string, int64, time.Duration) (throttle.Decision, error) {
	return throttle.Decision{}, e.err
}

// A hung store costs a caller at most its wait (or the store timeout for
// maxWait 0), and while one caller probes it the others decide at once.
func TestHungStoreIsBoundedAndProbedOnce(t *testing.T) {
	f := &flaky{hung: true, limit: 1000, interval: time.Second, instances: 1}
	for _, tc := range []struct {
		name    string
		policy  throttle.FailurePolicy
		maxWait time.Duration
		bound   time.Duration
		wantErr error
	}{
		{"closed/maxWait=0", throttle.FailClosed, 0, 30 * time.Millisecond, context.DeadlineExceeded},
		{"closed/maxWait=20ms", throttle.FailClosed, 20 * time.Millisecond, 20 * time.Millisecond, throttle.ErrTimeout},
		{"local/maxWait=0", throttle.FailLocal, 0, 30 * time.Millisecond, nil},
		{"open/maxWait=20ms", throttle.FailOpen, 20 * time.Millisecond, 20 * time.Millisecond, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.calls.Store(0)
			lim := throttle.New(f, throttle.WithFailurePolicy(tc.policy), throttle.WithStoreTimeout(30*time.Millisecond))
			start := time.Now()
			err := lim.Acquire(context.Background(), tc.maxWait)
			took := time.Since(start)
			if tc.wantErr == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.wantErr)
			}
			assert.Less(t, took, tc.bound+50*time.Millisecond, "Acquire returned %v after its bound %v", took-tc.bound, tc.bound)

			// Now down: 20 concurrent callers, one probe at a time.
			var wg sync.WaitGroup
			for range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = lim.Acquire(context.Background(), 0)
				}()
			}
			wg.Wait()
			assert.LessOrEqual(t, f.calls.Load(), int64(12), "callers during an outage decide without asking the hung store (one probe at a time)")
		})
	}
}

func TestShare(t *testing.T) {
	for _, tc := range []struct {
		limit     int64
		interval  time.Duration
		instances int64
		wantL     int64
		wantI     time.Duration
	}{
		{10, time.Second, 1, 10, time.Second},
		{10, time.Second, 3, 3, time.Second},
		{10, time.Second, 0, 10, time.Second},
		{2, time.Second, 5, 1, 2500 * time.Millisecond},
	} {
		l, i := throttle.ShareForTest(tc.limit, tc.interval, tc.instances)
		assert.Equal(t, tc.wantL, l, "%+v", tc)
		assert.Equal(t, tc.wantI, i.Round(time.Millisecond), "%+v", tc)
		assert.LessOrEqual(t, float64(l)/i.Seconds(), float64(tc.limit)/tc.interval.Seconds()/float64(max(tc.instances, 1))+1e-9, "never above the exact share")
	}
}

// TestFailLocalWithoutAKnownShareFailsClosed: an instance that has never
// seen how many instances share the limit (it started while the store was
// down) cannot know its share, so FailLocal refuses instead of granting
// the whole limit on every instance.
func TestFailLocalWithoutAKnownShareFailsClosed(t *testing.T) {
	f := &flaky{limit: 100, interval: time.Second, instances: 0}
	f.set(true, false)
	lim := throttle.New(f) // FailLocal is the default
	err := lim.Acquire(context.Background(), 0)
	var be *throttle.BackendError
	require.ErrorAs(t, err, &be, "no share known: the store's error, not a grant")

	f.instances = 4
	require.NoError(t, lim.Acquire(context.Background(), 0), "with a share known, FailLocal grants within it")
}
