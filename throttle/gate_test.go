package throttle

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fixedWindow is a test bucket that never reserves: limit permits per
// aligned window of its clock, refusals naming the window's end. It counts
// every call made to it.
type fixedWindow struct {
	clock    clockwork.Clock
	limit    int64
	interval time.Duration
	mu       sync.Mutex
	window   int64
	used     int64
	calls    atomic.Int64
}

func (b *fixedWindow) Take(_ context.Context, _ string, n int64, _ time.Duration) (Decision, error) {
	b.calls.Add(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now().UnixNano()
	w := now / int64(b.interval)
	if w != b.window {
		b.window, b.used = w, 0
	}
	if b.used+n > b.limit {
		return Decision{Delay: time.Duration((w+1)*int64(b.interval) - now)}, nil
	}
	b.used += n
	return Decision{Granted: true}, nil
}

// eventually polls cond (an outcome, not a synchronisation point) for up
// to 10 s of real time.
func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, time.Millisecond, msg)
}

// TestWaitersDoNotStampede: 10,000 goroutines wait on one key of a bucket
// that grants 100 per interval. Each interval, the bucket is asked about
// as often as it grants, plus a few calls that learn it is empty again:
// not once per waiter.
func TestWaitersDoNotStampede(t *testing.T) {
	const callers, limit = 10_000, 100
	clock := clockwork.NewFakeClockAt(time.Unix(1_000_000, 0))
	b := &fixedWindow{clock: clock, limit: limit, interval: time.Second}
	lim := New(b, WithClock(clock))

	var granted atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			if err := lim.Acquire(context.Background(), Forever); err != nil {
				t.Errorf("Acquire: %v", err)
			}
			granted.Add(1)
		})
	}
	parked := func() bool {
		g := &lim.root.gate
		return granted.Load()+int64(g.queued.Load()) == callers && func() bool {
			g.mu.Lock()
			defer g.mu.Unlock()
			return g.active == 0 && (g.timer != nil || len(g.q) == 0)
		}()
	}
	// Starting 10,000 goroutines under -race takes 3–15 s of real time on
	// a shared 2-core machine: a wait for a state, not a bound on speed.
	require.Eventually(t, parked, time.Minute, time.Millisecond, "every caller granted or queued")
	require.Equal(t, int64(limit), granted.Load(), "the first window's permits")

	worst := int64(0)
	for round := 1; granted.Load() < callers; round++ {
		require.Less(t, round, 200, "waiters are not being served")
		before := b.calls.Load()
		clock.Advance(time.Second)
		want := min(int64(round+1)*limit, callers)
		eventually(t, func() bool { return granted.Load() == want && parked() }, "a window's worth of grants")
		worst = max(worst, b.calls.Load()-before-limit)
	}
	wg.Wait()
	t.Logf("at most %d calls per interval beyond the grants; %d calls for %d grants", worst, b.calls.Load(), callers)
	assert.LessOrEqual(t, worst, int64(admitWave), "calls beyond the grants per interval")
	assert.Zero(t, lim.root.gate.queued.Load())
}

// TestGateTurnsAwayWaitersItCannotServeInTime: a caller queued behind a
// closed gate is refused at once when the gate closes again past its
// deadline, with no timer of its own.
func TestGateTurnsAwayWaitersItCannotServeInTime(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Unix(1_000_000, 0))
	b := &fixedWindow{clock: clock, limit: 1, interval: time.Second}
	lim := New(b, WithClock(clock))
	ctx := context.Background()
	require.NoError(t, lim.Acquire(ctx, 0))
	// The window ends in 1 s: the first waiter may wait 1.5 s, the
	// second too; only one permit comes at 1 s, and the next at 2 s is
	// beyond the second's deadline.
	first := make(chan error, 1)
	second := make(chan error, 1)
	go func() { first <- lim.Acquire(ctx, 1500*time.Millisecond) }()
	// The second starts once the first is queued, so that it finds the
	// gate closed (else both ask the bucket before either closes it).
	eventually(t, func() bool { return lim.root.gate.queued.Load() == 1 }, "the first caller queued")
	go func() { second <- lim.Acquire(ctx, 1500*time.Millisecond) }()
	eventually(t, func() bool { return lim.root.gate.queued.Load() == 2 }, "both callers queued")
	clock.Advance(time.Second)
	errs := []error{<-first, <-second}
	var ok, timedOut int
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case assert.ErrorIs(t, err, ErrTimeout):
			timedOut++
		}
	}
	assert.Equal(t, 1, ok)
	assert.Equal(t, 1, timedOut)
	// The first permit; the refusal that closed the gate; at 1 s, both
	// admitted: one grant, one refusal that closes the gate until 2 s.
	assert.Equal(t, int64(4), b.calls.Load())
}

