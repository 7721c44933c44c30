package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
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
	// reset and remaining, when reset > 0, are what a grant reports: the
	// period's end and the permits it has left.
	reset     time.Duration
	remaining int64
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
	if f.reset > 0 {
		return throttle.Decision{Granted: true, Limit: f.limit, Remaining: f.remaining, Reset: f.reset}, nil
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

// TestFailLocalGrantsTheInstanceShare: with nothing known of the period
// running when the store failed, FailLocal assumes it used up and starts
// one interval later, then paces this instance's share evenly.
func TestFailLocalGrantsTheInstanceShare(t *testing.T) {
	clock := clockwork.NewFakeClock()
	// 10 per second shared by 4 instances: 2 per second here.
	f := &flaky{down: true, limit: 10, interval: time.Second, instances: 4}
	obs := &degradedCounter{}
	lim := throttle.New(f, throttle.WithClock(clock), throttle.WithObserver(obs))
	granted := 0
	greedy := func() {
		for lim.Acquire(context.Background(), 0) == nil {
			granted++
		}
	}
	greedy()
	assert.Zero(t, granted, "the running period may be used up: nothing in its first interval")
	for range 19 { // to 1.9 s in steps of 100 ms
		clock.Advance(100 * time.Millisecond)
		greedy()
	}
	assert.Equal(t, 2, granted, "FailLocal grants limit ÷ instances per interval, evenly (at 1 s and 1.5 s)")
	g, r := obs.counts("local")
	assert.Equal(t, 2, g)
	assert.Positive(t, r)

	// Back up: the shared bucket grants everything again at the next call.
	f.set(false, false)
	for range 10 {
		require.NoError(t, lim.Acquire(context.Background(), 0))
	}
}

// TestFailLocalStartsWhereTheSharedPeriodLeftOff: the last shared decision
// said 6 permits were left and the period ends in 400 ms; this instance (one
// of 2) takes at most its half of them before the end, then its share.
func TestFailLocalStartsWhereTheSharedPeriodLeftOff(t *testing.T) {
	clock := clockwork.NewFakeClock()
	f := &flaky{limit: 10, interval: time.Second, instances: 2, reset: 400 * time.Millisecond, remaining: 6}
	lim := throttle.New(f, throttle.WithClock(clock))
	ctx := context.Background()
	require.NoError(t, lim.Acquire(ctx, 0))
	f.set(true, false)
	counts := map[int]int{}
	for step := range 20 {
		for lim.Acquire(ctx, 0) == nil {
			counts[(step*100+600)/1000]++ // period 0 ends 400 ms from now
		}
		clock.Advance(100 * time.Millisecond)
	}
	assert.Equal(t, 2, counts[0], "half of the 6 left, before the period's end: 3, paced 200 ms apart (only 2 fit)")
	assert.Equal(t, 5, counts[1], "then the share of 5 per period")
}

func TestFailLocalWaitsForTheLocalShareWithinMaxWait(t *testing.T) {
	clock := clockwork.NewFakeClock()
	f := &flaky{down: true, limit: 1, interval: time.Second, instances: 1}
	lim := throttle.New(f, throttle.WithClock(clock))
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
		lim = throttle.New(errBucket{fmt.Errorf("test: key = x: %w", throttle.ErrInvalid)}, throttle.WithFailurePolicy(policy), throttle.WithObserver(obs))
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
	// The period running when the store hangs has permits left: FailLocal
	// grants from them at once.
	f.reset, f.remaining = time.Hour, 1000
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
			f.set(false, false)
			require.NoError(t, lim.Acquire(context.Background(), 0))
			f.set(false, true)
			f.calls.Store(0)
			start := time.Now()
			err := lim.Acquire(context.Background(), tc.maxWait)
			took := time.Since(start)
			switch {
			case tc.wantErr == nil && tc.maxWait > 0 && errors.Is(err, throttle.ErrTimeout) && strings.Contains(err.Error(), "given back"):
				// The policy decides when the store call is cut, a
				// few ms before the wait's end (storeMargin); a
				// machine that schedules the caller later than that
				// refuses the grant it made past the wait's end, as
				// Acquire's godoc says. That FailOpen grants is
				// checked below, by callers that decide at once.
				t.Logf("decided after the wait's end on this machine: %v", err)
			case tc.wantErr == nil:
				require.NoError(t, err)
			default:
				require.ErrorIs(t, err, tc.wantErr)
			}
			assert.Less(t, took, tc.bound+50*time.Millisecond, "Acquire returned %v after its bound %v", took-tc.bound, tc.bound)

			// Now down: 20 concurrent callers, one probe at a time;
			// FailOpen grants each of them, FailClosed none, FailLocal
			// some (its share, 1000 a second, paced).
			var wg sync.WaitGroup
			var granted atomic.Int64
			for range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if lim.Acquire(context.Background(), 0) == nil {
						granted.Add(1)
					}
				}()
			}
			wg.Wait()
			switch tc.policy {
			case throttle.FailClosed:
				assert.Zero(t, granted.Load(), "FailClosed grants nothing while the store hangs")
			case throttle.FailOpen:
				assert.Equal(t, int64(20), granted.Load(), "FailOpen grants every caller while the store hangs")
			default:
				assert.Positive(t, granted.Load(), "FailLocal grants its share while the store hangs")
			}
			assert.LessOrEqual(t, f.calls.Load(), int64(12), "callers during an outage decide without asking the hung store (one probe at a time)")
		})
	}
}

