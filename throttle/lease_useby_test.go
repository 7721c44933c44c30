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

// TestLeasedBatchesArePlacedWithinTheRefillersWait: a lease of a bucket
// that places its permits asks for each batch's place within the
// refilling caller's wait, as a caller without leasing is placed, so that
// the bucket paces the batches; the batch's permits are handed over at
// that place, not before, to callers whose waits reach it, and a caller
// whose wait ends before it asks the bucket for its own place within its
// wait. A caller that leaves before the place puts its permit back for
// the next. Before, a refill took only permits free at once, and a fleet
// at its limit took its batches in bursts at the moments the bucket freed
// them.
func TestLeasedBatchesArePlacedWithinTheRefillersWait(t *testing.T) {
	clock := clockwork.NewFakeClock()
	const margin, place = 10 * time.Millisecond, 50 * time.Millisecond
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{
		{Granted: true, Margin: margin, Limit: 100, Remaining: 99, Reset: time.Second},
		{Granted: true, Delay: place, Margin: margin, Limit: 100, Reset: time.Second},
		{Delay: place, Limit: 100, Reset: time.Second},
	}}
	lim := throttle.New(b, throttle.WithClock(clock), throttle.WithLeasing(throttle.Leasing{Share: 0.01})) // batches of 2 at most
	defer lim.Close()

	require.NoError(t, lim.Acquire(context.Background(), time.Second), "the first batch: the caller's permit, free at once")
	clock.Advance(time.Millisecond)
	refiller := acquireAsync(t, clock, lim, context.Background(), time.Second)
	require.Equal(t, 2, len(b.waits))
	assert.Equal(t, time.Duration(0), b.waits[0], "no batch yet: the first refill takes what is free at once")
	assert.InDelta(t, float64(time.Second), float64(b.waits[1]), float64(time.Millisecond), "the refill asks for a place within the refiller's wait")

	short := lim.Acquire(context.Background(), place/2)
	require.ErrorIs(t, short, throttle.ErrTimeout, "the batch's place is after this caller's wait, and the bucket has none within it")
	require.Len(t, b.ns, 3, "the caller asked the bucket for its own place")
	assert.Equal(t, int64(1), b.ns[2])
	assert.InDelta(t, float64(place/2), float64(b.waits[2]), float64(time.Millisecond), "within its own wait")

	bctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	leaving, leave := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() { left <- lim.Acquire(leaving, 2*place) }()
	require.NoError(t, clock.BlockUntilContext(bctx, 2), "the refiller and a caller served from its batch sleep until its place")
	leave()
	require.ErrorIs(t, outcome(t, left), context.Canceled)
	long := make(chan error, 1)
	go func() { long <- lim.Acquire(context.Background(), 2*place) }()
	require.NoError(t, clock.BlockUntilContext(bctx, 2), "the refiller and the caller served from its batch sleep until its place")
	takes, cancelled := b.counts()
	assert.Equal(t, 3, takes, "the callers served from the batch took nothing from the bucket")
	assert.Zero(t, cancelled, "the permit of the caller that left went back into the batch")

	clock.Advance(place - time.Millisecond)
	notYet(t, refiller, "before the batch's place")
	notYet(t, long, "before the batch's place")
	clock.Advance(time.Millisecond)
	require.NoError(t, outcome(t, refiller))
	require.NoError(t, outcome(t, long))
}

