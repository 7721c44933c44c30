package throttle_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/internal/waitstop"
	"github.com/headway-go/headway/throttle"
)

var errPartitionGone = errors.New("partition gone")

func TestWaitStopEndsAPermitWaitButNotTheContext(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newLocal(t, clock, 1, time.Hour), throttle.WithClock(clock))
	require.NoError(t, lim.Acquire(context.Background(), 0), "the period's only permit")

	stop, end := context.WithCancelCause(context.Background())
	ctx := throttle.ContextWithWaitStop(context.Background(), stop)
	done := make(chan error, 1)
	go func() { done <- lim.Acquire(ctx, 2*time.Hour) }()
	require.NoError(t, clock.BlockUntilContext(context.Background(), 1), "the caller sleeps for the next period")

	end(errPartitionGone)
	err := <-done
	require.Error(t, err)
	assert.ErrorIs(t, err, context.Canceled)
	assert.ErrorIs(t, err, errPartitionGone, "the error names the stop's cause")
	assert.NoError(t, ctx.Err(), "the work's own context goes on")

	err = lim.Acquire(ctx, 2*time.Hour)
	assert.ErrorIs(t, err, errPartitionGone, "a wait that starts after the stop ends at once")
}

func TestWaitStopLeavesPermitsThatNeedNoWait(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newLocal(t, clock, 2, time.Hour), throttle.WithClock(clock))
	stop, end := context.WithCancel(context.Background())
	end()
	ctx := throttle.ContextWithWaitStop(context.Background(), stop)

	held := lim.Key("").ContextWithPermit(ctx, 1)
	assert.NoError(t, lim.Acquire(held, time.Minute), "a permit the caller holds needs no wait")
	assert.ErrorIs(t, lim.Acquire(ctx, time.Minute), context.Canceled, "a new permit is a wait, stopped")
}

func TestWaitStopsNestAndEitherEndsTheWait(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newLocal(t, clock, 1, time.Hour), throttle.WithClock(clock))
	require.NoError(t, lim.Acquire(context.Background(), 0))

	outer, endOuter := context.WithCancelCause(context.Background())
	inner, endInner := context.WithCancel(context.Background())
	defer endInner()
	ctx := throttle.ContextWithWaitStop(throttle.ContextWithWaitStop(context.Background(), outer), inner)
	done := make(chan error, 1)
	go func() { done <- lim.Acquire(ctx, 2*time.Hour) }()
	require.NoError(t, clock.BlockUntilContext(context.Background(), 1))
	endOuter(errPartitionGone)
	assert.ErrorIs(t, <-done, errPartitionGone, "the outer stop ends a wait under an inner one")
}

func TestWaitContextWithoutAStopIsTheContext(t *testing.T) {
	ctx := context.WithValue(context.Background(), struct{}{}, 1)
	wctx, cancel := waitstop.Context(ctx)
	cancel()
	assert.Equal(t, ctx, wctx, "no stop: no derived context")
	assert.Equal(t, ctx, throttle.ContextWithWaitStop(ctx, nil), "a nil stop changes nothing")
}

// inFlightBucket is a store whose Take is on its way until its context
// ends (a round trip to a remote store), as a network client's would:
// it reports the call it is in and returns the context's error.
type inFlightBucket struct{ asked chan struct{} }

func (b *inFlightBucket) Take(ctx context.Context, _ string, _ int64, _ time.Duration) (throttle.Decision, error) {
	b.asked <- struct{}{}
	<-ctx.Done()
	return throttle.Decision{}, ctx.Err()
}

// A stop that ends a wait while the bucket is being asked names its
// cause too, as one ending a sleep does: the caller learns that its
// waits were stopped, not only that a context ended.
func TestWaitStopDuringABucketCallNamesTheStopsCause(t *testing.T) {
	b := &inFlightBucket{asked: make(chan struct{}, 1)}
	lim := throttle.New(b)
	defer lim.Close()
	stop, end := context.WithCancelCause(context.Background())
	ctx := throttle.ContextWithWaitStop(context.Background(), stop)
	done := make(chan error, 1)
	go func() { done <- lim.Acquire(ctx, throttle.Forever) }()
	<-b.asked
	end(errPartitionGone)
	err := <-done
	require.Error(t, err)
	assert.ErrorIs(t, err, context.Canceled)
	assert.ErrorIs(t, err, errPartitionGone, "the error names the stop's cause")
	assert.NoError(t, ctx.Err())
}

// ContextWithWaitStop names the wait for a concurrency slot (Slots.Hold)
// among those it stops: a Hold under a stopped context does not wait for
// a slot.
func TestWaitStopEndsAWaitForASlot(t *testing.T) {
	slots, err := throttle.NewLocalSlots(1)
	require.NoError(t, err)
	release, err := slots.Hold(context.Background(), "k", 0)
	require.NoError(t, err, "the only slot")
	defer release()

	stop, end := context.WithCancelCause(context.Background())
	end(errPartitionGone)
	ctx := throttle.ContextWithWaitStop(context.Background(), stop)
	_, err = slots.Hold(ctx, "k", 200*time.Millisecond)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.Canceled, "a stopped wait, not one that ran its course")
	assert.ErrorIs(t, err, errPartitionGone)
}
