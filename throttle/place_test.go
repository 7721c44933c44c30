package throttle_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
)

// TestAKeyRefusesFromMemoryTheWaitsThatEndBeforeTheNextPlaceAGrantNames:
// without leasing too, a grant that names the bucket's next place
// (Decision.Next) is remembered for the key: callers whose waits end
// before it are refused without a round trip, and one whose wait reaches
// it asks the bucket.
func TestAKeyRefusesFromMemoryTheWaitsThatEndBeforeTheNextPlaceAGrantNames(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{placedNext(0, atLimitNext), placedNext(atLimitNext, atLimitNext+10*time.Millisecond)}}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	takes := func() int { n, _ := b.counts(); return n }

	require.NoError(t, lim.Acquire(ctx, time.Second), "free at once; the next place 2 s after")
	for i := range 3 {
		clock.Advance(100 * time.Millisecond)
		require.ErrorIsf(t, lim.Acquire(ctx, time.Second), throttle.ErrTimeout, "caller %d", i)
		require.ErrorIsf(t, lim.Acquire(ctx, 0), throttle.ErrTimeout, "caller %d without a wait", i)
	}
	assert.Equal(t, 1, takes(), "waits ending before the next place were refused from memory")

	long := acquireAsync(t, clock, lim, ctx, 3*time.Second)
	assert.Equal(t, 2, takes(), "a wait that reaches the next place asks")
	clock.Advance(atLimitNext)
	require.NoError(t, outcome(t, long))
}

// slowBackBucket is a placingBucket whose permits given back (Cancel)
// reach it only once release is closed, and whose take number hold (from
// 1; 0: none) answers only once answer is closed.
type slowBackBucket struct {
	*placingBucket
	giving  chan struct{} // signalled when a give-back begins
	given   chan struct{} // signalled when it has reached the bucket
	release chan struct{}
	hold    int
	holding chan struct{} // closed when take number hold has been asked
	answer  chan struct{}

	released, answered sync.Once
}

// giveBacksReach lets the permits given back reach the bucket.
func (b *slowBackBucket) giveBacksReach() { b.released.Do(func() { close(b.release) }) }

// heldTakeAnswers lets the take held answer.
func (b *slowBackBucket) heldTakeAnswers() { b.answered.Do(func() { close(b.answer) }) }

func newSlowBackBucket(clock *clockwork.FakeClock, hold int, decisions ...throttle.Decision) *slowBackBucket {
	return &slowBackBucket{
		placingBucket: &placingBucket{clock: clock, decisions: decisions},
		giving:        make(chan struct{}, 1),
		given:         make(chan struct{}, 1),
		release:       make(chan struct{}),
		hold:          hold,
		holding:       make(chan struct{}),
		answer:        make(chan struct{}),
	}
}

func (b *slowBackBucket) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	d, err := b.placingBucket.Take(ctx, key, n, maxWait)
	if takes, _ := b.counts(); takes == b.hold {
		close(b.holding)
		<-b.answer
	}
	if cancel := d.Cancel; cancel != nil {
		d.Cancel = func(ctx context.Context) error {
			signal(b.giving)
			<-b.release
			defer signal(b.given)
			return cancel(ctx)
		}
	}
	return d, err
}

