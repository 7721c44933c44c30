package throttle

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
)

// TestAcquireCostWithPlainBucket: a bucket of one dimension takes a Cost
// of one dimension as AcquireN, charges a Settle up at once when it has
// the permits, says it cannot hold a debt when it has not, and refuses a
// Cost of several dimensions with a hint.
func TestAcquireCostWithPlainBucket(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b, err := NewLocal(5, time.Second, WithClock(clock))
	require.NoError(t, err)
	lim := New(b, WithClock(clock))
	t.Cleanup(func() { lim.Close() })
	ctx := context.Background()

	acquire := func(k Keyed, c Cost) *CostGrant {
		t.Helper()
		g, err := k.AcquireCost(ctx, c, 0)
		require.NoError(t, err)
		return g
	}
	g := acquire(lim.Key(""), Cost{"requests": 3})
	// One more request than estimated: charged now (4 of 5 used).
	require.NoError(t, g.Settle(ctx, Cost{"requests": 4}))
	acquire(lim.Key(""), Cost{"requests": 1, "tokens": 0}) // the fifth permit
	_, err = lim.AcquireCost(ctx, Cost{"requests": 1}, 0)
	require.ErrorIs(t, err, ErrTimeout, "a sixth permit in the second")
	// A charge the bucket cannot grant now is not taken, and says why.
	k := lim.Key("k")
	g = acquire(k, Cost{"requests": 4})
	err = g.Settle(ctx, Cost{"requests": 6})
	require.ErrorIs(t, err, ErrTimeout)
	require.ErrorContains(t, err, "debt")
	acquire(k, Cost{"requests": 1}) // the charge refused took nothing
	// Giving back goes through the Refunder (a Local keeps them): no error.
	clock.Advance(time.Second)
	require.NoError(t, acquire(lim.Key(""), Cost{"requests": 2}).Settle(ctx, Cost{"requests": 1}))

	_, err = lim.AcquireCost(ctx, Cost{"requests": 1, "tokens": 10}, 0)
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "bucket.NewBudget")
	err = acquire(lim.Key(""), Cost{"requests": 1}).Settle(ctx, Cost{"requests": 2, "tokens": 20})
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "actual = ")
}

// TestAcquireCostRefusesBadInput: bad costs and waits name the field,
// before the bucket is asked.
func TestAcquireCostRefusesBadInput(t *testing.T) {
	b, err := NewLocal(5, time.Second)
	require.NoError(t, err)
	lim := New(b)
	t.Cleanup(func() { lim.Close() })
	ctx := context.Background()
	noBucket := New(nil)
	t.Cleanup(func() { noBucket.Close() })
	acquireErr := func(k Keyed, c Cost, maxWait time.Duration) error {
		g, err := k.AcquireCost(ctx, c, maxWait)
		if (g == nil) == (err == nil) {
			t.Errorf("AcquireCost(%v) = %v, %v: want a grant or an error", c, g, err)
		}
		return err
	}
	l := lim.Key("")
	granted, err := lim.AcquireCost(ctx, Cost{"a": 1}, 0)
	require.NoError(t, err)
	tests := []struct {
		name  string
		err   error
		field string
	}{
		{"empty", acquireErr(l, Cost{}, 0), "cost"},
		{"nil", acquireErr(l, nil, 0), "cost"},
		{"all zero", acquireErr(l, Cost{"a": 0, "b": 0}, 0), "cost"},
		{"negative", acquireErr(l, Cost{"a": -1, "b": 2}, 0), `cost["a"]`},
		{"empty name", acquireErr(l, Cost{"": 1}, 0), "cost"},
		{"negative wait", acquireErr(l, Cost{"a": 1}, -time.Second), "maxWait"},
		{"negative actual", granted.Settle(ctx, Cost{"a": -1}), `actual["a"]`},
		{"zero Keyed", acquireErr(Keyed{}, Cost{"a": 1}, 0), "Keyed"},
		{"nil grant", (*CostGrant)(nil).Settle(ctx, Cost{"a": 2}), "CostGrant"},
		{"no bucket", acquireErr(noBucket.Key(""), Cost{"a": 1}, 0), "Bucket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.ErrorIs(t, tt.err, ErrInvalid)
			require.Contains(t, tt.err.Error(), tt.field)
		})
	}
	// Nothing to settle: no call, no error; a grant settles once.
	require.NoError(t, granted.Settle(ctx, Cost{"a": 1}))
	err = granted.Settle(ctx, Cost{"a": 1})
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "settled twice")
	// A cancelled context ends AcquireCost with its error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = lim.AcquireCost(cctx, Cost{"a": 1}, time.Second)
	require.True(t, errors.Is(err, context.Canceled), "err = %v", err)
}