func TestKeysIdlePastTheirRefusalAreForgotten(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Unix(1_000_000, 0))
	b := &fixedWindow{clock: clock, limit: 0, interval: time.Second}
	lim := New(b, WithClock(clock))
	for i := range 5000 {
		key := "k" + strconv.Itoa(i)
		require.ErrorIs(t, lim.Key(key).Acquire(context.Background(), 0), ErrTimeout)
		if i%1000 == 999 {
			clock.Advance(2 * time.Second)
		}
	}
	assert.Less(t, lim.states.count(), 2100, "keys idle past their refusal are forgotten")
}

// TestAForeverWaitQueuesAtAClosedGateWhenTheClockWentBack: a caller
// that waits for ever queues at a closed gate until its context ends,
// even on a clock set back before the Limiter's start (a fake or custom
// clock), where the Limiter's time base is negative and "no deadline less
// now" would overflow into no wait at all.
func TestAForeverWaitQueuesAtAClosedGateWhenTheClockWentBack(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := New(grantAll{}, WithClock(clock))
	defer lim.Close()
	st := lim.state("")
	st.gate.leave(false, time.Hour)
	lim.release(st)
	clock.Advance(-2 * time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- lim.Acquire(ctx, Forever) }()
	bctx, bcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer bcancel()
	require.NoError(t, clock.BlockUntilContext(bctx, 1), "the caller queues at the gate")
	cancel()
	err := <-done
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, ErrTimeout, "a Forever wait has no end to run out")
}

// grantAll is a bucket that grants everything at once.
type grantAll struct{}

func (grantAll) Take(context.Context, string, int64, time.Duration) (Decision, error) {
	return Decision{Granted: true, Limit: 100, Remaining: 50, Reset: time.Second}, nil
}

// TestAGateOpenedByAGiveBackKeepsNothing: once a give-back has opened a
// gate closed for an hour and its queue has drained, the gate keeps no
// timer for the hour's end, so the key can be forgotten when idle.
func TestAGateOpenedByAGiveBackKeepsNothing(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := New(grantAll{}, WithClock(clock))
	defer lim.Close()
	st := lim.state("k")
	defer lim.release(st)
	st.gate.leave(false, time.Hour)
	done := make(chan error, 1)
	go func() { done <- lim.Key("k").Acquire(context.Background(), 2*time.Hour) }()
	eventually(t, func() bool { return st.gate.queued.Load() == 1 }, "the caller queued at the closed gate")
	st.givingBack()() // a give-back of the key begins and ends
	select {
	case err := <-done:
		require.NoError(t, err, "let in and granted")
	case <-time.After(5 * time.Second):
		t.Fatal("the caller queued was not let in by the give-back")
	}
	assert.True(t, st.gate.idle(lim.tb.now()), "no timer kept for the hour's end")
}

// TestAGatePastAPauseStopsReadingTheClock: after a pause nobody queued
// at, the first caller past it resets the gate, so that the next callers
// pass it with two atomic loads, without reading the clock.
func TestAGatePastAPauseStopsReadingTheClock(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := New(grantAll{}, WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	require.NoError(t, lim.Report(ctx, Answer{Retry: true, RetryAfter: time.Second}))
	require.ErrorIs(t, lim.Acquire(ctx, 0), ErrTimeout, "held in the pause")
	clock.Advance(time.Second)
	require.NoError(t, lim.Acquire(ctx, 0))
	assert.Zero(t, lim.root.gate.closedUntil.Load(), "the gate forgot the pause")
}
