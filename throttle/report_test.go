package throttle_test

import (
	"context"
	"errors"
	"sync"
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

// A refusal with a retry hint pauses the bucket for the hint's time and
// also lowers the adaptive rate, as one without: a provider that refuses
// every period's burst with Retry-After is answered by pacing.
func TestReportRefusalWithHintPausesAndLowersTheRate(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	b := &pausing{Local: newLocal(t, clock, 10, time.Second)}
	lim := throttle.New(b, throttle.WithClock(clock))

	// Many callers see the same burst refused, each with the hint.
	for range 5 {
		require.NoError(t, lim.Report(ctx, throttle.Answer{Refused: true, Retry: true, RetryAfter: 2 * time.Second}))
	}
	assert.Len(t, b.pauses, 5, "every hint pauses the bucket")
	assert.Equal(t, 2*time.Second, b.pauses[0])
	s, err := lim.Key("").AdaptiveState(ctx)
	require.NoError(t, err)
	assert.InDelta(t, 9, s.Rate, 1e-9, "the refusals lower the rate, once per interval")

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