// TestANextPlaceNamedBesideAGiveBackIsNotRemembered: a grant answered
// while a permit of the key was on its way back to the bucket may name a
// place that still counts that permit (Redis may have run the take
// first): it is not remembered, so a wait that ends before it asks the
// bucket (which may place it in the permit given back) rather than be
// refused from memory. So whether the give-back is still under way when
// the answer comes, or began and ended while the call was out.
func TestANextPlaceNamedBesideAGiveBackIsNotRemembered(t *testing.T) {
	leaving := placedNext(time.Second, time.Second+10*time.Millisecond)
	named := placedNext(0, atLimitNext) // free at once, naming a place 2 s after

	// setup has a caller placed a second ahead, sleeping for its place;
	// leave cancels its context, and it gives its permit back.
	setup := func(t *testing.T, hold int) (b *slowBackBucket, lim *throttle.Limiter, leave func(), left chan error) {
		clock := clockwork.NewFakeClock()
		b = newSlowBackBucket(clock, hold, leaving, named, named)
		lim = throttle.New(b, throttle.WithClock(clock))
		t.Cleanup(func() {
			// (Before Close, which waits for the give-back.)
			b.giveBacksReach()
			b.heldTakeAnswers()
			lim.Close()
		})
		ctx, leave := context.WithCancel(context.Background())
		return b, lim, leave, acquireAsync(t, clock, lim, ctx, 3*time.Second)
	}
	asks := func(t *testing.T, b *slowBackBucket, lim *throttle.Limiter) {
		t.Helper()
		before, _ := b.counts()
		require.NoError(t, lim.Acquire(context.Background(), time.Second), "a wait ending before the place named beside the give-back asks the bucket")
		after, _ := b.counts()
		assert.Equal(t, before+1, after)
	}

	t.Run("under way when the answer comes", func(t *testing.T) {
		b, lim, leave, left := setup(t, 0)
		leave()
		signalled(t, b.giving, "the caller that left gives its permit back")
		require.NoError(t, lim.Acquire(context.Background(), time.Second), "answered while the permit is on its way back")
		asks(t, b, lim)
		b.giveBacksReach()
		signalled(t, b.given, "the permit reached the bucket")
		require.ErrorIs(t, outcome(t, left), context.Canceled)
	})
	t.Run("begun and ended while the call was out", func(t *testing.T) {
		b, lim, leave, left := setup(t, 2)
		b.giveBacksReach()
		out := make(chan error, 1)
		// (A wait that reaches the leaving caller's next place.)
		go func() { out <- lim.Acquire(context.Background(), 2*time.Second) }()
		signalled(t, b.holding, "the call is out")
		leave()
		signalled(t, b.given, "the permit reached the bucket")
		require.ErrorIs(t, outcome(t, left), context.Canceled)
		b.heldTakeAnswers()
		require.NoError(t, outcome(t, out), "answered after the give-back")
		asks(t, b, lim)
	})
}

// signal gives ch (buffered) a value unless it holds one.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// signalled waits for ch to be ready (a value, or closed).
func signalled(t *testing.T, ch chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("never: " + what)
	}
}

// TestARefusalBeyondAWaitHoldsBackOnlyShorterWaitsUntilAGiveBack: from a
// bucket that places its permits (its grants name the next place), a
// refusal beyond a caller's wait holds back, from memory, the callers
// whose waits end before the place it named, and nobody else (the key's
// gate stays open: a longer wait asks at once, and the bucket places
// it); a give-back of the key forgets it, and so does a refusal
// answered while one is under way.
func TestARefusalBeyondAWaitHoldsBackOnlyShorterWaitsUntilAGiveBack(t *testing.T) {
	// The bucket's answers: its first grant names the next place (10 ms
	// on), so that the Limiter knows it places its permits; a caller
	// placed a second ahead (naming none: the first place is free); a
	// refusal until after that place; a caller placed a second ahead, or
	// 100 ms ahead (in the place given back).
	named := placedNext(0, 10*time.Millisecond)
	leaving := atLimitPlaced(time.Second)
	refused := throttle.Decision{Delay: time.Second + 10*time.Millisecond, Limit: 100}
	placed := placedNext(time.Second, time.Second+10*time.Millisecond)
	soon := placedNext(100*time.Millisecond, 110*time.Millisecond)

	// setup has the first grant made and its next place passed.
	setup := func(t *testing.T, decisions ...throttle.Decision) (*clockwork.FakeClock, *slowBackBucket, *throttle.Limiter) {
		clock := clockwork.NewFakeClock()
		b := newSlowBackBucket(clock, 0, append([]throttle.Decision{named}, decisions...)...)
		lim := throttle.New(b, throttle.WithClock(clock))
		t.Cleanup(func() { b.giveBacksReach(); lim.Close() })
		require.NoError(t, lim.Acquire(context.Background(), 0), "free at once, naming a place 10 ms after")
		clock.Advance(10 * time.Millisecond)
		return clock, b, lim
	}
	// asks runs an Acquire with wait, which must ask the bucket and is
	// placed at in.
	asks := func(t *testing.T, clock *clockwork.FakeClock, b *slowBackBucket, lim *throttle.Limiter, wait, in time.Duration, what string) {
		t.Helper()
		before, _ := b.counts()
		done := acquireAsync(t, clock, lim, context.Background(), wait)
		after, _ := b.counts()
		require.Equal(t, before+1, after, what)
		clock.Advance(in)
		require.NoError(t, outcome(t, done), what)
	}

	t.Run("a longer wait asks, a shorter one is refused", func(t *testing.T) {
		clock, b, lim := setup(t, refused, placed)
		require.ErrorIs(t, lim.Acquire(context.Background(), 0), throttle.ErrTimeout)
		require.ErrorIs(t, lim.Acquire(context.Background(), 500*time.Millisecond), throttle.ErrTimeout)
		takes, _ := b.counts()
		require.Equal(t, 2, takes, "a wait ending before the place named is refused from memory")
		asks(t, clock, b, lim, 3*time.Second, time.Second, "a wait reaching past the place asks at once")
	})
	t.Run("given back after the refusal", func(t *testing.T) {
		clock, b, lim := setup(t, leaving, refused, soon)
		b.giveBacksReach()
		ctx, leave := context.WithCancel(context.Background())
		left := acquireAsync(t, clock, lim, ctx, 3*time.Second)
		require.ErrorIs(t, lim.Acquire(context.Background(), 0), throttle.ErrTimeout, "refused until after the first caller's place")
		leave()
		signalled(t, b.given, "the permit reached the bucket")
		require.ErrorIs(t, outcome(t, left), context.Canceled)
		asks(t, clock, b, lim, 500*time.Millisecond, 100*time.Millisecond, "a give-back of the key forgets its next place")
	})
	t.Run("refused while a permit is on its way back", func(t *testing.T) {
		clock, b, lim := setup(t, leaving, refused, soon)
		ctx, leave := context.WithCancel(context.Background())
		left := acquireAsync(t, clock, lim, ctx, 3*time.Second)
		leave()
		signalled(t, b.giving, "the caller that left gives its permit back")
		require.ErrorIs(t, lim.Acquire(context.Background(), 0), throttle.ErrTimeout, "refused, counting the permit on its way back")
		b.giveBacksReach()
		signalled(t, b.given, "the permit reached the bucket")
		require.ErrorIs(t, outcome(t, left), context.Canceled)
		asks(t, clock, b, lim, 500*time.Millisecond, 100*time.Millisecond, "a refusal answered beside a give-back holds nobody back")
	})
}