// TestALeaseAtItsLimitLetsEachCallerAskForItsOwnPlace: once the bucket
// places a key's batch ahead (the fleet is at its limit), the callers the
// lease cannot serve ask the bucket each for their own permits, placed
// within their own waits, as without leasing: a batch's permits share one
// place, and at the limit that would be a burst. A permit free at once
// ends it: the next callers refill batches again.
func TestALeaseAtItsLimitLetsEachCallerAskForItsOwnPlace(t *testing.T) {
	clock := clockwork.NewFakeClock()
	const margin = 10 * time.Millisecond
	free := throttle.Decision{Granted: true, Margin: margin, Limit: 100, Remaining: 50, Reset: time.Second}
	placed := func(d time.Duration) throttle.Decision {
		p := free
		p.Delay = d
		return p
	}
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{free, placed(20 * time.Millisecond), placed(40 * time.Millisecond), free, free, free}}
	lim := throttle.New(b, throttle.WithClock(clock), throttle.WithLeasing(throttle.Leasing{}))
	defer lim.Close()
	ctx := context.Background()

	require.NoError(t, lim.Acquire(ctx, time.Second), "the first batch: the caller's own permit, free at once")
	clock.Advance(time.Millisecond)
	refiller := acquireAsync(t, clock, lim, ctx, time.Second)
	served := make(chan error, 1)
	go func() { served <- lim.Acquire(ctx, time.Second) }()
	bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, clock.BlockUntilContext(bctx, 2), "the refiller and the caller served from its batch sleep until its time")
	clock.Advance(20 * time.Millisecond)
	require.NoError(t, outcome(t, refiller))
	require.NoError(t, outcome(t, served))
	require.Len(t, b.ns, 2, "the batch placed ahead served the second caller")
	assert.Greater(t, b.ns[1], int64(1), "before the key was at its limit, the refill fetched a batch")

	clock.Advance(margin) // what the batch holds still expires
	direct := acquireAsync(t, clock, lim, ctx, time.Second)
	clock.Advance(40 * time.Millisecond)
	require.NoError(t, outcome(t, direct))
	require.Len(t, b.ns, 3)
	assert.Equal(t, int64(1), b.ns[2], "at its limit, a caller asks for its own permit alone")
	assert.InDelta(t, float64(time.Second), float64(b.waits[2]), float64(time.Millisecond), "placed within its own wait")

	require.NoError(t, lim.Acquire(ctx, 300*time.Millisecond), "a permit free at once: the key is no longer at its limit")
	require.Len(t, b.ns, 4)
	assert.InDelta(t, float64(300*time.Millisecond), float64(b.waits[3]), float64(time.Millisecond))
	clock.Advance(time.Millisecond)
	require.NoError(t, lim.Acquire(ctx, time.Second), "a refill, which starts with its own permit after a batch placed ahead")
	clock.Advance(time.Millisecond)
	require.NoError(t, lim.Acquire(ctx, time.Second), "a refill that leases again")
	require.Len(t, b.ns, 6)
	assert.Greater(t, b.ns[5], int64(1), "batches again below the limit")
}

// TestAWeightedCallerOfAPlacingLeaseTakesItsPermitsAtOneTime: a caller
// that wants several permits of a lease whose bucket places them asks for
// all of them at one time of its own, not the last batch's few left plus
// more at the next batch's time (those few would be sent past their
// margin, or dropped and asked again).
func TestAWeightedCallerOfAPlacingLeaseTakesItsPermitsAtOneTime(t *testing.T) {
	clock := clockwork.NewFakeClock()
	const margin = 10 * time.Millisecond
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{
		{Granted: true, Margin: margin, Limit: 100, Remaining: 99, Reset: time.Second},
		{Granted: true, Delay: 30 * time.Millisecond, Margin: margin, Limit: 100, Reset: time.Second},
	}}
	lim := throttle.New(b, throttle.WithClock(clock), throttle.WithLeasing(throttle.Leasing{}))
	defer lim.Close()
	require.NoError(t, lim.Acquire(context.Background(), time.Second))
	done := make(chan error, 1)
	go func() { done <- lim.AcquireN(context.Background(), 3, time.Second) }()
	bctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, clock.BlockUntilContext(bctx, 1), "the caller sleeps until its permits' time")
	clock.Advance(30 * time.Millisecond)
	require.NoError(t, outcome(t, done))
	assert.Equal(t, []int64{1, 3}, b.ns, "the three permits in one take, at one time")
}

// The answers of a placing bucket in the tests of a leased key at its
// limit: permits free at once, placed d ahead, or refused until
// atLimitNext; every permit lives atLimitMargin after its time.
const atLimitMargin, atLimitNext = 10 * time.Millisecond, 2 * time.Second

var (
	atLimitFree    = throttle.Decision{Granted: true, Margin: atLimitMargin, Limit: 100, Remaining: 50, Reset: time.Second}
	atLimitRefused = throttle.Decision{Delay: atLimitNext, Limit: 100, Reset: time.Second}
)

func atLimitPlaced(d time.Duration) throttle.Decision {
	p := atLimitFree
	p.Delay = d
	return p
}

