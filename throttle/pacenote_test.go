package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/internal/pacenote"
	"github.com/headway-go/headway/throttle"
)

// A wait that waits for the bucket's pace tells the PaceNote its context
// carries (the consumer's fairness scheduler keeps one permit request
// outstanding while the Limiter paces, more only while grants come at
// once); a grant that comes at once does not. Paced: a grant's time slept
// out, a refusal's retry time.
func TestAcquireTellsThePaceNoteWhetherItWaitedForThePace(t *testing.T) {
	acquire := func(t *testing.T, clock *clockwork.FakeClock, lim *throttle.Limiter, advance time.Duration) bool {
		t.Helper()
		var note pacenote.Note
		ctx := pacenote.With(context.Background(), &note)
		done := make(chan error, 1)
		go func() { done <- lim.Acquire(ctx, 2*time.Second) }()
		if advance > 0 {
			bctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, clock.BlockUntilContext(bctx, 1), "the wait sleeps on the clock")
			clock.Advance(advance)
		}
		require.NoError(t, <-done)
		return note.Paced()
	}
	t.Run("reservation", func(t *testing.T) {
		clock := clockwork.NewFakeClock()
		loc, err := throttle.NewLocal(1, 100*time.Millisecond, throttle.WithClock(clock))
		require.NoError(t, err)
		lim := throttle.New(loc, throttle.WithClock(clock))
		defer lim.Close()
		assert.False(t, acquire(t, clock, lim, 0), "a full bucket grants at once")
		assert.True(t, acquire(t, clock, lim, 100*time.Millisecond), "the next slot is 100 ms on")
	})
	t.Run("refusal", func(t *testing.T) {
		clock := clockwork.NewFakeClock()
		b := &placingBucket{clock: clock, decisions: []throttle.Decision{{Granted: true}, {Delay: 100 * time.Millisecond}, {Granted: true}}}
		lim := throttle.New(b, throttle.WithClock(clock))
		defer lim.Close()
		assert.False(t, acquire(t, clock, lim, 0))
		assert.True(t, acquire(t, clock, lim, 100*time.Millisecond), "refused for 100 ms")
	})
}
