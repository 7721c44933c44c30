package throttle_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
)

// countingBucket counts the Take calls it passes to its inner bucket.
type countingBucket struct {
	throttle.Bucket
	takes atomic.Int64
}

func (c *countingBucket) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	c.takes.Add(n)
	return c.Bucket.Take(ctx, key, n, maxWait)
}

func TestHeldPermitIsUsedOnceBySameBudget(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &countingBucket{Bucket: newLocal(t, clock, 100, time.Second)}
	lim := throttle.New(b, throttle.WithClock(clock))
	ctx := context.Background()

	require.NoError(t, lim.Acquire(ctx, 0))
	hctx := lim.Key("").ContextWithPermit(ctx, 1)
	require.NoError(t, lim.Acquire(hctx, 0), "the held permit")
	assert.EqualValues(t, 1, b.takes.Load(), "the held permit costs no bucket call")
	require.NoError(t, lim.Acquire(hctx, 0), "the second call of the same work")
	assert.EqualValues(t, 2, b.takes.Load(), "a held permit is used once")
}

func TestHeldPermitIsNotUsedByAnotherBudget(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &countingBucket{Bucket: newLocal(t, clock, 100, time.Second)}
	lim := throttle.New(b, throttle.WithClock(clock))
	other := throttle.New(newLocal(t, clock, 100, time.Second), throttle.WithClock(clock))
	hctx := lim.Key("tenant-a").ContextWithPermit(context.Background(), 1)

	require.NoError(t, lim.Key("tenant-b").Acquire(hctx, 0))
	require.NoError(t, lim.Acquire(hctx, 0))
	require.NoError(t, other.Key("tenant-a").Acquire(hctx, 0))
	assert.EqualValues(t, 2, b.takes.Load(), "other keys of the same Limiter take their own permits")
	require.NoError(t, lim.Key("tenant-a").AcquireN(hctx, 2, 0))
	assert.EqualValues(t, 4, b.takes.Load(), "AcquireN above the permits held takes its own")
	require.NoError(t, lim.Key("tenant-a").Acquire(hctx, 0))
	assert.EqualValues(t, 4, b.takes.Load(), "the held permit is still there for a call that fits")
}

func TestHeldPermitIsSharedByLimitersOverOneBucket(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &countingBucket{Bucket: newLocal(t, clock, 100, time.Second)}
	consumerLim := throttle.New(b, throttle.WithClock(clock))
	clientLim := throttle.New(b, throttle.WithClock(clock))
	hctx := consumerLim.Key("k").ContextWithPermit(context.Background(), 1)
	require.NoError(t, clientLim.Key("k").Acquire(hctx, 0))
	assert.Zero(t, b.takes.Load(), "two Limiters over one bucket share its budgets")
}

func TestHeldPermitsOfSeveralBudgetsNest(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &countingBucket{Bucket: newLocal(t, clock, 100, time.Second)}
	lim := throttle.New(b, throttle.WithClock(clock))
	ctx := lim.Key("a").ContextWithPermit(context.Background(), 1)
	ctx = lim.Key("b").ContextWithPermit(ctx, 1)
	require.NoError(t, lim.Key("a").Acquire(ctx, 0))
	require.NoError(t, lim.Key("b").Acquire(ctx, 0))
	assert.Zero(t, b.takes.Load(), "each budget finds its own held permit")
}

func TestHeldPermitIsUsedAtMostOnceAcrossGoroutines(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &countingBucket{Bucket: newLocal(t, clock, 1000, time.Second)}
	lim := throttle.New(b, throttle.WithClock(clock))
	hctx := lim.Key("").ContextWithPermit(context.Background(), 3)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() { assert.NoError(t, lim.Acquire(hctx, 0)) })
	}
	wg.Wait()
	assert.EqualValues(t, 47, b.takes.Load(), "3 held permits serve 3 of 50 calls")
}

func TestHeldPermitDoesNotOutliveTheContext(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newLocal(t, clock, 1, time.Second), throttle.WithClock(clock))
	ctx, cancel := context.WithCancel(context.Background())
	hctx := lim.Key("").ContextWithPermit(ctx, 1)
	cancel()
	require.ErrorIs(t, lim.Acquire(hctx, 0), context.Canceled, "an ended context ends the call, held permit or not")
	assert.Equal(t, context.Background(), throttle.Keyed{}.ContextWithPermit(context.Background(), 1), "a zero Keyed holds nothing")
	assert.Equal(t, context.Background(), lim.Key("").ContextWithPermit(context.Background(), 0), "n < 1 holds nothing")
}

