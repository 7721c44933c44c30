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

// placingBucket gives its permits a time and a margin, as package bucket's
// TokenBucket does: each Take answers the next of its decisions (the last
// one again when they run out). It counts the Takes and the permits given
// back, and can be paused. With took set, each Take moves the clock on by
// that much before it answers, as a round trip would.
type placingBucket struct {
	clock *clockwork.FakeClock
	took  time.Duration

	mu        sync.Mutex
	decisions []throttle.Decision
	takes     int
	waits     []time.Duration // the maxWait of each Take
	ns        []int64         // the n of each Take
	cancelled int
	paused    time.Duration
}

func (b *placingBucket) Take(_ context.Context, _ string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	b.mu.Lock()
	b.takes++
	b.waits = append(b.waits, maxWait)
	b.ns = append(b.ns, n)
	d := b.decisions[min(b.takes, len(b.decisions))-1]
	b.mu.Unlock()
	if b.took > 0 {
		b.clock.Advance(b.took)
	}
	if d.Granted {
		d.Cancel = func(context.Context) error {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.cancelled++
			return nil
		}
	}
	return d, nil
}

func (b *placingBucket) Pause(_ context.Context, _ string, d time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.paused = d
	return nil
}

func (b *placingBucket) Fallback() (int64, time.Duration, int64) { return 10, time.Second, 1 }

func (b *placingBucket) counts() (takes, cancelled int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.takes, b.cancelled
}

// acquireAsync runs lim.Acquire(ctx, maxWait) and returns its result's
// channel once the caller sleeps on the clock (or has returned).
func acquireAsync(t *testing.T, clock *clockwork.FakeClock, lim *throttle.Limiter, ctx context.Context, maxWait time.Duration) chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- lim.Acquire(ctx, maxWait) }()
	bctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	blocked := make(chan error, 1)
	go func() { blocked <- clock.BlockUntilContext(bctx, 1) }()
	select {
	case err := <-blocked:
		require.NoError(t, err, "the caller sleeps for its permit's time")
	case err := <-done:
		done <- err // returned without sleeping
	}
	return done
}

func notYet(t *testing.T, done chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s: Acquire returned %v", what, err)
	default:
	}
}

func outcome(t *testing.T, done chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire did not return")
		return nil
	}
}

// TestAcquireReturnsAtItsPermitsTime: a permit whose time is ahead is the
// caller's at that time, not before; the bucket was asked to place it
// within the caller's wait.
func TestAcquireReturnsAtItsPermitsTime(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{{Granted: true, Delay: 300 * time.Millisecond, Margin: 10 * time.Millisecond}}}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	done := acquireAsync(t, clock, lim, context.Background(), time.Second)
	clock.Advance(299 * time.Millisecond)
	notYet(t, done, "a millisecond before the permit's time")
	clock.Advance(time.Millisecond)
	require.NoError(t, outcome(t, done))
	takes, cancelled := b.counts()
	assert.Equal(t, 1, takes)
	assert.Zero(t, cancelled)
	assert.Equal(t, time.Second, b.waits[0], "the bucket may place the permit within the whole wait")
}

// TestAPermitWhoseCallerWokeLateIsNotUsed: a caller that wakes for its
// permit more than the margin after the permit's time (a stalled process)
// does not use it, nor gives it back (one more round trip for a process
// short of time): it takes another within what is left of its wait.
func TestAPermitWhoseCallerWokeLateIsNotUsed(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{
		{Granted: true, Delay: 100 * time.Millisecond, Margin: 5 * time.Millisecond},
		{Granted: true, Margin: 5 * time.Millisecond},
	}}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	done := acquireAsync(t, clock, lim, context.Background(), time.Second)
	clock.Advance(110 * time.Millisecond) // woken 10 ms after the time, 5 ms past the margin
	require.NoError(t, outcome(t, done))
	takes, cancelled := b.counts()
	assert.Equal(t, 2, takes, "the late permit is replaced")
	assert.Zero(t, cancelled, "the late permit is not given back")
}

// TestAPermitWithoutAMarginIsUsedHoweverLate: a bucket that sets no
// margin bounds nothing after a permit's time.
func TestAPermitWithoutAMarginIsUsedHoweverLate(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{{Granted: true, Delay: 100 * time.Millisecond}}}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	done := acquireAsync(t, clock, lim, context.Background(), time.Second)
	clock.Advance(time.Second)
	require.NoError(t, outcome(t, done))
	takes, _ := b.counts()
	assert.Equal(t, 1, takes)
}

