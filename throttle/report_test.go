package throttle_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
)

// pausing is a Local bucket that records its pauses.
type pausing struct {
	*throttle.Local
	mu     sync.Mutex
	pauses []time.Duration
}

// Fallback tells the Limiter the limit: 10 per second.
func (p *pausing) Fallback() (int64, time.Duration, int64) { return 10, time.Second, 1 }

func (p *pausing) Pause(_ context.Context, _ string, d time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pauses = append(p.pauses, d)
	return nil
}

func TestReportRefusalPacesGrants(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newLocal(t, clock, 10, time.Second), throttle.WithClock(clock))

	for range 3 {
		require.NoError(t, lim.Acquire(ctx, 0), "a burst is fine before any refusal")
	}
	// Many callers see the same burst refused: it counts once.
	for range 5 {
		require.NoError(t, lim.Report(ctx, throttle.Answer{Refused: true}))
	}
	s, err := lim.Key("").AdaptiveState(ctx)
	require.NoError(t, err)
	assert.InDelta(t, 9, s.Rate, 1e-9)

	// Paced at 9 per second: one slot now, the next 1/9 s later.
	require.NoError(t, lim.Acquire(ctx, 0))
	err = lim.Acquire(ctx, 0)
	require.ErrorIs(t, err, throttle.ErrTimeout, "the bucket has permits, but the paced slot is not free yet")
	clock.Advance(time.Second / 9)
	require.NoError(t, lim.Acquire(ctx, 0))

	// A waiter sleeps until its slot, on the clock.
	done := result(func() error { return lim.Acquire(ctx, time.Second) })
	waitForSleepers(t, clock, 1)
	clock.Advance(time.Second / 9)
	require.NoError(t, <-done)
}

// A refusal with a retry hint pauses the bucket for the hint's time, and
// the Limiter's callers of the key however the bucket answers (this one
// records its pauses only), and also lowers the adaptive rate, as one
// without: a provider that refuses every period's burst with Retry-After
// is answered by pacing.
func TestReportRefusalWithHintPausesAndLowersTheRate(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	b := &pausing{Local: newLocal(t, clock, 10, time.Second)}
	lim := throttle.New(b, throttle.WithClock(clock))

	// Many callers see the same burst refused, each with the hint.
	for range 5 {
		require.NoError(t, lim.Report(ctx, throttle.Answer{Refused: true, Retry: true, RetryAfter: 200 * time.Millisecond}))
	}
	assert.Len(t, b.pauses, 5, "every hint pauses the bucket")
	assert.Equal(t, 200*time.Millisecond, b.pauses[0])
	s, err := lim.Key("").AdaptiveState(ctx)
	require.NoError(t, err)
	assert.InDelta(t, 9, s.Rate, 1e-9, "the refusals lower the rate, once per interval")
	require.ErrorIs(t, lim.Acquire(ctx, 100*time.Millisecond), throttle.ErrTimeout, "the pause holds the Limiter's callers, though this bucket grants")
	clock.Advance(200 * time.Millisecond)

	// Grants are paced at 9 per second: one slot now, the next 1/9 s later.
	require.NoError(t, lim.Acquire(ctx, 0))
	require.ErrorIs(t, lim.Acquire(ctx, 0), throttle.ErrTimeout, "the bucket has permits, but the paced slot is not free yet")
	clock.Advance(time.Second / 9)
	require.NoError(t, lim.Acquire(ctx, 0))

	// A second interval of hinted refusals lowers it further.
	clock.Advance(time.Second)
	require.NoError(t, lim.Report(ctx, throttle.Answer{Refused: true, Retry: true, RetryAfter: time.Second}))
	s, err = lim.Key("").AdaptiveState(ctx)
	require.NoError(t, err)
	assert.InDelta(t, 6.3, s.Rate, 1e-9, "refusals went on: a full decrease, 0.7 of the rate")

	s, err = lim.Key("acme").AdaptiveState(ctx)
	require.NoError(t, err)
	assert.False(t, s.Active(), "each key adapts on its own")
}

// A retry time on an answer that is not a refusal (a success with nothing
// remaining until the reset) pauses the bucket and says nothing about the
// rate.
func TestReportRetryWithoutRefusalOnlyPauses(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	b := &pausing{Local: newLocal(t, clock, 10, time.Second)}
	lim := throttle.New(b, throttle.WithClock(clock))

	require.NoError(t, lim.Report(ctx, throttle.Answer{Retry: true, RetryAfter: 3 * time.Second}))
	assert.Equal(t, []time.Duration{3 * time.Second}, b.pauses)
	s, err := lim.Key("").AdaptiveState(ctx)
	require.NoError(t, err)
	assert.False(t, s.Active(), "a success with nothing remaining is not a refusal")
}