// placedNext is atLimitPlaced(d) naming the bucket's next place, next
// after the answer (Decision.Next).
func placedNext(d, next time.Duration) throttle.Decision {
	p := atLimitPlaced(d)
	p.Next = next
	return p
}

// bringToItsLimit has a caller of lim refill its lease with a batch the
// bucket places 20 ms ahead (the next answer must be atLimitPlaced(20 ms)),
// so that the key is at its limit, and lets the rest of that batch
// expire.
func bringToItsLimit(t *testing.T, clock *clockwork.FakeClock, lim *throttle.Limiter) {
	t.Helper()
	clock.Advance(time.Millisecond)
	refiller := acquireAsync(t, clock, lim, context.Background(), time.Second)
	clock.Advance(20 * time.Millisecond)
	require.NoError(t, outcome(t, refiller), "a batch placed ahead: the key is at its limit")
	clock.Advance(atLimitMargin)
}

// leasedAtItsLimit is a leased Limiter on a placing bucket whose key
// bringToItsLimit has brought to its limit; the bucket answers then next.
func leasedAtItsLimit(t *testing.T, then ...throttle.Decision) (*clockwork.FakeClock, *placingBucket, *throttle.Limiter) {
	t.Helper()
	clock := clockwork.NewFakeClock()
	b := &placingBucket{clock: clock, decisions: append([]throttle.Decision{atLimitFree, atLimitPlaced(20 * time.Millisecond)}, then...)}
	lim := throttle.New(b, throttle.WithClock(clock), throttle.WithLeasing(throttle.Leasing{}))
	t.Cleanup(func() { lim.Close() })
	require.NoError(t, lim.Acquire(context.Background(), time.Second), "the first batch: the caller's own permit, free at once")
	bringToItsLimit(t, clock, lim)
	return clock, b, lim
}

// TestALeaseAtItsLimitRefusesFromMemoryTheWaitsThatEndBeforeItsNextPlace:
// at its limit, a leased key's refusal beyond a caller's wait names the
// bucket's next place; until then, callers whose waits end before it are
// refused without a round trip, and one whose wait reaches it asks the
// bucket at once. A permit free at once ends it.
func TestALeaseAtItsLimitRefusesFromMemoryTheWaitsThatEndBeforeItsNextPlace(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{atLimitFree, atLimitPlaced(20 * time.Millisecond), atLimitRefused, atLimitFree, atLimitPlaced(20 * time.Millisecond), atLimitPlaced(30 * time.Millisecond)}}
	lim := throttle.New(b, throttle.WithClock(clock), throttle.WithLeasing(throttle.Leasing{}))
	defer lim.Close()
	ctx := context.Background()
	takes := func() int { n, _ := b.counts(); return n }

	require.NoError(t, lim.Acquire(ctx, time.Second), "the first batch: the caller's own permit, free at once")
	bringToItsLimit(t, clock, lim)
	require.ErrorIs(t, lim.Acquire(ctx, time.Second), throttle.ErrTimeout, "the bucket's next place is after the wait")
	require.Equal(t, 3, takes())
	for i := range 5 {
		clock.Advance(10 * time.Millisecond)
		require.ErrorIsf(t, outcome(t, acquireAsync(t, clock, lim, ctx, time.Second)), throttle.ErrTimeout, "caller %d", i)
	}
	assert.Equal(t, 3, takes(), "callers whose waits end before the bucket's next place were refused from memory")

	require.NoError(t, lim.Acquire(ctx, 3*time.Second), "a wait that reaches the next place asks")
	require.Equal(t, 4, takes())
	// Its permit was free at once (others were given back): the key is
	// below its limit, and the next place named before is forgotten.
	bringToItsLimit(t, clock, lim)
	short := acquireAsync(t, clock, lim, ctx, time.Second)
	assert.Equal(t, 6, takes(), "at the limit again, a short wait asks the bucket")
	clock.Advance(30 * time.Millisecond)
	require.NoError(t, outcome(t, short))
}