// TestACallerWaitingForItsTimeDoesNotGoInAPauseReportedMeanwhile: a
// provider's pause reported while a caller waits for its permit's time
// holds that caller: it gives the permit back, and the key's gate, closed
// for the pause, turns it away (the pause ends beyond its wait) without
// asking the bucket again.
func TestACallerWaitingForItsTimeDoesNotGoInAPauseReportedMeanwhile(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{
		{Granted: true, Delay: 500 * time.Millisecond, Margin: 10 * time.Millisecond},
		{Delay: time.Second},
	}}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	done := acquireAsync(t, clock, lim, ctx, 600*time.Millisecond)
	require.NoError(t, lim.Report(ctx, throttle.Answer{Refused: true, Retry: true, RetryAfter: time.Second}))
	clock.Advance(500 * time.Millisecond)
	require.ErrorIs(t, outcome(t, done), throttle.ErrTimeout)
	takes, cancelled := b.counts()
	assert.Equal(t, 1, takes, "refused for the pause without asking again")
	assert.Equal(t, 1, cancelled, "the permit of the paused time is given back")
}

// TestACallerThatLeavesBeforeItsTimeGivesItsPermitBack: a caller whose
// context ends while it waits for its permit's time returns the context's
// error and gives the permit back.
func TestACallerThatLeavesBeforeItsTimeGivesItsPermitBack(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{{Granted: true, Delay: time.Minute, Margin: 10 * time.Millisecond}}}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := acquireAsync(t, clock, lim, ctx, throttle.Forever)
	cancel()
	require.ErrorIs(t, outcome(t, done), context.Canceled)
	require.NoError(t, lim.Close()) // waits for the give-back
	_, cancelled := b.counts()
	assert.Equal(t, 1, cancelled)
}

// TestAPermitBeyondTheWaitIsRefusedAtOnce: a permit whose time lies beyond
// the caller's wait (a bucket that placed it there) is given back, and
// Acquire fails at once, without sleeping.
func TestAPermitBeyondTheWaitIsRefusedAtOnce(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{{Granted: true, Delay: 2 * time.Second, Margin: 10 * time.Millisecond}}}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	require.ErrorIs(t, lim.Acquire(context.Background(), time.Second), throttle.ErrTimeout)
	require.NoError(t, lim.Close())
	_, cancelled := b.counts()
	assert.Equal(t, 1, cancelled)
}

// TestAPermitFreeAtOnceIsNotUsedPastItsMargin: a permit the bucket grants
// for now is used only within its margin of the answer, as one whose
// time the caller waited for: a caller descheduled after the answer (a
// starved CPU) takes another rather than send it late. Here the margin
// (1 ns) has passed by the time the Limiter looks.
func TestAPermitFreeAtOnceIsNotUsedPastItsMargin(t *testing.T) {
	b := &placingBucket{clock: clockwork.NewFakeClock(), decisions: []throttle.Decision{
		{Granted: true, Margin: time.Nanosecond},
		{Granted: true, Margin: time.Hour},
	}}
	lim := throttle.New(b) // the real clock: it moves between the answer and the look
	defer lim.Close()
	require.NoError(t, lim.Acquire(context.Background(), time.Second))
	takes, cancelled := b.counts()
	assert.Equal(t, 2, takes, "the permit past its margin was replaced")
	assert.Zero(t, cancelled, "and not given back")
}

// placingCost is placingBucket with costs: each TakeCost returns the next
// of its decisions.
type placingCost struct{ placingBucket }

func (b *placingCost) TakeCost(ctx context.Context, key string, _ throttle.Cost, maxWait time.Duration) (throttle.Decision, error) {
	return b.Take(ctx, key, 1, maxWait)
}

// TestACostIsUsedOnlyWithinItsMargin: a cost's time and margin count from
// its answer, as a permit's do: the caller wakes at its time (not a
// sleep's length after it looked), and a cost past its margin (here 1 ns,
// passed by the time the Limiter looks) is not used: another is taken.
func TestACostIsUsedOnlyWithinItsMargin(t *testing.T) {
	b := &placingCost{placingBucket{clock: clockwork.NewFakeClock(), decisions: []throttle.Decision{
		{Granted: true, Margin: time.Nanosecond},
		{Granted: true, Margin: time.Hour},
	}}}
	lim := throttle.New(b) // the real clock: it moves between the answer and the look
	defer lim.Close()
	_, err := lim.AcquireCost(context.Background(), throttle.Cost{"tokens": 10}, time.Second)
	require.NoError(t, err)
	takes, _ := b.counts()
	assert.Equal(t, 2, takes, "the cost past its margin was replaced")
}
