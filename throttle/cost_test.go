package throttle

import (
	"context"
	"errors"
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
