package throttle_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
)

// gate is a test bucket that never reserves: it grants every permit from
// time open on (on its clock) and before that refuses, naming open. It
// counts the calls made to it, to prove that waiting does not poll.
type gate struct {
	clock clockwork.Clock
	open  time.Time
	calls atomic.Int64
}

func (g *gate) Take(_ context.Context, _ string, _ int64, _ time.Duration) (throttle.Decision, error) {
	g.calls.Add(1)
	if now := g.clock.Now(); now.Before(g.open) {
		return throttle.Decision{Delay: g.open.Sub(now)}, nil
	}
	return throttle.Decision{Granted: true}, nil
}

// result runs f in a goroutine and returns a channel that gets its error.
func result(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// waitForSleepers blocks until n goroutines sleep on clock, failing the
// test after 10 s of real time.
func waitForSleepers(t *testing.T, clock *clockwork.FakeClock, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, clock.BlockUntilContext(ctx, n), "waiting for %d sleeper(s) on the fake clock", n)
}

func newLocal(t *testing.T, clock clockwork.Clock, limit int64, interval time.Duration, opts ...throttle.LocalOption) *throttle.Local {
	t.Helper()
	b, err := throttle.NewLocal(limit, interval, append([]throttle.LocalOption{throttle.WithClock(clock)}, opts...)...)
	require.NoError(t, err)
	return b
}

func TestAcquireFreePermit(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newLocal(t, clock, 2, time.Second), throttle.WithClock(clock))
	require.NoError(t, lim.Acquire(context.Background(), 0))
	require.NoError(t, lim.Acquire(context.Background(), 0))
	err := lim.Acquire(context.Background(), 0)
	require.ErrorIs(t, err, throttle.ErrTimeout, "the third permit in a 2-per-second bucket is not free now")
	assert.Contains(t, err.Error(), "maxWait is 0")
}

func TestAcquireWaitsThenGrants(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newLocal(t, clock, 1, time.Second), throttle.WithClock(clock))
	require.NoError(t, lim.Acquire(context.Background(), 0))

	done := result(func() error { return lim.Acquire(context.Background(), 2*time.Second) })
	waitForSleepers(t, clock, 1)
	select {
	case err := <-done:
		t.Fatalf("Acquire returned %v before the clock reached the reserved slot", err)
	default:
	}
	clock.Advance(999 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Acquire returned %v 1 ms before its slot", err)
	default:
	}
	clock.Advance(time.Millisecond)
	require.NoError(t, <-done)
}

func TestAcquireFailsFastBeyondMaxWait(t *testing.T) {
	clock := clockwork.NewFakeClock()
	g := &gate{clock: clock, open: clock.Now().Add(time.Hour)}
	lim := throttle.New(g, throttle.WithClock(clock))

	// No clock advance happens in this test: if Acquire slept, it would
	// never return and the test would time out.
	err := lim.Acquire(context.Background(), time.Minute)
	require.ErrorIs(t, err, throttle.ErrTimeout)
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "maxWait, not a context, bounded this wait")
	assert.Equal(t, int64(1), g.calls.Load(), "one look at the bucket is enough to know")
	assert.Contains(t, err.Error(), "beyond maxWait 1m0s")
}

func TestAcquireContextCancelledMidWait(t *testing.T) {
	clock := clockwork.NewFakeClock()
	g := &gate{clock: clock, open: clock.Now().Add(time.Hour)}
	lim := throttle.New(g, throttle.WithClock(clock))

	ctx, cancel := context.WithCancel(context.Background())
	done := result(func() error { return lim.Acquire(ctx, throttle.Forever) })
	waitForSleepers(t, clock, 1)
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
		assert.NotErrorIs(t, err, throttle.ErrTimeout)
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire did not return after its context was cancelled")
	}
	// goleak in TestMain checks that the waiter left nothing behind.
}

func TestAcquireContextDeadlineShorterThanMaxWait(t *testing.T) {
	clock := clockwork.NewFakeClock()
	g := &gate{clock: clock, open: clock.Now().Add(time.Second)}
	lim := throttle.New(g, throttle.WithClock(clock))

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := lim.Acquire(ctx, time.Minute)
	require.ErrorIs(t, err, throttle.ErrTimeout, "the gate opens after the context's deadline: fail fast")
	require.ErrorIs(t, err, context.DeadlineExceeded, "the context's deadline was the bound")
	assert.Equal(t, int64(1), g.calls.Load())
}

func TestAcquireForeverWaitsAsLongAsItTakes(t *testing.T) {
	clock := clockwork.NewFakeClock()
	g := &gate{clock: clock, open: clock.Now().Add(72 * time.Hour)}
	lim := throttle.New(g, throttle.WithClock(clock))

	done := result(func() error { return lim.Acquire(context.Background(), throttle.Forever) })
	waitForSleepers(t, clock, 1)
	clock.Advance(72 * time.Hour)
	require.NoError(t, <-done)
}

// TestAcquireDoesNotPoll proves that a waiter sleeps until the time the
// bucket named: over a long wait, advanced in small steps, the bucket is
// asked once at the start and once when the gate opens.
func TestAcquireDoesNotPoll(t *testing.T) {
	clock := clockwork.NewFakeClock()
	g := &gate{clock: clock, open: clock.Now().Add(10 * time.Second)}
	lim := throttle.New(g, throttle.WithClock(clock))

	done := result(func() error { return lim.Acquire(context.Background(), time.Minute) })
	waitForSleepers(t, clock, 1)
	for range 99 {
		clock.Advance(100 * time.Millisecond)
	}
	assert.Equal(t, int64(1), g.calls.Load(), "the waiter asked the bucket again before the time it named")
	clock.Advance(100 * time.Millisecond)
	require.NoError(t, <-done)
	assert.Equal(t, int64(2), g.calls.Load())
}