// TestFailLocalWithoutAKnownShareFailsClosed: an instance that has never
// seen how many instances share the limit (it started while the store was
// down) cannot know its share, so FailLocal refuses instead of granting
// the whole limit on every instance.
func TestFailLocalWithoutAKnownShareFailsClosed(t *testing.T) {
	f := &flaky{limit: 100, interval: time.Second, instances: 0, reset: time.Hour, remaining: 100}
	lim0 := throttle.New(f)
	require.NoError(t, lim0.Acquire(context.Background(), 0))
	f.set(true, false)
	lim := lim0 // FailLocal is the default
	err := lim.Acquire(context.Background(), 0)
	var be *throttle.BackendError
	require.ErrorAs(t, err, &be, "no share known: the store's error, not a grant")

	f.instances = 4
	require.NoError(t, lim.Acquire(context.Background(), 0), "with a share known, FailLocal grants within it")
}

// TestUnknownFailurePolicyIsRefused: a policy outside the three named ones
// is a mistake, reported by every call; it does not fall back silently to
// FailLocal.
func TestUnknownFailurePolicyIsRefused(t *testing.T) {
	b, err := throttle.NewLocal(10, time.Second)
	require.NoError(t, err)
	lim := throttle.New(b, throttle.WithFailurePolicy(throttle.FailurePolicy(7)))
	err = lim.Acquire(context.Background(), 0)
	require.ErrorIs(t, err, throttle.ErrInvalid)
	assert.Contains(t, err.Error(), "WithFailurePolicy")
}

// hungThenLate is a store that hangs: each Take blocks until its context
// ends and fails then. Its caller's process is then resumed late by late:
// the fake clock, which measures the caller's wait, moves on by the
// call's bound and then by late, as a scheduling stall would.
type hungThenLate struct {
	clock *clockwork.FakeClock
	late  time.Duration
}

func (b *hungThenLate) Take(ctx context.Context, _ string, _ int64, _ time.Duration) (throttle.Decision, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		return throttle.Decision{}, &throttle.BackendError{Op: "take", Err: fmt.Errorf("test: the store call has no deadline")}
	}
	bound := time.Until(dl)
	<-ctx.Done()
	b.clock.Advance(bound + b.late)
	return throttle.Decision{}, &throttle.BackendError{Op: "take", Err: fmt.Errorf("test: no reply: %w", ctx.Err())}
}

// TestFailOpenDecidesWithinTheWaitWhenTheStoreHangs: a store call under
// a waiting caller ends a room before the end of the wait (a quarter of
// it, at most 10 ms), so that FailOpen's grant lands within the wait even
// when the process runs the caller again a little late; a caller resumed
// only after its wait's end gets ErrTimeout (no grant after the wait), and
// never the store's error.
func TestFailOpenDecidesWithinTheWaitWhenTheStoreHangs(t *testing.T) {
	for _, tc := range []struct {
		maxWait, late time.Duration
		granted       bool
	}{
		{40 * time.Millisecond, 0, true},
		{40 * time.Millisecond, 5 * time.Millisecond, true}, // within the room of 10 ms
		{40 * time.Millisecond, 20 * time.Millisecond, false},
		{20 * time.Millisecond, 2 * time.Millisecond, true}, // within the room of 5 ms
		{20 * time.Millisecond, 10 * time.Millisecond, false},
	} {
		t.Run(fmt.Sprintf("maxWait=%v/late=%v", tc.maxWait, tc.late), func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			b := &hungThenLate{clock: clock, late: tc.late}
			// A store timeout of 20 ms: the first failure's call (5 ms
			// or more) has a fair chance of it, and counts as the store's.
			lim := throttle.New(b, throttle.WithClock(clock), throttle.WithFailurePolicy(throttle.FailOpen), throttle.WithStoreTimeout(20*time.Millisecond))
			defer lim.Close()
			err := lim.Acquire(context.Background(), tc.maxWait)
			if tc.granted {
				require.NoError(t, err, "FailOpen's grant came within the wait")
				return
			}
			require.ErrorIs(t, err, throttle.ErrTimeout, "the caller was resumed after its wait's end")
			var be *throttle.BackendError
			assert.False(t, errors.As(err, &be), "FailOpen surfaces no store error: %v", err)
		})
	}
}
