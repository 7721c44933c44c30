package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
)

// At first contact, callers whose wait is too short to be placed in the
// period take the first period's permits as they arrive (a trickle); the
// next period's crowd then goes no sooner than an interval after the
// grant a limit before it, so that no window of one interval holds more
// than the limit. Before, the crowd went at once at the period's start,
// in one window with the trickle: 7 grants in [100 ms, 1.1 s) for a limit
// of 4, refused by a provider counting a sliding window.
func TestShortWaitsAfterATrickleKeepASlidingWindowWithinTheLimit(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newOnDemandBucket(clock, 4, time.Second), throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	const maxWait = 500 * time.Millisecond // below the interval: not placed in the period
	for range 4 {                          // the first period's permits, as they arrive
		require.NoError(t, lim.Acquire(ctx, maxWait))
		clock.Advance(100 * time.Millisecond)
	}
	clock.Advance(600 * time.Millisecond) // the period's end: a crowd of 4
	done := acquireAll(ctx, lim.Key(""), 4, maxWait)
	receive(t, clock, done, 1, 3) // one interval after the first grant
	for i := 2; i >= 0; i-- {
		clock.Advance(100 * time.Millisecond)
		receive(t, clock, done, 1, i) // then one interval after each of the others
	}
}

// A caller whose slot in the sliding view lies beyond its wait is refused
// before it asks the bucket: nothing is taken, and a caller that can wait
// gets the permit.
func TestAShortWaitWhoseSlotIsBeyondItIsRefusedWithoutTakingAPermit(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := newOnDemandBucket(clock, 4, time.Second)
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	for range 4 {
		require.NoError(t, lim.Acquire(ctx, 500*time.Millisecond))
		clock.Advance(100 * time.Millisecond)
	}
	clock.Advance(600 * time.Millisecond)
	require.NoError(t, lim.Acquire(ctx, 500*time.Millisecond), "its slot is now")
	// The next slot is 100 ms on.
	err := lim.Acquire(ctx, 50*time.Millisecond)
	require.ErrorIs(t, err, throttle.ErrTimeout)
	b.mu.Lock()
	left := b.left
	b.mu.Unlock()
	assert.Equal(t, int64(3), left, "the refused caller took nothing")
	done := acquireAll(ctx, lim.Key(""), 1, 500*time.Millisecond)
	receive(t, clock, done, 0, 1)
	clock.Advance(100 * time.Millisecond)
	receive(t, clock, done, 1, 0)
}

// A caller placed in the period whose place lies beyond what is left of
// its wait (the gate took the rest) gives its permit back and fails
// instead of going at once: sent then, its call would land in the
// previous period's window.
func TestAPlacedCallerWhosePlaceIsBeyondItsWaitDoesNotGoAtOnce(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := newOnDemandBucket(clock, 10, time.Second)
	other := throttle.New(b, throttle.WithClock(clock)) // another instance
	defer other.Close()
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	for range 10 {
		require.NoError(t, other.Acquire(ctx, 0))
	}
	clock.Advance(500 * time.Millisecond)
	done := acquireAll(ctx, lim.Key(""), 1, time.Second) // refused: it waits for the next period
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(500 * time.Millisecond) // the next period: the other instance takes 9 at once
	for range 9 {
		require.NoError(t, other.Acquire(ctx, 0))
	}
	clock.Advance(10 * time.Millisecond) // the caller asks: its place is 855 ms on, 490 ms of its wait left
	select {
	case err := <-done:
		require.ErrorIs(t, err, throttle.ErrTimeout)
	case <-time.After(5 * time.Second):
		t.Fatal("the caller did not return")
	}
	assert.Equal(t, int64(1), b.refunds(), "its permit was given back")
}