// cappedBucket answers decisions in turn (the last one again), refuses
// more than capacity permits at once with ErrExceedsLimit, as the
// library's buckets do, and takes permits back (Refund).
type cappedBucket struct {
	capacity  int64
	decisions []throttle.Decision

	mu       sync.Mutex
	takes    int
	refunded int64
}

func (b *cappedBucket) Take(_ context.Context, _ string, n int64, _ time.Duration) (throttle.Decision, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.takes++
	if n > b.capacity {
		return throttle.Decision{}, fmt.Errorf("%d permits at once, more than %d: %w", n, b.capacity, throttle.ErrExceedsLimit)
	}
	return b.decisions[min(b.takes, len(b.decisions))-1], nil
}

func (b *cappedBucket) Refund(_ context.Context, _ string, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refunded += n
	return nil
}

func (b *cappedBucket) counts() (takes int, refunded int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.takes, b.refunded
}

// TestANextPlaceTellsNoCallerItCouldWaitForWhatTheBucketCanNeverGrant:
// a caller of more permits than the bucket ever grants at once gets
// ErrExceedsLimit, as the bucket says, not a wait that ran out because
// a place is remembered; one of a few permits, within the key's limit,
// is refused from memory.
func TestANextPlaceTellsNoCallerItCouldWaitForWhatTheBucketCanNeverGrant(t *testing.T) {
	named := placedNext(0, atLimitNext) // Limit 100
	named.Limit = 10
	b := &cappedBucket{capacity: 10, decisions: []throttle.Decision{named}}
	lim := throttle.New(b, throttle.WithClock(clockwork.NewFakeClock()))
	defer lim.Close()
	ctx := context.Background()
	require.NoError(t, lim.Acquire(ctx, time.Second), "free at once, naming a place 2 s after")
	require.ErrorIs(t, lim.AcquireN(ctx, 11, time.Second), throttle.ErrExceedsLimit)
	takes, _ := b.counts()
	require.Equal(t, 2, takes, "the bucket was asked")
	require.ErrorIs(t, lim.AcquireN(ctx, 3, time.Second), throttle.ErrTimeout)
	takes, _ = b.counts()
	assert.Equal(t, 2, takes, "three permits, within the limit, refused from memory")
}

