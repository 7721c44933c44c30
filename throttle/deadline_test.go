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

// slowPace is a sharedAdaptive whose PaceAdaptive answers latency after
// it decided, on the fake clock (the clock moves on while the reply
// travels back).
type slowPace struct {
	*sharedAdaptive
	fake    *clockwork.FakeClock
	latency time.Duration
}

func (s *slowPace) PaceAdaptive(ctx context.Context, key string, n int64, interval, horizon time.Duration) (AdaptivePace, error) {
	p, err := s.sharedAdaptive.PaceAdaptive(ctx, key, n, interval, horizon)
	s.fake.Advance(s.latency)
	return p, err
}

// drive advances clock by a millisecond whenever something sleeps on it,
// until done is closed.
func drive(clock *clockwork.FakeClock, done <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-done; cancel() }()
	for clock.BlockUntilContext(ctx, 1) == nil {
		clock.Advance(time.Millisecond)
	}
}

// TestPacedSlotAfterTheDeadlineIsATimeout: a store that
// answers the pace call in 30 ms with a slot 45 ms after it decided leaves
// a caller with a 50 ms wait a slot that begins at 75 ms: Acquire returns
// ErrTimeout by its 50 ms, not nil after its wait (it returned nil after
// 81.5 ms: the slot's whole delay was slept after the round trip).
func TestPacedSlotAfterTheDeadlineIsATimeout(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	b := &slowPace{sharedAdaptive: newSharedAdaptive(t, clock, 100), fake: clock}
	b.mu <- struct{}{}
	_, ok := b.state("k").swap(clock.Now(), AdaptiveState{}, AdaptiveState{Rate: 20}, time.Hour) // a slot every 50 ms
	<-b.mu
	require.True(t, ok)
	lim := New(b, WithClock(clock))
	defer lim.Close()
	k := lim.Key("k")
	s, err := lim.adaptiveState(ctx, "k")
	require.NoError(t, err)
	require.True(t, s.Active())
	require.NoError(t, k.Acquire(ctx, 0), "the first slot, at once") // the next is 50 ms on
	clock.Advance(5 * time.Millisecond)

	b.latency = 30 * time.Millisecond
	start := clock.Now()
	done := make(chan struct{})
	var aerr error
	go func() { defer close(done); aerr = k.Acquire(ctx, 50*time.Millisecond) }()
	drive(clock, done)
	<-done
	took := clock.Since(start)
	assert.ErrorIs(t, aerr, ErrTimeout, "the slot begins 75 ms in, after the wait's end")
	assert.LessOrEqual(t, took, 50*time.Millisecond, "returned after the wait's end")
}

// lateCost is a CostBucket that grants every cost and answers latency
// after it decided, on the fake clock; it counts what Settle gives back.
type lateCost struct {
	*Local
	fake     *clockwork.FakeClock
	latency  time.Duration
	returned Cost
}

func (b *lateCost) TakeCost(_ context.Context, _ string, _ Cost, _ time.Duration) (Decision, error) {
	b.fake.Advance(b.latency)
	return Decision{Granted: true, Settle: func(_ context.Context, delta Cost) error {
		for k, v := range delta {
			b.returned[k] += v
		}
		return nil
	}}, nil
}

// TestCostGrantedAfterTheDeadlineIsGivenBack: a cost whose grant comes
// back after the caller's wait has ended (a store answering in 30 ms, a
// wait of 20 ms) is given back and is ErrTimeout, not a grant after the
// wait.
func TestCostGrantedAfterTheDeadlineIsGivenBack(t *testing.T) {
	clock := clockwork.NewFakeClock()
	loc, err := NewLocal(10, time.Second, WithClock(clock))
	require.NoError(t, err)
	b := &lateCost{Local: loc, fake: clock, latency: 30 * time.Millisecond, returned: Cost{}}
	lim := New(b, WithClock(clock))
	defer lim.Close()
	g, err := lim.AcquireCost(context.Background(), Cost{"tokens": 5}, 20*time.Millisecond)
	assert.ErrorIs(t, err, ErrTimeout)
	assert.Nil(t, g)
	assert.Equal(t, Cost{"tokens": -5}, b.returned, "the late grant given back")
}

// stopDuringTake grants every take, with a Cancel it counts, after
// calling stop (the wait is stopped while the reply travels back).
type stopDuringTake struct {
	stop      context.CancelFunc
	cancelled atomic.Int64
}

func (b *stopDuringTake) Take(ctx context.Context, _ string, _ int64, _ time.Duration) (Decision, error) {
	b.stop()
	<-ctx.Done() // the stop has reached the call's context (it goes through a goroutine)
	return Decision{Granted: true, Cancel: func(context.Context) error { b.cancelled.Add(1); return nil }}, nil
}

// TestGrantAnsweredAfterAStopIsGivenBack: a wait stopped while the bucket
// was asked returns the stop's error, not the grant that came back after
// it, and gives the grant back.
func TestGrantAnsweredAfterAStopIsGivenBack(t *testing.T) {
	stopCtx, stop := context.WithCancel(context.Background())
	b := &stopDuringTake{stop: stop}
	lim := New(b)
	defer lim.Close()
	err := lim.Acquire(ContextWithWaitStop(context.Background(), stopCtx), time.Second)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, int64(1), b.cancelled.Load(), "the grant given back")
}