func TestReportAdvertisedLimit(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newLocal(t, clock, 100, time.Second), throttle.WithClock(clock))
	// 300 per minute is 5 per second.
	require.NoError(t, lim.Report(ctx, throttle.Answer{Limit: 300, Window: time.Minute}))
	s, err := lim.Key("").AdaptiveState(ctx)
	require.NoError(t, err)
	assert.InDelta(t, 5, s.Ceiling, 1e-9)
	assert.InDelta(t, 5, s.Rate, 1e-9)
}

func TestReportWithoutKnownLimit(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(&gate{clock: clock}, throttle.WithClock(clock))
	require.NoError(t, lim.Report(context.Background(), throttle.Answer{Refused: true}), "a bucket that does not say its limit cannot adapt: nothing happens")
	require.NoError(t, lim.Acquire(context.Background(), 0))
	var zero throttle.Keyed
	require.ErrorIs(t, zero.Report(context.Background(), throttle.Answer{}), throttle.ErrInvalid)
}

func TestAnswerError(t *testing.T) {
	base := errors.New("HTTP 429")
	err := &throttle.AnswerError{Answer: throttle.Answer{Refused: true}, Err: base}
	wrapped := errors.Join(errors.New("handler"), err)
	var ae *throttle.AnswerError
	require.ErrorAs(t, wrapped, &ae)
	assert.True(t, ae.Answer.Refused)
	assert.ErrorIs(t, wrapped, base)
	assert.Contains(t, err.Error(), "refused the call")
	assert.False(t, errors.As(base, &ae))
}

// countingTakes is a Local bucket that counts its Takes; it cannot
// pause.
type countingTakes struct {
	*throttle.Local
	takes atomic.Int64
}

func (b *countingTakes) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	b.takes.Add(1)
	return b.Local.Take(ctx, key, n, maxWait)
}

// TestAReportedPauseHoldsTheKeysCallersWhenTheBucketCannotPause: a retry
// time reported for a key holds this Limiter's callers of it until then,
// though the bucket cannot pause (or its pause failed): a caller whose
// wait ends first is refused at once, and one waiting for its permit's
// time gives it back and waits for the pause's end, asking the bucket
// once more then, not over and over.
func TestAReportedPauseHoldsTheKeysCallersWhenTheBucketCannotPause(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &countingTakes{Local: newLocal(t, clock, 1, time.Second)}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	// The test's bound, on the real clock; the waits are on the fake one.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bg := context.Background()
	require.NoError(t, lim.Acquire(bg, 0))
	returned := acquireTimed(t, lim, clock, 20*time.Second, "the waiting caller")
	require.NoError(t, clock.BlockUntilContext(ctx, 1), "the caller sleeps until its permit's time, a second away")

	require.NoError(t, lim.Report(bg, throttle.Answer{Retry: true, RetryAfter: 10 * time.Second}))
	require.ErrorIs(t, lim.Acquire(bg, 500*time.Millisecond), throttle.ErrTimeout, "a wait that ends in the pause")
	require.Equal(t, int64(2), b.takes.Load(), "refused without asking the bucket")

	clock.Advance(time.Second) // the waiting caller's time, in the pause
	heldAtTheGate(ctx, t, clock, returned)
	assert.Equal(t, int64(2), b.takes.Load(), "the waiting caller did not ask again in the pause")

	clock.Advance(9 * time.Second)
	returnsAtThePausesEnd(ctx, t, returned, 10*time.Second)
	assert.Equal(t, int64(3), b.takes.Load(), "one ask after the pause")
}

// answeredLater is a bucket whose Takes wait for the test's answer.
type answeredLater struct {
	asked   chan struct{}
	answers chan throttle.Decision
}

func (b *answeredLater) Take(ctx context.Context, _ string, _ int64, _ time.Duration) (throttle.Decision, error) {
	b.asked <- struct{}{}
	select {
	case d := <-b.answers:
		return d, nil
	case <-ctx.Done():
		return throttle.Decision{}, ctx.Err()
	}
}