// TestALeaseAtItsLimitRefusesFromMemoryOnlyWhatTheBucketWould: the next
// place a leased key at its limit remembers is one permit's: a weighted
// caller's refusal (n permits may come later than one) sets none, and a
// grant placed before the place remembered (permits were given back)
// forgets it, so that a short wait asks the bucket again.
func TestALeaseAtItsLimitRefusesFromMemoryOnlyWhatTheBucketWould(t *testing.T) {
	// asks runs a one-permit Acquire with a wait of a second, which the
	// bucket places 30 ms ahead, and reports whether it asked.
	asks := func(t *testing.T, clock *clockwork.FakeClock, lim *throttle.Limiter, b *placingBucket) bool {
		t.Helper()
		before, _ := b.counts()
		one := acquireAsync(t, clock, lim, context.Background(), time.Second)
		after, _ := b.counts()
		clock.Advance(30 * time.Millisecond)
		err := outcome(t, one)
		if after == before {
			require.ErrorIs(t, err, throttle.ErrTimeout)
			return false
		}
		require.NoError(t, err)
		return true
	}

	t.Run("weighted refusal", func(t *testing.T) {
		clock, b, lim := leasedAtItsLimit(t, atLimitRefused, atLimitPlaced(30*time.Millisecond))
		require.ErrorIs(t, lim.AcquireN(context.Background(), 3, time.Second), throttle.ErrTimeout)
		assert.True(t, asks(t, clock, lim, b), "one permit asks the bucket after three were refused")
	})
	t.Run("placed before the place remembered", func(t *testing.T) {
		clock, b, lim := leasedAtItsLimit(t, atLimitRefused, atLimitPlaced(30*time.Millisecond))
		require.ErrorIs(t, lim.Acquire(context.Background(), time.Second), throttle.ErrTimeout)
		assert.False(t, asks(t, clock, lim, b), "refused from memory")
		long := acquireAsync(t, clock, lim, context.Background(), 3*time.Second)
		clock.Advance(30 * time.Millisecond)
		require.NoError(t, outcome(t, long), "placed 30 ms ahead, long before the place remembered")
		assert.True(t, asks(t, clock, lim, b), "the place remembered is forgotten")
	})
}

// TestALeaseAtItsLimitRemembersTheNextPlaceAGrantNames: a grant at a
// leased key's limit that names the bucket's next place (Decision.Next)
// sets it as a refusal does, so that no caller asks only to learn it:
// callers whose waits end before it are refused without a round trip, one
// whose wait reaches it asks; and the next grant's place replaces it (here
// a sooner one).
func TestALeaseAtItsLimitRemembersTheNextPlaceAGrantNames(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{atLimitFree, atLimitPlaced(20 * time.Millisecond),
		placedNext(30*time.Millisecond, atLimitNext), placedNext(30*time.Millisecond, 40*time.Millisecond), atLimitPlaced(30 * time.Millisecond)}}
	lim := throttle.New(b, throttle.WithClock(clock), throttle.WithLeasing(throttle.Leasing{}))
	defer lim.Close()
	ctx := context.Background()
	takes := func() int { n, _ := b.counts(); return n }
	placed := func(wait time.Duration, what string) {
		t.Helper()
		done := acquireAsync(t, clock, lim, ctx, wait)
		clock.Advance(30 * time.Millisecond)
		require.NoError(t, outcome(t, done), what)
	}

	require.NoError(t, lim.Acquire(ctx, time.Second), "the first batch: the caller's own permit, free at once")
	bringToItsLimit(t, clock, lim)
	placed(3*time.Second, "placed 30 ms ahead; the next place 2 s after the answer")
	require.Equal(t, 3, takes())
	for i := range 3 {
		clock.Advance(10 * time.Millisecond)
		require.ErrorIsf(t, outcome(t, acquireAsync(t, clock, lim, ctx, time.Second)), throttle.ErrTimeout, "caller %d", i)
	}
	assert.Equal(t, 3, takes(), "callers whose waits end before the next place the grant named were refused from memory")

	placed(3*time.Second, "a wait that reaches the next place asks; placed 30 ms ahead, the next place 40 ms after")
	require.Equal(t, 4, takes())
	placed(time.Second, "the next place the last grant named is within a second's wait: it asks")
	assert.Equal(t, 5, takes())
}

