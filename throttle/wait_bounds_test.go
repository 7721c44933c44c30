package throttle

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHungAdaptivePaceFallsBackWithinTheStoreTimeout: an adaptive pace
// whose store does not answer is given up after the store timeout, and the
// caller is paced locally and asks the bucket, whatever its wait: a
// Forever caller is not kept for good, and a caller with a long maxWait
// does not spend it all on the pace (and time out) before the failure
// policy can decide.
func TestHungAdaptivePaceFallsBackWithinTheStoreTimeout(t *testing.T) {
	for _, maxWait := range []time.Duration{Forever, time.Minute} {
		loc, err := NewLocal(10, time.Second)
		require.NoError(t, err)
		lim := New(&failingAdaptive{Local: loc}, WithStoreTimeout(20*time.Millisecond))
		lim.note(lim.root, AdaptiveState{Rate: 5, At: time.Now()}, lim.tb.now()) // adapting
		// A safety net only: the pace's fallback comes long before.
		stop, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err = lim.Acquire(ContextWithWaitStop(context.Background(), stop), maxWait)
		cancel()
		assert.NoError(t, err, "maxWait %v", maxWait)
		require.NoError(t, lim.Close())
	}
}

// needsTime is a bucket over a Local whose store needs a few
// milliseconds to answer: a Take whose context ends sooner than that
// fails when it ends, as a real store's would. Its adaptive pace grants a
// slot at once, answering paceSlack before its context's deadline (a
// slow store); with paceSlack 0 it never answers. It is no Immediate
// bucket.
type needsTime struct {
	loc       *Local
	need      time.Duration
	paceSlack time.Duration
}

func (b *needsTime) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (Decision, error) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < b.need {
		<-ctx.Done()
		return Decision{}, &BackendError{Op: "take", Err: ctx.Err()}
	}
	return b.loc.Take(ctx, key, n, maxWait)
}

func (b *needsTime) Fallback() (int64, time.Duration, int64) { return 10, time.Second, 1 }

func (b *needsTime) PaceAdaptive(ctx context.Context, _ string, _ int64, _, _ time.Duration) (AdaptivePace, error) {
	if dl, ok := ctx.Deadline(); ok && b.paceSlack > 0 {
		t := time.NewTimer(time.Until(dl) - b.paceSlack) // the store's latency
		defer t.Stop()
		select {
		case <-t.C:
			return AdaptivePace{Granted: true, State: AdaptiveState{Rate: 5, At: time.Now()}}, nil
		case <-ctx.Done():
		}
	}
	<-ctx.Done()
	return AdaptivePace{}, &BackendError{Op: "pace", Err: ctx.Err()}
}

func (b *needsTime) SwapAdaptive(context.Context, string, AdaptiveState, AdaptiveState, time.Duration) (AdaptiveState, bool, error) {
	return AdaptiveState{}, false, errors.New("READONLY")
}

// TestNoWaitBucketCallCutByItsPaceIsNoOutage: with maxWait 0, a slow
// adaptive pace (it answers 2 ms before the store timeout) may leave the
// bucket call that follows too little of the store timeout to answer in;
// a bucket call so cut is no evidence that the store is down: the Limiter
// starts no outage (which would put every caller of every key under the
// failure policy).
func TestNoWaitBucketCallCutByItsPaceIsNoOutage(t *testing.T) {
	loc, err := NewLocal(10, time.Second)
	require.NoError(t, err)
	const timeout = 40 * time.Millisecond
	lim := New(&needsTime{loc: loc, need: timeout / 4, paceSlack: 2 * time.Millisecond}, WithStoreTimeout(timeout), WithFailurePolicy(FailOpen))
	defer func() { require.NoError(t, lim.Close()) }()
	lim.note(lim.root, AdaptiveState{Rate: 5, At: time.Now()}, lim.tb.now()) // adapting
	err = lim.Acquire(context.Background(), 0)
	if err != nil {
		assert.ErrorIs(t, err, ErrTimeout)
	}
	assert.Zero(t, lim.outage.since.Load(), "an outage began: the bucket call had only what the pace left of the %v store timeout", timeout)
}

// slowCancel is a bucket that reserves every Take delay ahead, and whose
// reservations take their whole give-back time to be cancelled (a store
// that does not answer).
type slowCancel struct {
	delay     time.Duration
	taken     chan struct{} // closed at the Take
	cancelled chan struct{} // closed when a Cancel returns
}

func (b *slowCancel) Take(context.Context, string, int64, time.Duration) (Decision, error) {
	close(b.taken)
	return Decision{Granted: true, Delay: b.delay, Cancel: func(ctx context.Context) error {
		defer close(b.cancelled)
		<-ctx.Done()
		return ctx.Err()
	}}, nil
}