func TestAcquireNLargerThanTheBucketCanEverHold(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newLocal(t, clock, 10, time.Second), throttle.WithClock(clock))
	err := lim.AcquireN(context.Background(), 11, throttle.Forever)
	require.ErrorIs(t, err, throttle.ErrExceedsLimit)
	assert.Contains(t, err.Error(), "at most 10")
	require.NoError(t, lim.AcquireN(context.Background(), 10, 0), "the whole burst at once is allowed")
}

func TestAcquireBadArguments(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newLocal(t, clock, 10, time.Second))
	ctx := context.Background()
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"n zero", func() error { return lim.AcquireN(ctx, 0, 0) }, "n = 0"},
		{"n negative", func() error { return lim.AcquireN(ctx, -3, time.Second) }, "n = -3"},
		{"maxWait negative", func() error { return lim.Acquire(ctx, -time.Second) }, "maxWait = -1s"},
		{"nil bucket", func() error { return throttle.New(nil).Acquire(ctx, 0) }, "Bucket = <nil>"},
		{"zero Keyed", func() error { return throttle.Keyed{}.Acquire(ctx, 0) }, "zero Keyed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			require.ErrorIs(t, err, throttle.ErrInvalid)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestAcquireOnDoneContext(t *testing.T) {
	clock := clockwork.NewFakeClock()
	g := &gate{clock: clock}
	lim := throttle.New(g, throttle.WithClock(clock))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, lim.Acquire(ctx, time.Second), context.Canceled)
	assert.Zero(t, g.calls.Load(), "a done context must not cost a bucket call")
}

// TestManyGoroutinesEachReturnOnce: 10,000 callers on one limiter; every
// call returns exactly once and the grants are exactly what the bucket
// allows.
func TestManyGoroutinesEachReturnOnce(t *testing.T) {
	const callers = 10_000

	t.Run("no wait", func(t *testing.T) {
		clock := clockwork.NewFakeClock()
		lim := throttle.New(newLocal(t, clock, 250, time.Second), throttle.WithClock(clock))
		var granted, timedOut, returned atomic.Int64
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				err := lim.Acquire(context.Background(), 0)
				returned.Add(1)
				switch {
				case err == nil:
					granted.Add(1)
				case errors.Is(err, throttle.ErrTimeout):
					timedOut.Add(1)
				default:
					t.Errorf("unexpected error: %v", err)
				}
			})
		}
		wg.Wait()
		assert.Equal(t, int64(callers), returned.Load())
		assert.Equal(t, int64(250), granted.Load(), "the bucket holds 250 permits and time stands still")
		assert.Equal(t, int64(callers-250), timedOut.Load())
	})

	t.Run("waiting", func(t *testing.T) {
		// 1,000 per second with a burst of 1,000: 1,000 callers go at once,
		// and the other 9,000 hold reservations up to 9 s ahead. Callers
		// allowed to wait 5 s get the slots up to 5 s: 1,000 + 5,000.
		clock := clockwork.NewFakeClock()
		lim := throttle.New(newLocal(t, clock, 1000, time.Second), throttle.WithClock(clock))
		var granted, timedOut atomic.Int64
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				err := lim.Acquire(context.Background(), 5*time.Second)
				switch {
				case err == nil:
					granted.Add(1)
				case errors.Is(err, throttle.ErrTimeout):
					timedOut.Add(1)
				default:
					t.Errorf("unexpected error: %v", err)
				}
			})
		}
		// Everyone has either returned (at once) or sleeps on a reservation.
		waitForSleepers(t, clock, 5000)
		clock.Advance(5 * time.Second)
		wg.Wait()
		assert.Equal(t, int64(6000), granted.Load())
		assert.Equal(t, int64(4000), timedOut.Load())
	})
}

func TestKeysHaveSeparateBudgets(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newLocal(t, clock, 1, time.Second), throttle.WithClock(clock))
	ctx := context.Background()
	require.NoError(t, lim.Key("tenant-a").Acquire(ctx, 0))
	require.ErrorIs(t, lim.Key("tenant-a").Acquire(ctx, 0), throttle.ErrTimeout, "tenant-a spent its budget")
	require.NoError(t, lim.Key("tenant-b").Acquire(ctx, 0), "tenant-a's use must not touch tenant-b's budget")
	require.NoError(t, lim.Acquire(ctx, 0), "the default key has its own budget too")
	assert.Equal(t, "tenant-a", lim.Key("tenant-a").Key())
	assert.Equal(t, lim.Key("x"), lim.Key("x"), "Keyed values of one Limiter and key are equal")
	assert.NotEqual(t, lim.Key("x"), lim.Key("y"))
}

func TestAbandonedReservationIsRefunded(t *testing.T) {
	clock := clockwork.NewFakeClock()
	lim := throttle.New(newLocal(t, clock, 1, time.Second), throttle.WithClock(clock))
	require.NoError(t, lim.Acquire(context.Background(), 0))

	ctx, cancel := context.WithCancel(context.Background())
	done := result(func() error { return lim.Acquire(ctx, 10*time.Second) })
	waitForSleepers(t, clock, 1) // holds the slot at +1 s
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)

	// Had the slot at +1 s not been given back, the next one would be at
	// +2 s, beyond a 1 s wait.
	next := result(func() error { return lim.Acquire(context.Background(), time.Second) })
	waitForSleepers(t, clock, 1)
	clock.Advance(time.Second)
	require.NoError(t, <-next)
}
