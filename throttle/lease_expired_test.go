package throttle

import (
	"context"
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
