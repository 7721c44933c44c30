package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// At a period's end, a queued caller whose wait ends within the gap is let
// in, and the callers queued ahead of it go with it: else, when such
// callers come every period and take its permits, a caller queued first
// is passed over period after period. Those queued behind it wait out
// the gap.
func TestCallersQueuedAheadOfOneLetInAtAPeriodsEndGoWithIt(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Unix(1_000_000, 0))
	tb := newTimeBase(clock)
	g := &gate{tb: &tb}
	ctx := context.Background()
	enter := func(left time.Duration) chan error {
		done := make(chan error, 1)
		before := g.queued.Load()
		go func() { done <- g.enter(ctx, false, left, timeoutBound{n: 1, maxWait: left}) }()
		eventually(t, func() bool { return g.queued.Load() == before+1 }, "the caller queued")
		return done
	}
	// The period ends in 100 ms; the gap is 10 ms more.
	g.closeFor(100*time.Millisecond, 10*time.Millisecond)
	first := enter(Forever)
	hurried := enter(105 * time.Millisecond)
	behind := enter(Forever)
	clock.Advance(100 * time.Millisecond)
	require.NoError(t, <-hurried, "the caller whose wait ends in the gap, at the period's end")
	select {
	case err := <-first:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the caller queued ahead of it was passed over at the period's end")
	}
	select {
	case err := <-behind:
		t.Fatalf("the caller queued behind went before the gap's end (err %v)", err)
	default:
	}
	g.leave(false, 0, 0)
	g.leave(false, 0, 0)
	clock.Advance(10 * time.Millisecond)
	require.NoError(t, <-behind, "the caller queued behind, at the gap's end")
	g.leave(false, 0, 0)
	assert.True(t, g.idle(tb.now()))
}