// TestASettleThatGivesBackForgetsTheNextPlace: a cost settled below its
// estimate gives permits back to the bucket (Refund): the key's next
// place may come sooner, so a short wait asks the bucket again.
func TestASettleThatGivesBackForgetsTheNextPlace(t *testing.T) {
	b := &cappedBucket{capacity: 10, decisions: []throttle.Decision{placedNext(0, atLimitNext), atLimitFree}}
	lim := throttle.New(b, throttle.WithClock(clockwork.NewFakeClock()))
	defer lim.Close()
	ctx := context.Background()
	g, err := lim.AcquireCost(ctx, throttle.Cost{"calls": 5}, time.Second)
	require.NoError(t, err, "free at once, naming a place 2 s after")
	require.NoError(t, g.Settle(ctx, throttle.Cost{"calls": 1}))
	_, refunded := b.counts()
	require.EqualValues(t, 4, refunded)
	require.NoError(t, lim.Acquire(ctx, time.Second), "a wait ending before the place named asks the bucket")
	takes, _ := b.counts()
	assert.Equal(t, 2, takes)
}

// adaptingBucket is a placingBucket that keeps the key's adaptive state
// (an AdaptiveStore) and counts the adaptive pace's calls: every slot is
// free at once.
type adaptingBucket struct {
	*placingBucket

	amu   sync.Mutex
	state throttle.AdaptiveState
	paces int
}

func (b *adaptingBucket) PaceAdaptive(context.Context, string, int64, time.Duration, time.Duration) (throttle.AdaptivePace, error) {
	b.amu.Lock()
	defer b.amu.Unlock()
	b.paces++
	s := b.state
	s.At = b.clock.Now()
	return throttle.AdaptivePace{Granted: true, State: s}, nil
}

func (b *adaptingBucket) SwapAdaptive(_ context.Context, _ string, old, next throttle.AdaptiveState, _ time.Duration) (throttle.AdaptiveState, bool, error) {
	b.amu.Lock()
	defer b.amu.Unlock()
	swapped := old.Version == b.state.Version
	if swapped {
		next.Version = b.state.Version + 1
		b.state = next
	}
	s := b.state
	s.At = b.clock.Now()
	return s, swapped, nil
}

func (b *adaptingBucket) paceCalls() int {
	b.amu.Lock()
	defer b.amu.Unlock()
	return b.paces
}

// TestAWaitTheNextPlaceRefusesTakesNoSlotOfTheAdaptivePace: while a key
// adapts, a caller whose wait ends before the key's next place is refused
// before the pace: no store call, no slot of the fleet's pace taken from
// a caller that would use it.
func TestAWaitTheNextPlaceRefusesTakesNoSlotOfTheAdaptivePace(t *testing.T) {
	clock := clockwork.NewFakeClock()
	refused := throttle.Decision{Delay: 30 * time.Second, Limit: 10, Reset: time.Second}
	b := &adaptingBucket{placingBucket: &placingBucket{clock: clock, decisions: []throttle.Decision{placedNext(0, 10*time.Millisecond), refused}}}
	b.state = throttle.AdaptiveState{Rate: 5, Version: 1}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	require.NoError(t, lim.Report(ctx, throttle.Answer{Refused: true}), "the key adapts")
	require.NoError(t, lim.Acquire(ctx, 0), "paced, then free at once, naming a place 10 ms after")
	clock.Advance(10 * time.Millisecond)
	require.ErrorIs(t, lim.Acquire(ctx, 100*time.Millisecond), throttle.ErrTimeout, "refused beyond its wait: the place is 30 s on")
	paces := b.paceCalls()
	require.Positive(t, paces, "the pace was asked")
	for i := range 5 {
		require.ErrorIsf(t, lim.Acquire(ctx, 100*time.Millisecond), throttle.ErrTimeout, "caller %d", i)
	}
	takes, _ := b.counts()
	assert.Equal(t, 2, takes, "refused from memory")
	assert.Equal(t, paces, b.paceCalls(), "without asking the pace")
}

// TestARefusalWithinTheWaitsQueuesTheLongerWaitsAtTheGate: a refusal
// within the caller's wait (a pause, say: the bucket refuses every take
// until its end) closes the key's gate, so that the callers with long
// waits queue in the Limiter instead of each asking the bucket.
func TestARefusalWithinTheWaitsQueuesTheLongerWaitsAtTheGate(t *testing.T) {
	clock := clockwork.NewFakeClock()
	paused := throttle.Decision{Delay: 30 * time.Second, Limit: 10, Reset: time.Second}
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{placedNext(0, 10*time.Millisecond), paused}}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, lim.Acquire(ctx, 0), "free at once, naming a place 10 ms after: the bucket places its permits")
	clock.Advance(10 * time.Millisecond)

	var waits []chan error
	wait := func() {
		w := make(chan error, 1)
		go func() { w <- lim.Acquire(ctx, time.Minute) }()
		waits = append(waits, w)
	}
	// The first asks, is refused, and queues at the gate it closed (on
	// the clock: its deadline, and the gate's reopening); the others
	// come after it and queue (their deadlines).
	wait()
	waitForSleepers(t, clock, 2)
	for range 3 {
		wait()
	}
	waitForSleepers(t, clock, 5)
	takes, _ := b.counts()
	assert.Equal(t, 2, takes, "the first long wait asked; the others queue at the gate it closed")
	cancel()
	for _, w := range waits {
		require.ErrorIs(t, outcome(t, w), context.Canceled)
	}
}

