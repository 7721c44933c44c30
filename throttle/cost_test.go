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

	require.NoError(t, lim.AcquireCost(ctx, Cost{"requests": 3}, 0))
	// One more request than estimated: charged now (4 of 5 used).
	require.NoError(t, lim.Settle(ctx, Cost{"requests": 3}, Cost{"requests": 4}))
	require.NoError(t, lim.AcquireCost(ctx, Cost{"requests": 1, "tokens": 0}, 0), "the fifth permit")
	require.ErrorIs(t, lim.AcquireCost(ctx, Cost{"requests": 1}, 0), ErrTimeout, "a sixth permit in the second")
	// A charge the bucket cannot grant now is not taken, and says why.
	k := lim.Key("k")
	require.NoError(t, k.AcquireCost(ctx, Cost{"requests": 4}, 0))
	err = k.Settle(ctx, Cost{"requests": 4}, Cost{"requests": 6})
	require.ErrorIs(t, err, ErrTimeout)
	require.ErrorContains(t, err, "debt")
	require.NoError(t, k.AcquireCost(ctx, Cost{"requests": 1}, 0), "the charge refused took nothing")
	// Giving back goes through the Refunder (a Local keeps them): no error.
	require.NoError(t, lim.Settle(ctx, Cost{"requests": 2}, Cost{"requests": 1}))

	err = lim.AcquireCost(ctx, Cost{"requests": 1, "tokens": 10}, 0)
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "bucket.NewBudget")
	err = lim.Settle(ctx, Cost{"requests": 1, "tokens": 10}, Cost{"requests": 2, "tokens": 20})
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
	tests := []struct {
		name  string
		err   error
		field string
	}{
		{"empty", lim.AcquireCost(ctx, Cost{}, 0), "cost"},
		{"nil", lim.AcquireCost(ctx, nil, 0), "cost"},
		{"all zero", lim.AcquireCost(ctx, Cost{"a": 0, "b": 0}, 0), "cost"},
		{"negative", lim.AcquireCost(ctx, Cost{"a": -1, "b": 2}, 0), `cost["a"]`},
		{"empty name", lim.AcquireCost(ctx, Cost{"": 1}, 0), "cost"},
		{"negative wait", lim.AcquireCost(ctx, Cost{"a": 1}, -time.Second), "maxWait"},
		{"negative estimate", lim.Settle(ctx, Cost{"a": -1}, Cost{"a": 1}), `estimated["a"]`},
		{"negative actual", lim.Settle(ctx, Cost{"a": 1}, Cost{"a": -1}), `actual["a"]`},
		{"zero Keyed", Keyed{}.AcquireCost(ctx, Cost{"a": 1}, 0), "Keyed"},
		{"zero Keyed settle", Keyed{}.Settle(ctx, Cost{"a": 1}, Cost{"a": 2}), "Keyed"},
		{"no bucket", noBucket.AcquireCost(ctx, Cost{"a": 1}, 0), "Bucket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.ErrorIs(t, tt.err, ErrInvalid)
			require.Contains(t, tt.err.Error(), tt.field)
		})
	}
	// Nothing to settle: no call, no error.
	require.NoError(t, lim.Settle(ctx, Cost{"a": 3}, Cost{"a": 3}))
	// A cancelled context ends AcquireCost with its error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	err = lim.AcquireCost(cctx, Cost{"a": 1}, time.Second)
	require.True(t, errors.Is(err, context.Canceled), "err = %v", err)
}

func TestCostString(t *testing.T) {
	got := Cost{"tokens": 800, "requests": 1}.String()
	if got != "requests=1 tokens=800" {
		t.Fatalf("String = %q", got)
	}
}