// TestARefusalAnsweredInAPauseDoesNotShortenIt: a refusal that closes the
// key's gate for less than a pause reported meanwhile (a bucket that did
// not pause) leaves it closed until the pause's end: its caller, whose
// wait ends before, is turned away without asking again.
func TestARefusalAnsweredInAPauseDoesNotShortenIt(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &answeredLater{asked: make(chan struct{}, 2), answers: make(chan throttle.Decision, 2)}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	bg := context.Background()
	done := make(chan error, 1)
	go func() { done <- lim.Acquire(bg, 5*time.Second) }()
	<-b.asked
	require.NoError(t, lim.Report(bg, throttle.Answer{Retry: true, RetryAfter: 10 * time.Second}))
	b.answers <- throttle.Decision{Delay: 100 * time.Millisecond}
	select {
	case err := <-done:
		require.ErrorIs(t, err, throttle.ErrTimeout)
	case <-time.After(5 * time.Second):
		t.Fatal("the caller did not return: the refusal's 100 ms reopened the gate in the pause")
	}
	assert.Len(t, b.asked, 0, "the bucket was not asked again")
}

// TestACallerAsleepForItsPacedSlotIsHeldByAPauseReportedMeanwhile: a
// caller asleep for its slot of the adaptive pace when a retry time is
// reported waits for the pause's end, though the bucket cannot pause.
func TestACallerAsleepForItsPacedSlotIsHeldByAPauseReportedMeanwhile(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &countingTakes{Local: newLocal(t, clock, 10, time.Second)}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // the test's bound, real time
	defer cancel()
	bg := context.Background()
	require.NoError(t, lim.Report(bg, throttle.Answer{Refused: true})) // paced at 9 per second
	require.NoError(t, lim.Acquire(bg, 0))                             // the slot now
	returned := acquireTimed(t, lim, clock, 30*time.Second, "the paced caller")
	require.NoError(t, clock.BlockUntilContext(ctx, 1), "asleep until its slot, 1/9 s away")
	require.NoError(t, lim.Report(bg, throttle.Answer{Retry: true, RetryAfter: 10 * time.Second}))
	takes := b.takes.Load()

	clock.Advance(time.Second / 9)
	heldAtTheGate(ctx, t, clock, returned)
	assert.Equal(t, takes, b.takes.Load(), "it did not ask the bucket in the pause")
	clock.Advance(10 * time.Second)
	returnsAtThePausesEnd(ctx, t, returned, 10*time.Second)
}

// acquireTimed runs lim.Acquire(maxWait) in the background, and sends
// when it returned, on clock from now (who: the caller, for a failure).
func acquireTimed(t *testing.T, lim *throttle.Limiter, clock *clockwork.FakeClock, maxWait time.Duration, who string) <-chan time.Duration {
	start := clock.Now()
	returned := make(chan time.Duration, 1)
	go func() {
		assert.NoError(t, lim.Acquire(context.Background(), maxWait), who)
		returned <- clock.Since(start)
	}()
	return returned
}

// heldAtTheGate fails t if the caller of returned returns before it waits
// at its key's gate (two sleepers: its deadline's timer and the gate's).
func heldAtTheGate(ctx context.Context, t *testing.T, clock *clockwork.FakeClock, returned <-chan time.Duration) {
	t.Helper()
	blocked := make(chan error, 1)
	go func() { blocked <- clock.BlockUntilContext(ctx, 2) }()
	select {
	case at := <-returned:
		t.Fatalf("the caller returned at +%v, in the pause", at)
	case err := <-blocked:
		require.NoError(t, err, "the caller waits at the key's gate")
	}
}

// returnsAtThePausesEnd fails t unless the caller of returned returns,
// at end at the earliest.
func returnsAtThePausesEnd(ctx context.Context, t *testing.T, returned <-chan time.Duration, end time.Duration) {
	t.Helper()
	select {
	case at := <-returned:
		assert.GreaterOrEqual(t, at, end, "the caller returns at the pause's end")
	case <-ctx.Done():
		t.Fatal("the caller did not return after the pause")
	}
}

// TestPermitsHeldWhenAPauseIsReportedAreGivenUp: permits a context holds
// (a consumer's attempt's) that are asked for in a pause reported since
// are given up, as Forfeit does: the caller waits for the pause's end and
// takes its own.
func TestPermitsHeldWhenAPauseIsReportedAreGivenUp(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &countingTakes{Local: newLocal(t, clock, 10, time.Second)}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	require.NoError(t, lim.Acquire(ctx, 0))
	held := lim.Key("").ContextWithPermit(ctx, 1)
	require.NoError(t, lim.Report(ctx, throttle.Answer{Retry: true, RetryAfter: 10 * time.Second}))
	require.ErrorIs(t, lim.Acquire(held, 0), throttle.ErrTimeout, "the held permit is not used in the pause")
	assert.Equal(t, int64(1), lim.Key("").Forfeit(held), "given up, never used")
	clock.Advance(10 * time.Second)
	require.NoError(t, lim.Acquire(held, 0))
	assert.Equal(t, int64(2), b.takes.Load(), "after the pause, the caller took a permit of its own")
}
