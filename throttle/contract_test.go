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
// conformance suite (package throttle/buckettest) found in Local.

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
