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
	giving  chan struct{} // gets a value when a give-back begins
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
			b.giving <- struct{}{}
			<-b.release
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
		require.ErrorIs(t, outcome(t, left), context.Canceled)
		_, cancelled := b.counts()
		assert.Equal(t, 1, cancelled, "the permit reached the bucket")
	})
	t.Run("begun and ended while the call was out", func(t *testing.T) {
		b, lim, leave, left := setup(t, 2)
		b.giveBacksReach()
		out := make(chan error, 1)
		// (A wait that reaches the leaving caller's next place.)
		go func() { out <- lim.Acquire(context.Background(), 2*time.Second) }()
		signalled(t, b.holding, "the call is out")
		leave()
		require.ErrorIs(t, outcome(t, left), context.Canceled)
		_, cancelled := b.counts()
		require.Equal(t, 1, cancelled, "the permit reached the bucket")
		b.heldTakeAnswers()
		require.NoError(t, outcome(t, out), "answered after the give-back")
		asks(t, b, lim)
	})
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