// TestAGiveBackOpensTheGateARefusalClosed: a give-back of the key, which
// may free a permit before the time the refusal named, opens the key's
// gate: a wait that the gate turned away before asks the bucket.
func TestAGiveBackOpensTheGateARefusalClosed(t *testing.T) {
	clock := clockwork.NewFakeClock()
	paused := throttle.Decision{Delay: 30 * time.Second, Limit: 100, Reset: time.Second}
	soon := placedNext(100*time.Millisecond, 110*time.Millisecond)
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{placedNext(0, 10*time.Millisecond), atLimitPlaced(time.Second), paused, soon}}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	require.NoError(t, lim.Acquire(ctx, 0), "free at once, naming a place 10 ms after")
	clock.Advance(10 * time.Millisecond)

	lctx, leave := context.WithCancel(ctx)
	left := acquireAsync(t, clock, lim, lctx, 3*time.Second) // placed a second ahead
	queued := make(chan error, 1)
	go func() { queued <- lim.Acquire(ctx, time.Minute) }()
	// On the clock: the first's time; the second's deadline and the
	// gate's reopening (its refusal closed the gate for 30 s).
	waitForSleepers(t, clock, 3)
	require.ErrorIs(t, lim.Acquire(ctx, 500*time.Millisecond), throttle.ErrTimeout, "turned away at the closed gate")
	takes, _ := b.counts()
	require.Equal(t, 3, takes, "turned away without asking")

	leave()
	require.ErrorIs(t, outcome(t, left), context.Canceled)
	_, cancelled := b.counts()
	require.Equal(t, 1, cancelled, "the permit given back")
	short := make(chan error, 1)
	go func() { short <- lim.Acquire(ctx, 500*time.Millisecond) }()
	require.Eventually(t, func() bool { takes, _ := b.counts(); return takes == 5 }, 5*time.Second, time.Millisecond, "the short wait and the one queued ask")
	waitForSleepers(t, clock, 2) // both placed 100 ms ahead
	clock.Advance(100 * time.Millisecond)
	require.NoError(t, outcome(t, short))
	require.NoError(t, outcome(t, queued))
}

// TestARefusalAfterAGiveBackClosesTheGate: a give-back opens the gate
// only when it comes after the refusal that closed it: a long wait
// refused after one queues at the gate (on the clock) instead of asking
// again at once.
func TestARefusalAfterAGiveBackClosesTheGate(t *testing.T) {
	clock := clockwork.NewFakeClock()
	paused := throttle.Decision{Delay: 30 * time.Second, Limit: 100, Reset: time.Second}
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{atLimitPlaced(time.Second), paused}}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	lctx, leave := context.WithCancel(context.Background())
	left := acquireAsync(t, clock, lim, lctx, 3*time.Second)
	leave()
	require.ErrorIs(t, outcome(t, left), context.Canceled)
	_, cancelled := b.counts()
	require.Equal(t, 1, cancelled, "the permit given back")

	ctx, stop := context.WithCancel(context.Background())
	queued := make(chan error, 1)
	go func() { queued <- lim.Acquire(ctx, time.Minute) }()
	waitForSleepers(t, clock, 2) // the gate's reopening and its deadline
	takes, _ := b.counts()
	assert.Equal(t, 2, takes, "asked once, then queued at the gate its refusal closed")
	stop()
	require.ErrorIs(t, outcome(t, queued), context.Canceled)
}