func TestCostString(t *testing.T) {
	got := Cost{"tokens": 800, "requests": 1}.String()
	if got != "requests=1 tokens=800" {
		t.Fatalf("String = %q", got)
	}
}

// downRefunder is a bucket of one dimension whose store is down while
// down is set; it counts the permits given back to it.
type downRefunder struct {
	down     atomic.Bool
	refunded atomic.Int64
}

func (b *downRefunder) Take(context.Context, string, int64, time.Duration) (Decision, error) {
	if b.down.Load() {
		return Decision{}, &BackendError{Op: "take", Err: errors.New("store down")}
	}
	return Decision{Granted: true, Limit: 100, Remaining: 50}, nil
}

func (b *downRefunder) Refund(_ context.Context, _ string, n int64) error {
	b.refunded.Add(n)
	return nil
}

// TestPolicyGrantOfAPlainBucketGivesNothingBack: a cost that the failure
// policy granted while a one-dimension bucket's store was down took
// nothing from the bucket; its Settle, once the store is back, gives
// nothing back to it (which would grant the permits twice), as a
// Budget's policy grant does.
func TestPolicyGrantOfAPlainBucketGivesNothingBack(t *testing.T) {
	b := &downRefunder{}
	lim := New(b, WithFailurePolicy(FailOpen))
	t.Cleanup(func() { lim.Close() })
	ctx := context.Background()
	b.down.Store(true)
	g, err := lim.AcquireCost(ctx, Cost{"requests": 5}, 0)
	require.NoError(t, err, "FailOpen grants while the store is down")
	b.down.Store(false)
	require.NoError(t, g.Settle(ctx, Cost{"requests": 1}))
	require.Zero(t, b.refunded.Load(), "permits given back for a grant that took none")
	// A grant of the store gives back what it did not use.
	g, err = lim.AcquireCost(ctx, Cost{"requests": 5}, 0)
	require.NoError(t, err)
	require.NoError(t, g.Settle(ctx, Cost{"requests": 1}))
	require.EqualValues(t, 4, b.refunded.Load())
}

// refusingCost is a CostBucket that refuses its first cost for delay,
// then grants every cost.
type refusingCost struct {
	*Local
	delay time.Duration
	calls atomic.Int64
}

func (b *refusingCost) TakeCost(context.Context, string, Cost, time.Duration) (Decision, error) {
	if b.calls.Add(1) == 1 {
		return Decision{Delay: b.delay}, nil
	}
	return Decision{Granted: true}, nil
}

// TestAcquireCostSleepsOutARefusalBeforeAskingAgain: a cost refused for a
// delay is asked for again only once the delay has passed on the
// Limiter's clock, not at once.
func TestAcquireCostSleepsOutARefusalBeforeAskingAgain(t *testing.T) {
	clock := clockwork.NewFakeClock()
	local, err := NewLocal(5, time.Second, WithClock(clock))
	require.NoError(t, err)
	b := &refusingCost{Local: local, delay: 40 * time.Millisecond}
	lim := New(b, WithClock(clock))
	defer lim.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := lim.AcquireCost(ctx, Cost{"tokens": 3}, time.Second)
		done <- err
	}()
	require.NoError(t, clock.BlockUntilContext(ctx, 1)) // sleeping out the refusal
	select {
	case err := <-done:
		t.Fatalf("AcquireCost returned %v before the refusal's delay had passed", err)
	default:
	}
	require.Equal(t, int64(1), b.calls.Load(), "asked again before the delay had passed")
	clock.Advance(40 * time.Millisecond)
	require.NoError(t, <-done)
	require.Equal(t, int64(2), b.calls.Load())
}
