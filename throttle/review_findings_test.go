package throttle

// Findings of the adversarial review of the per-key state redesign. Each
// test below FAILS on the code it was written against (branch core at
// 7d1b670) unless its comment says it was fixed; the comment names the
// severity.

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// KeyStatesKept is how many key states l keeps (key "" aside), for the
// tests of package throttle_test.
func KeyStatesKept(l *Limiter) int { return l.states.count() }

// sweepAll makes every shard of lim's states due for a sweep and sweeps
// it, by advancing the clock past the idle window and acquiring a key
// nobody else uses enough times to visit every shard.
func sweepAll(t *testing.T, lim *Limiter, clock *clockwork.FakeClock, idle time.Duration) {
	t.Helper()
	clock.Advance(idle + time.Second)
	for range 2 * stateShards {
		require.NoError(t, lim.Key("sweeper").Acquire(context.Background(), 0))
	}
}

// FINDING (wrong refusal; fixed): with leasing, a weighted take of
// more permits than Decision.Limit but within the bucket's burst fails with
// ErrExceedsLimit, although the bucket grants it (a Local of limit 10 and
// burst 20 grants 15 at once without leasing). The lease checks n against
// Decision.Limit, which is the rate per interval, not what the bucket can
// grant at once.
func TestFindingLeasingRefusesWeightedTakeWithinTheBucketsBurst(t *testing.T) {
	ctx := context.Background()
	for _, leasing := range []bool{false, true} {
		t.Run("leasing="+strconv.FormatBool(leasing), func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			loc, err := NewLocal(10, time.Second, WithClock(clock), WithLocalBurst(20))
			require.NoError(t, err)
			opts := []LimiterOption{WithClock(clock)}
			if leasing {
				opts = append(opts, WithLeasing(Leasing{TTL: 100 * time.Millisecond}))
			}
			lim := New(loc, opts...)
			defer lim.Close()
			require.NoError(t, lim.Acquire(ctx, 0))
			assert.NoError(t, lim.AcquireN(ctx, 15, 0), "15 of a burst of 20, 19 left")
		})
	}
}

// windowUse is a fixed-window bucket (limit per interval) that counts
// every permit it grants, for the lease tests.
type windowUse struct {
	clock    clockwork.Clock
	epoch    time.Time
	limit    int64
	interval time.Duration
	window   atomic.Int64
	used     atomic.Int64
	granted  atomic.Int64 // every permit granted, all windows
}

func (w *windowUse) Take(_ context.Context, _ string, n int64, _ time.Duration) (Decision, error) {
	el := w.clock.Since(w.epoch)
	win := int64(el / w.interval)
	reset := w.interval - el%w.interval
	if w.window.Swap(win) != win {
		w.used.Store(0)
	}
	if u := w.used.Add(n); u > w.limit {
		w.used.Add(-n)
		return Decision{Delay: reset, Limit: w.limit, Remaining: max(w.limit-(u-n), 0), Reset: reset}, nil
	}
	w.granted.Add(n)
	return Decision{Granted: true, Limit: w.limit, Remaining: w.limit - w.used.Load(), Reset: reset}, nil
}

// FINDING (lost permits; fixed): a lease whose TTL is shorter than its
// Horizon fetches a Horizon's worth of demand per batch, but the batch
// expires after TTL: most of it expires unused, permits of the shared
// bucket that no instance of the fleet can use any more. Demand: one
// permit a millisecond; Horizon 200 ms, TTL 10 ms. Before the fix the
// lease took about 20 permits from the bucket per permit it handed out.
func TestFindingLeaseShorterThanItsHorizonWastesTheSharedBucket(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	b := &windowUse{clock: clock, epoch: clock.Now(), limit: 100000, interval: time.Hour}
	lim := New(b, WithClock(clock), WithLeasing(Leasing{Horizon: 200 * time.Millisecond, TTL: 10 * time.Millisecond, Share: 1}))
	defer lim.Close()
	const calls = 2000
	for range calls {
		require.NoError(t, lim.Acquire(ctx, 0))
		clock.Advance(time.Millisecond)
	}
	assert.LessOrEqual(t, b.granted.Load(), int64(2*calls), "permits taken from the bucket for %d handed out", calls)
}