// TestAGiveBackLetsTheCallersQueuedAtTheGateIn: when a give-back that
// opened the key's gate ends, the callers queued there ask the bucket,
// with no new caller and no time passing.
func TestAGiveBackLetsTheCallersQueuedAtTheGateIn(t *testing.T) {
	clock := clockwork.NewFakeClock()
	paused := throttle.Decision{Delay: 30 * time.Second, Limit: 100, Reset: time.Second}
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{atLimitPlaced(time.Second), paused, atLimitFree}}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	lctx, leave := context.WithCancel(context.Background())
	left := acquireAsync(t, clock, lim, lctx, 3*time.Second)
	queued := make(chan error, 1)
	go func() { queued <- lim.Acquire(context.Background(), time.Minute) }()
	waitForSleepers(t, clock, 3) // the first's time; the second's deadline, the gate's reopening
	leave()
	require.ErrorIs(t, outcome(t, left), context.Canceled)
	require.NoError(t, outcome(t, queued), "let in by the give-back's end, and granted")
	takes, _ := b.counts()
	assert.Equal(t, 3, takes)
}

// TestPermitsGivenBackInAPauseDoNotOpenTheGate: permits given back
// because a pause was reported for the key (their time came in it) are
// no use before the pause ends: the gate the pause's refusal closed stays
// closed, and nobody asks the paused bucket.
func TestPermitsGivenBackInAPauseDoNotOpenTheGate(t *testing.T) {
	clock := clockwork.NewFakeClock()
	paused := throttle.Decision{Delay: 30 * time.Second, Limit: 100, Reset: time.Second}
	b := &placingBucket{clock: clock, decisions: []throttle.Decision{atLimitPlaced(time.Second), atLimitPlaced(time.Second), paused}}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	holders := make(chan error, 2)
	for range 2 {
		go func() { holders <- lim.Acquire(ctx, 5*time.Second) }()
	}
	waitForSleepers(t, clock, 2)
	require.NoError(t, lim.Report(ctx, throttle.Answer{Retry: true, RetryAfter: 30 * time.Second}))
	queued := make(chan error, 2)
	for range 2 {
		go func() { queued <- lim.Acquire(ctx, time.Minute) }()
	}
	waitForSleepers(t, clock, 5) // the holders' times; the gate's reopening and the queued's deadlines
	before, _ := b.counts()
	clock.Advance(time.Second) // the holders' time, in the pause: given back
	for range 2 {
		require.ErrorIs(t, outcome(t, holders), throttle.ErrTimeout, "turned away: the pause outlasts the wait")
	}
	require.ErrorIs(t, lim.Acquire(ctx, 0), throttle.ErrTimeout)
	takes, cancelled := b.counts()
	assert.Equal(t, 2, cancelled, "both given back")
	assert.Equal(t, before, takes, "nobody asked the bucket since")
	stop()
	for range 2 {
		require.ErrorIs(t, outcome(t, queued), context.Canceled)
	}
}

// costPlacingBucket is a placingBucket that takes costs too
// (CostBucket): each cost is reserved a second ahead, and settled back
// exactly (Decision.Settle).
type costPlacingBucket struct {
	*placingBucket
	settled chan throttle.Cost // gets each Settle's delta
}

func (b *costPlacingBucket) TakeCost(context.Context, string, throttle.Cost, time.Duration) (throttle.Decision, error) {
	d := atLimitPlaced(time.Second)
	d.Settle = func(_ context.Context, delta throttle.Cost) error {
		b.settled <- delta
		return nil
	}
	return d, nil
}

// TestACostGivenBackForgetsTheNextPlace: a cost's reservation given back
// (its caller left before its time) returns what the key's permits are
// taken from: the key's next place may come sooner, so a short wait asks
// the bucket again.
func TestACostGivenBackForgetsTheNextPlace(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &costPlacingBucket{placingBucket: &placingBucket{clock: clock, decisions: []throttle.Decision{placedNext(0, atLimitNext), atLimitFree}}, settled: make(chan throttle.Cost, 1)}
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	require.NoError(t, lim.Acquire(ctx, time.Second), "free at once, naming a place 2 s after")

	cctx, leave := context.WithCancel(ctx)
	left := make(chan error, 1)
	go func() {
		_, err := lim.AcquireCost(cctx, throttle.Cost{"calls": 1}, 3*time.Second)
		left <- err
	}()
	waitForSleepers(t, clock, 1) // for its reservation's time
	leave()
	require.ErrorIs(t, outcome(t, left), context.Canceled)
	select {
	case delta := <-b.settled:
		require.Equal(t, throttle.Cost{"calls": -1}, delta, "the reservation given back")
	case <-time.After(5 * time.Second):
		t.Fatal("the cost was not given back")
	}
	require.NoError(t, lim.Acquire(ctx, time.Second), "a wait ending before the place named asks the bucket")
	takes, _ := b.counts()
	assert.Equal(t, 2, takes)
}