// TestALeaseAtItsLimitForgetsTheNextPlaceWhenAPermitIsFreeSooner: the
// next place a grant named is forgotten when a grant of the key is given
// back (its place is free again), and when a bucket whose grants name
// their next place grants one naming none (a permit is free now, though
// this one was paced later): a short wait then asks the bucket.
func TestALeaseAtItsLimitForgetsTheNextPlaceWhenAPermitIsFreeSooner(t *testing.T) {
	// asksWithin runs a one-permit Acquire with wait, which the bucket
	// places 30 ms ahead, and requires that it asked the bucket.
	asksWithin := func(t *testing.T, clock *clockwork.FakeClock, lim *throttle.Limiter, b *placingBucket, wait time.Duration) {
		t.Helper()
		before, _ := b.counts()
		done := acquireAsync(t, clock, lim, context.Background(), wait)
		after, _ := b.counts()
		require.Equal(t, before+1, after, "a wait ending before the place once named asks the bucket")
		clock.Advance(30 * time.Millisecond)
		require.NoError(t, outcome(t, done))
	}

	t.Run("given back", func(t *testing.T) {
		clock, b, lim := leasedAtItsLimit(t, placedNext(30*time.Millisecond, atLimitNext), atLimitPlaced(30*time.Millisecond))
		ctx, cancel := context.WithCancel(context.Background())
		left := acquireAsync(t, clock, lim, ctx, 3*time.Second)
		cancel()
		require.ErrorIs(t, outcome(t, left), context.Canceled) // its grant given back (on its way to the bucket)
		asksWithin(t, clock, lim, b, time.Second)
	})
	t.Run("a grant naming none", func(t *testing.T) {
		clock, b, lim := leasedAtItsLimit(t, placedNext(30*time.Millisecond, time.Second), atLimitPlaced(1500*time.Millisecond), atLimitPlaced(30*time.Millisecond))
		first := acquireAsync(t, clock, lim, context.Background(), 3*time.Second)
		clock.Advance(30 * time.Millisecond)
		require.NoError(t, outcome(t, first), "placed 30 ms ahead, the next place a second after")
		long := acquireAsync(t, clock, lim, context.Background(), 3*time.Second) // placed 1.5 s ahead, naming none
		short := make(chan error, 1)
		go func() { short <- lim.Acquire(context.Background(), 500*time.Millisecond) }()
		bctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, clock.BlockUntilContext(bctx, 2), "the short wait asked the bucket and sleeps for its place, beside the long one")
		takes, _ := b.counts()
		require.Equal(t, 5, takes)
		clock.Advance(30 * time.Millisecond)
		require.NoError(t, outcome(t, short))
		clock.Advance(1470 * time.Millisecond) // the long one's place, 1.5 s after its answer
		require.NoError(t, outcome(t, long))
	})
}

// TestALeaseAtItsLimitCountsTheNextPlaceFromWhenItAsked: the bucket
// decided after the call was sent, so the next place it names counts from
// then, not from its answer a round trip later: a caller whose wait ends
// between the two asks the bucket.
func TestALeaseAtItsLimitCountsTheNextPlaceFromWhenItAsked(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &placingBucket{clock: clock, took: 10 * time.Millisecond, decisions: []throttle.Decision{atLimitFree, atLimitPlaced(20 * time.Millisecond),
		placedNext(30*time.Millisecond, 100*time.Millisecond), atLimitPlaced(30 * time.Millisecond)}}
	lim := throttle.New(b, throttle.WithClock(clock), throttle.WithLeasing(throttle.Leasing{}))
	defer lim.Close()
	ctx := context.Background()
	require.NoError(t, lim.Acquire(ctx, time.Second), "the first batch: the caller's own permit, free at once")
	bringToItsLimit(t, clock, lim)
	asked := clock.Now()
	first := acquireAsync(t, clock, lim, ctx, 3*time.Second) // answered 10 ms on, placed 30 ms after that
	clock.Advance(30 * time.Millisecond)
	require.NoError(t, outcome(t, first))
	// The next place is 100 ms after asked; counted from the answer, it
	// would be 110 ms after. This wait ends 105 ms after asked.
	wait := asked.Add(105 * time.Millisecond).Sub(clock.Now())
	before, _ := b.counts()
	second := acquireAsync(t, clock, lim, ctx, wait)
	after, _ := b.counts()
	assert.Equal(t, before+1, after, "a wait ending after the place counted from when the call was sent asks the bucket")
	clock.Advance(30 * time.Millisecond)
	require.NoError(t, outcome(t, second))
}