func TestForfeitedPermitIsNotUsed(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &countingBucket{Bucket: newLocal(t, clock, 100, time.Second)}
	lim := throttle.New(b, throttle.WithClock(clock))
	other := throttle.New(b, throttle.WithClock(clock))
	ctx := lim.Key("a").ContextWithPermit(context.Background(), 2)
	ctx = lim.Key("b").ContextWithPermit(ctx, 1)

	assert.Zero(t, lim.Key("c").Forfeit(ctx), "another key holds nothing here")
	assert.EqualValues(t, 2, other.Key("a").Forfeit(ctx), "a Limiter over the same bucket gives up the budget's permits")
	assert.EqualValues(t, 2, lim.Key("a").Forfeit(ctx), "given up once: asked again, the same 2 never used")
	require.NoError(t, lim.Key("a").Acquire(ctx, 0))
	assert.EqualValues(t, 1, b.takes.Load(), "a forfeited permit is not used: the call takes its own")
	require.NoError(t, lim.Key("b").Acquire(ctx, 0)) // the held one
	assert.Zero(t, lim.Key("b").Forfeit(ctx), "a permit used is not counted as never used")
	ctx = lim.Key("b").ContextWithPermit(ctx, 1)
	require.NoError(t, lim.Key("b").Acquire(ctx, 0))
	assert.EqualValues(t, 1, b.takes.Load(), "the other budget's held permit is still there")
	assert.Zero(t, throttle.Keyed{}.Forfeit(ctx), "a zero Keyed gives up nothing")
}

// A consumer handler's context carries the permit the consumer acquired
// for the attempt: a client built on the same Limiter uses it, so the
// call is charged once.
func ExampleKeyed_ContextWithPermit() {
	b, _ := throttle.NewLocal(2, time.Minute)
	lim := throttle.New(b)
	ctx := context.Background()

	_ = lim.Acquire(ctx, 0) // the consumer's permit for this attempt
	handlerCtx := lim.Key("").ContextWithPermit(ctx, 1)

	fmt.Println(lim.Acquire(handlerCtx, 0)) // the client's: the held permit
	fmt.Println(lim.Acquire(ctx, 0))        // another call: the second permit
	fmt.Println(lim.Acquire(ctx, 0) != nil) // and the bucket is spent
	// Output:
	// <nil>
	// <nil>
	// true
}

// funcBucket is a Bucket that is a func: its values cannot be compared.
type funcBucket func(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error)

func (f funcBucket) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	return f(ctx, key, n, maxWait)
}

// valueWrap is a wrapper passed by value: a comparable type whose values
// may hold an uncomparable bucket.
type valueWrap struct{ throttle.Bucket }

func TestHeldPermitOfALimiterOverAnUncomparableBucketIsCheckedWithoutPanic(t *testing.T) {
	var takes atomic.Int64
	fb := funcBucket(func(context.Context, string, int64, time.Duration) (throttle.Decision, error) {
		takes.Add(1)
		return throttle.Decision{Granted: true}, nil
	})
	consumerLim := throttle.New(valueWrap{fb})
	clientLim := throttle.New(valueWrap{fb})
	hctx := consumerLim.Key("k").ContextWithPermit(context.Background(), 1)
	assert.NotPanics(t, func() {
		assert.NoError(t, clientLim.Key("k").Acquire(hctx, 0))
		assert.Zero(t, clientLim.Key("k").Forfeit(hctx), "buckets that cannot be compared are not the same")
	})
	assert.EqualValues(t, 1, takes.Load(), "a bucket that cannot be compared is not known to be the same: the call takes its own")
}

// grantObserver sums the permits an Observer is told were granted.
type grantObserver struct{ granted atomic.Int64 }

func (o *grantObserver) Acquired(_ string, n int64, _ time.Duration, err error) {
	if err == nil {
		o.granted.Add(n)
	}
}
func (o *grantObserver) BucketCall(string, throttle.Decision, time.Duration, error) {}
func (o *grantObserver) Degraded(string, string, bool, error)                       {}

func TestHeldPermitIsReportedAsGrantedOnce(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &countingBucket{Bucket: newLocal(t, clock, 100, time.Second)}
	o := &grantObserver{}
	lim := throttle.New(b, throttle.WithClock(clock), throttle.WithObserver(o))
	ctx := context.Background()

	require.NoError(t, lim.Acquire(ctx, 0), "the consumer's permit")
	require.NoError(t, lim.Acquire(lim.Key("").ContextWithPermit(ctx, 1), 0), "the client's call, on the held permit")
	assert.EqualValues(t, 1, b.takes.Load())
	assert.EqualValues(t, b.takes.Load(), o.granted.Load(), "permits reported granted: one call, one permit, as the bucket counts")
}

// Forfeit reports the innermost held permits of a budget: a call that
// used its own permit, in a context whose enclosing one held a permit of
// the same budget given up earlier, has none unused.
func TestForfeitCountsOnlyTheInnermostPermits(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newLocal(t, clock, 100, time.Second), throttle.WithClock(clock))
	outer := lim.Key("a").ContextWithPermit(context.Background(), 1)
	assert.EqualValues(t, 1, lim.Key("a").Forfeit(outer), "the outer permit, never used")
	inner := lim.Key("a").ContextWithPermit(outer, 1)
	require.NoError(t, lim.Key("a").Acquire(inner, 0)) // the inner permit
	assert.Zero(t, lim.Key("a").Forfeit(inner), "the inner permit was used; the outer one is not counted again")
}
