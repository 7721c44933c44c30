package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Regression tests for breaches of the Bucket contract that the
// conformance suite (package throttle/buckettest) found in Local and
// Smooth.

// TestLocalEndedContextTakesNothing: a Take whose context has ended
// returns the context's error and takes nothing; it once granted, and with
// a wait reserved a slot, for a caller that had gone.
func TestLocalEndedContextTakesNothing(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b, err := NewLocal(2, time.Second, WithClock(clock))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, mw := range []time.Duration{0, Forever} {
		d, err := b.Take(ctx, "k", 2, mw)
		require.ErrorIs(t, err, context.Canceled)
		assert.False(t, d.Granted)
	}
	d, err := b.Take(context.Background(), "k", 2, 0)
	require.NoError(t, err)
	assert.True(t, d.Granted, "the ended takes charged nothing")
}

// TestLocalRemainingNeverAboveLimit: with a burst above the limit,
// Decision.Remaining is capped at Limit (it once reported 29 left of a
// limit of 10, for rate-limit headers).
func TestLocalRemainingNeverAboveLimit(t *testing.T) {
	b, err := NewLocal(10, time.Second, WithClock(clockwork.NewFakeClock()), WithLocalBurst(30))
	require.NoError(t, err)
	for range 25 {
		d, err := b.Take(context.Background(), "", 1, 0)
		require.NoError(t, err)
		require.True(t, d.Granted)
		require.LessOrEqual(t, d.Remaining, d.Limit)
	}
	d, err := b.Take(context.Background(), "", 1, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(4), d.Remaining, "below the limit, Remaining is exact")
}

func newSmoothOverLocal(t *testing.T, clock clockwork.Clock) *Smooth {
	t.Helper()
	inner, err := NewLocal(10, time.Second, WithClock(clock))
	require.NoError(t, err)
	s, err := NewSmooth(inner, 10, time.Second, WithClock(clock)) // 100 ms apart
	require.NoError(t, err)
	return s
}

// TestSmoothEndedContextTakesNothing: on a key whose slot has not come, a
// Take whose context has ended returns the context's error; it once
// refused with the time to the slot, as if the caller could still wait.
func TestSmoothEndedContextTakesNothing(t *testing.T) {
	s := newSmoothOverLocal(t, clockwork.NewFakeClock())
	d, err := s.Take(context.Background(), "", 1, 0)
	require.NoError(t, err)
	require.True(t, d.Granted)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = s.Take(ctx, "", 1, Forever)
	require.ErrorIs(t, err, context.Canceled)
}

// TestSmoothTooManyFailsAtOnce: n above the limit fails with
// ErrExceedsLimit at once even when the key's slot has not come; it once
// refused with the time to the slot, so a Limiter slept only to be told
// then that n could never be granted.
func TestSmoothTooManyFailsAtOnce(t *testing.T) {
	s := newSmoothOverLocal(t, clockwork.NewFakeClock())
	d, err := s.Take(context.Background(), "", 10, 0)
	require.NoError(t, err)
	require.True(t, d.Granted)
	_, err = s.Take(context.Background(), "", 11, Forever)
	require.ErrorIs(t, err, ErrExceedsLimit)
}

// TestSmoothLateRefundsKeepThePace: permits granted long ago and handed
// back late, one between each two takes, do not let more than one permit
// through at one instant: Refund cannot tell them from the permit granted
// just before, so it gives no slot back (it once moved the pace back one
// slot per refund, and three late refunds let four permits through at
// once, against Smooth's 1.5 + limit·t/interval).
func TestSmoothLateRefundsKeepThePace(t *testing.T) {
	clock := clockwork.NewFakeClock()
	s := newSmoothOverLocal(t, clock)
	ctx := context.Background()
	for range 3 { // three permits, one per slot, never used
		d, err := s.Take(ctx, "", 1, 0)
		require.NoError(t, err)
		require.True(t, d.Granted)
		clock.Advance(100 * time.Millisecond)
	}
	clock.Advance(time.Second)
	granted := 0
	take := func() {
		d, err := s.Take(ctx, "", 1, 0)
		require.NoError(t, err)
		if d.Granted {
			granted++
		}
	}
	take()
	for range 3 {
		require.NoError(t, s.refund(ctx, "", 1))
		take()
	}
	require.Equal(t, 1, granted, "permits granted at one instant after late refunds")
}