// TestLeavingCallerIsNotKeptForItsGiveBack: a caller that leaves while
// it sleeps for its reservation (cancelled, or its wait stopped) is not
// kept for the give-back of the reservation beyond the store timeout: a
// store that does not answer it costs the caller no more than the store
// timeout, however much of its maxWait was left; the give-back goes on in
// the background, and Close waits for it.
func TestLeavingCallerIsNotKeptForItsGiveBack(t *testing.T) {
	for _, how := range []string{"cancel", "stop"} {
		t.Run(how, func(t *testing.T) {
			b := &slowCancel{delay: time.Minute, taken: make(chan struct{}), cancelled: make(chan struct{})}
			lim := New(b, WithStoreTimeout(20*time.Millisecond))
			ctx, leave := context.WithCancel(context.Background())
			if how == "stop" {
				ctx = ContextWithWaitStop(context.Background(), ctx)
			}
			done := make(chan error, 1)
			go func() { done <- lim.Acquire(ctx, time.Hour) }()
			<-b.taken
			leave()
			err := <-done
			assert.ErrorIs(t, err, context.Canceled)
			select {
			case <-b.cancelled:
				t.Error("the caller was kept until the give-back ended (its whole second)")
			default:
			}
			require.NoError(t, lim.Close())
			<-b.cancelled // Close waited for it
		})
	}
}

// pausedPeriod is a bucket of 10 permits per second whose first Take
// grants a permit whose time is 900 ms away, and whose later Takes refuse
// for an hour; its Refund does not answer (it ends with its context, and
// then closes refunded).
type pausedPeriod struct {
	takes    atomic.Int64
	taken    chan struct{} // closed at the first Take
	refunded chan struct{}
}

func (b *pausedPeriod) Take(context.Context, string, int64, time.Duration) (Decision, error) {
	if b.takes.Add(1) == 1 {
		close(b.taken)
		return Decision{Granted: true, Delay: 900 * time.Millisecond, Limit: 10, Remaining: 0, Reset: time.Second}, nil
	}
	return Decision{Delay: time.Hour, Limit: 10, Reset: time.Hour}, nil
}

func (b *pausedPeriod) Refund(ctx context.Context, _ string, _ int64) error {
	defer close(b.refunded)
	<-ctx.Done()
	return ctx.Err()
}

func (b *pausedPeriod) Fallback() (int64, time.Duration, int64) { return 10, time.Second, 1 }

// TestGiveBackOnAPauseEndsByTheWaitsEnd: a grant given back because a
// pause came while the caller waited for its time is given back within
// what is left of the caller's wait, as every give-back
// of a wait is: a store that does not answer the refund does not keep the
// caller past its wait's end (it was kept the whole store timeout).
func TestGiveBackOnAPauseEndsByTheWaitsEnd(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &pausedPeriod{taken: make(chan struct{}), refunded: make(chan struct{})}
	// A store timeout longer than a give-back's whole second.
	lim := New(b, WithClock(clock), WithStoreTimeout(3*time.Second))
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { done <- lim.Acquire(ctx, time.Second) }()
	<-b.taken
	require.NoError(t, clock.BlockUntilContext(ctx, 1)) // waiting for its time, 0.9 s on
	lim.root.notePause(lim.tb.now() + int64(time.Hour))
	clock.Advance(900 * time.Millisecond)
	err := <-done
	assert.ErrorIs(t, err, ErrTimeout, "refused for an hour after the pause")
	select {
	case <-b.refunded:
		t.Error("the caller was kept until the refund ended, past its wait's end")
	default:
	}
	require.NoError(t, lim.Close())
	<-b.refunded
}

// TestNoWaitCallersMeetThePolicyWhenTheStoreHangs: with maxWait 0, an
// adaptive pace that the store does not answer in the whole store timeout
// is evidence that the store is down: the bucket call that follows, left
// none of the timeout, goes to the failure policy (FailOpen grants, an
// outage begins) rather than time out, or callers that never wait would
// never meet the failure policy while the store hangs.
func TestNoWaitCallersMeetThePolicyWhenTheStoreHangs(t *testing.T) {
	loc, err := NewLocal(10, time.Second)
	require.NoError(t, err)
	lim := New(&needsTime{loc: loc, need: time.Hour}, WithStoreTimeout(20*time.Millisecond), WithFailurePolicy(FailOpen))
	defer func() { require.NoError(t, lim.Close()) }()
	lim.note(lim.root, AdaptiveState{Rate: 5, At: time.Now()}, lim.tb.now()) // adapting
	assert.NoError(t, lim.Acquire(context.Background(), 0), "FailOpen grants")
	assert.NotZero(t, lim.outage.since.Load(), "the outage began")
}
