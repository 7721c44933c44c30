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

// TestLeasedPermitsOfAMarginBucketTellTheirUseBy: a lease of a bucket
// whose permits have a margin (a TokenBucket) lives that margin; a permit
// handed over from it, to the refilling caller or from memory, tells the
// PaceNote until when it may be used, as a permit taken alone does, so
// that a holder (the consumer's scheduler waiting for a worker, a
// handler's held permit) does not send it after the batch's margin.
// Before, leased permits told nothing: held, they were sent however late.
func TestLeasedPermitsOfAMarginBucketTellTheirUseBy(t *testing.T) {
	clock := clockwork.NewFakeClock()
	const margin = 10 * time.Millisecond
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{{Granted: true, Margin: margin, Limit: 100, Remaining: 50, Reset: time.Second}}}
	lim := throttle.New(b, throttle.WithClock(clock), throttle.WithLeasing(throttle.Leasing{}))
	defer lim.Close()
	acquire := func(what string) time.Time {
		t.Helper()
		var note pacenote.Note
		ctx := pacenote.With(context.Background(), &note)
		require.NoError(t, lim.Acquire(ctx, time.Second), what)
		return note.UseBy()
	}
	// The first refill fetches the caller's permit alone; the next ones
	// grow with the demand measured.
	for i := range 6 {
		useBy := acquire("a permit of the lease")
		require.Falsef(t, useBy.IsZero(), "permit %d: no use-by, though its batch lives only its margin", i)
		assert.Falsef(t, useBy.After(clock.Now().Add(margin)), "permit %d: usable until %v, beyond its batch's margin", i, useBy.Sub(clock.Now()))
		clock.Advance(time.Millisecond)
	}
	takes, _ := b.counts()
	assert.Less(t, takes, 6, "some permits came from memory")
}