// lateFailCost is a CostBucket whose store answers latency after the call,
// on the fake clock, with a store failure.
type lateFailCost struct {
	*Local
	fake    *clockwork.FakeClock
	latency time.Duration
}

func (b *lateFailCost) TakeCost(_ context.Context, _ string, _ Cost, _ time.Duration) (Decision, error) {
	b.fake.Advance(b.latency)
	return Decision{}, &BackendError{Op: "take", Err: errors.New("connection reset")}
}

// TestCostFailOpenAfterTheDeadlineIsATimeout: FailOpen's grant of a cost
// whose store failure came back after the caller's wait had ended (a
// store answering in 30 ms, a wait of 20 ms) is ErrTimeout, as Acquire's
// is: AcquireCost never grants after its wait's end, by the failure
// policy either.
func TestCostFailOpenAfterTheDeadlineIsATimeout(t *testing.T) {
	clock := clockwork.NewFakeClock()
	loc, err := NewLocal(10, time.Second, WithClock(clock))
	require.NoError(t, err)
	b := &lateFailCost{Local: loc, fake: clock, latency: 30 * time.Millisecond}
	lim := New(b, WithClock(clock), WithFailurePolicy(FailOpen))
	defer lim.Close()
	_, err = lim.AcquireCost(context.Background(), Cost{"tokens": 5}, 20*time.Millisecond)
	assert.ErrorIs(t, err, ErrTimeout, "granted by FailOpen after the wait's end")

	b.latency = 0 // the failure within the wait: FailOpen grants
	_, err = lim.AcquireCost(context.Background(), Cost{"tokens": 5}, 20*time.Millisecond)
	assert.NoError(t, err)
}

// TestReservationWithinTheWaitIsKeptWhenTheCallerWakesLate: a
// reservation that begins at the end of the caller's wait, slept out by a
// timer that fires a little late (a loaded machine; the fake clock moves
// past it in one step), is the caller's: its slot began within the wait.
// It returned ErrTimeout, and gave the reservation back when its slot had
// begun already, which gives nothing back.
func TestReservationWithinTheWaitIsKeptWhenTheCallerWakesLate(t *testing.T) {
	clock := clockwork.NewFakeClock()
	loc, err := NewLocal(1, 100*time.Millisecond, WithClock(clock))
	require.NoError(t, err)
	lim := New(loc, WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	require.NoError(t, lim.Acquire(ctx, 0)) // the next slot is 100 ms on
	done := make(chan error, 1)
	go func() { done <- lim.Acquire(ctx, 100*time.Millisecond) }()
	require.NoError(t, clock.BlockUntilContext(ctx, 1)) // sleeping for its reservation
	clock.Advance(101 * time.Millisecond)
	assert.NoError(t, <-done, "the reservation began within the wait")
}

// TestCostReservationWithinTheWaitIsKeptWhenTheCallerWakesLate is
// TestReservationWithinTheWaitIsKeptWhenTheCallerWakesLate for
// AcquireCost.
func TestCostReservationWithinTheWaitIsKeptWhenTheCallerWakesLate(t *testing.T) {
	clock := clockwork.NewFakeClock()
	loc, err := NewLocal(10, time.Second, WithClock(clock))
	require.NoError(t, err)
	b := &reservingCost{Local: loc, delay: 100 * time.Millisecond, returned: Cost{}}
	lim := New(b, WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := lim.AcquireCost(ctx, Cost{"tokens": 5}, 100*time.Millisecond)
		done <- err
	}()
	require.NoError(t, clock.BlockUntilContext(ctx, 1)) // sleeping for its reservation
	clock.Advance(101 * time.Millisecond)
	assert.NoError(t, <-done, "the reservation began within the wait")
	assert.Empty(t, b.returned, "nothing given back")
}

// reservingCost is a CostBucket that reserves every cost delay ahead.
type reservingCost struct {
	*Local
	delay    time.Duration
	returned Cost
}

func (b *reservingCost) TakeCost(context.Context, string, Cost, time.Duration) (Decision, error) {
	return Decision{Granted: true, Delay: b.delay, Settle: func(_ context.Context, delta Cost) error {
		for k, v := range delta {
			b.returned[k] += v
		}
		return nil
	}}, nil
}

// TestLeaseRefillRanOutSaysWhichBoundEnded: the ErrTimeout of a wait that
// ran out while its key's lease was refilled wraps
// context.DeadlineExceeded when ctx's deadline set the wait, as every
// other ErrTimeout does, and not when maxWait did.
func TestLeaseRefillRanOutSaysWhichBoundEnded(t *testing.T) {
	for _, ctxBound := range []bool{true, false} {
		w := &waiter{demand: demand{key: "k", n: 1}, tb: timeoutBound{n: 1, maxWait: time.Second, ctxBound: ctxBound}}
		err := w.refillRanOut()
		assert.ErrorIs(t, err, ErrTimeout)
		assert.Equal(t, ctxBound, errors.Is(err, context.DeadlineExceeded), "ctx's deadline set the wait: %v; %v", ctxBound, err)
		assert.ErrorContains(t, err, `key "k"`)
	}
}
