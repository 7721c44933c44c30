package throttle

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

// periodCount grants everything, in periods of 100 ms on its clock, and
// counts the permits it grants and takes back in each period. during, when
// set, runs inside Take before it decides (the time the store takes to
// answer); noReset makes its answers report no Reset.
type periodCount struct {
	clock    clockwork.Clock
	epoch    time.Time
	during   func()
	noReset  atomic.Bool
	granted  [4]atomic.Int64
	refunded [4]atomic.Int64
}

const periodCountLen = 100 * time.Millisecond

func (b *periodCount) period() int { return int(b.clock.Since(b.epoch) / periodCountLen) }

func (b *periodCount) Take(_ context.Context, _ string, n int64, _ time.Duration) (Decision, error) {
	if f := b.during; f != nil {
		f()
	}
	b.granted[b.period()].Add(n)
	d := Decision{Granted: true, Limit: 100, Remaining: 50}
	if !b.noReset.Load() {
		d.Reset = periodCountLen - b.clock.Since(b.epoch)%periodCountLen
	}
	return d, nil
}

func (b *periodCount) Refund(_ context.Context, _ string, n int64) error {
	b.refunded[b.period()].Add(n)
	return nil
}

// TestLeaseGrantsNoHeldPermitsOnceTheirPeriodEnded: a weighted take that
// refills the lease holds the few permits left in it; when the bucket's
// answer comes after their period ended, and the key's lease may not keep
// the new batch (paused meanwhile, or the answer had no Reset), the caller
// is granted only permits of the new period: the bucket is left charged
// for all n of them in that period.
func TestLeaseGrantsNoHeldPermitsOnceTheirPeriodEnded(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		meanwhile func(*Limiter, *periodCount)
	}{
		{"answer without Reset", func(_ *Limiter, b *periodCount) { b.noReset.Store(true) }},
		{"paused meanwhile", func(l *Limiter, _ *periodCount) {
			require.NoError(t, l.Report(ctx, Answer{Retry: true, RetryAfter: time.Second}))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			b := &periodCount{clock: clock, epoch: clock.Now()}
			lim := New(b, WithClock(clock), WithLeasing(Leasing{Horizon: time.Second, Share: 1}))
			defer lim.Close()
			require.NoError(t, lim.Acquire(ctx, 0))
			require.NoError(t, lim.Acquire(ctx, 0))
			held := lim.root.lease.cur.Load().left.Load()
			require.Positive(t, held, "the lease holds permits of period 0")
			const n = 10
			require.Less(t, held, int64(n))
			b.during = func() {
				b.during = nil
				clock.Advance(periodCountLen + periodCountLen/2) // period 0 has ended
				tc.meanwhile(lim, b)
			}
			err := lim.AcquireN(ctx, n, 0)
			if err == nil {
				kept := b.granted[1].Load() - b.refunded[1].Load()
				assert.GreaterOrEqual(t, kept, int64(n), "permits the bucket was left charged for in the period the %d were granted in", n)
			}
		})
	}
}

// TestLeaseGrantsAWeightedTakeWithinTheBucketsBurst: with leasing, a
// weighted take of more permits than Decision.Limit but within the bucket's
// burst is granted, as without leasing (a Local of limit 10 and burst 20
// grants 15 at once): Decision.Limit is the rate per interval, not what the
// bucket can grant at once.
func TestLeaseGrantsAWeightedTakeWithinTheBucketsBurst(t *testing.T) {
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

// TestLeaseShorterThanItsHorizonTakesWhatItsTTLUses: a lease whose TTL is
// shorter than its Horizon takes per batch what the demand uses in TTL, not
// in Horizon: the rest would expire unused, permits of the shared bucket
// lost to every instance of the fleet. Demand: one permit a millisecond;
// Horizon 200 ms, TTL 10 ms: at most 2 permits taken per permit handed out
// (a Horizon's worth per batch took about 20).
func TestLeaseShorterThanItsHorizonTakesWhatItsTTLUses(t *testing.T) {
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
