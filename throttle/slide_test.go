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

// heldBucket is an onDemandBucket that takes no permits back (as a
// bucket.TokenBucket) and, once hold is set, holds each Take until hold
// is closed, telling entered first.
type heldBucket struct {
	inner   *onDemandBucket
	mu      sync.Mutex
	hold    chan struct{}
	entered chan struct{}
}

func (b *heldBucket) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	b.mu.Lock()
	hold, entered := b.hold, b.entered
	b.mu.Unlock()
	if hold != nil {
		entered <- struct{}{}
		<-hold
	}
	return b.inner.Take(ctx, key, n, maxWait)
}

func (b *heldBucket) Fallback() (int64, time.Duration, int64) { return b.inner.Fallback() }
func (b *heldBucket) Periodic() bool                          { return true }

// Callers with short waits that ask the bucket at once each count the
// slots of those still asking: a caller whose slot, after theirs, lies
// beyond its wait is refused before it takes a permit. Before, each saw
// the same free slot, all took a permit, and all but one then found
// their slot beyond their wait and failed: with a bucket that takes no
// permits back, the period's permits were spent uncalled.
func TestShortWaitsAskingAtOnceDoNotSpendPermitsOnSlotsBeyondTheirWait(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &heldBucket{inner: newOnDemandBucket(clock, 4, time.Second)}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	for range 4 { // a trickle: the next period's slots 100 ms apart
		require.NoError(t, lim.Acquire(ctx, 500*time.Millisecond))
		clock.Advance(100 * time.Millisecond)
	}
	clock.Advance(600 * time.Millisecond)
	hold := make(chan struct{})
	b.mu.Lock()
	b.hold, b.entered = hold, make(chan struct{}, 2)
	b.mu.Unlock()
	first := acquireAll(ctx, lim.Key(""), 1, 50*time.Millisecond)
	<-b.entered // its slot is now; it is asking the bucket
	second := acquireAll(ctx, lim.Key(""), 1, 50*time.Millisecond)
	select {
	case err := <-second:
		assert.ErrorIs(t, err, throttle.ErrTimeout, "its slot, after the first's, is 100 ms on")
	case <-b.entered:
		t.Error("the second caller asked the bucket for a permit it could not use")
		close(hold)
		<-second
		hold = nil
	case <-time.After(5 * time.Second):
		t.Fatal("the second caller neither asked nor failed")
	}
	if hold != nil {
		close(hold)
	}
	require.NoError(t, <-first)
	b.inner.mu.Lock()
	left := b.inner.left
	b.inner.mu.Unlock()
	assert.Equal(t, int64(3), left, "the permits no caller used are still there")
}
