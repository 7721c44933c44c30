package throttle

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewLocalRefusesBadConfig(t *testing.T) {
	tests := []struct {
		limit    int64
		interval time.Duration
		opts     []LocalOption
		want     string
	}{
		{0, time.Second, nil, "limit = 0"},
		{-5, time.Second, nil, "limit = -5"},
		{10, 0, nil, "interval = 0s"},
		{10, -time.Second, nil, "interval = -1s"},
		{2_000_000_000, time.Second, nil, "at most one per nanosecond"},
		{10, time.Second, []LocalOption{WithLocalBurst(-1)}, "burst = -1"},
		{1, time.Duration(1 << 62), []LocalOption{WithLocalBurst(1 << 40)}, "overflows"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			b, err := NewLocal(tt.limit, tt.interval, tt.opts...)
			require.ErrorIs(t, err, ErrInvalid)
			assert.Nil(t, b)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

// TestLocalArithmetic walks a Local bucket through a timeline and checks
// each decision.
func TestLocalArithmetic(t *testing.T) {
	type step struct {
		at      time.Duration // since start
		n       int64
		maxWait time.Duration
		granted bool
		delay   time.Duration
		remain  int64
	}
	tests := []struct {
		name     string
		limit    int64
		interval time.Duration
		burst    int64
		steps    []step
	}{
		{"burst then refill", 4, time.Second, 0, []step{
			{0, 4, 0, true, 0, 0},
			{0, 1, 0, false, 250 * time.Millisecond, 0},
			{250 * time.Millisecond, 1, 0, true, 0, 0},
			{time.Second, 2, 0, true, 0, 1},
			{3 * time.Second, 4, 0, true, 0, 0},
		}},
		{"reservations queue in order", 10, time.Second, 1, []step{
			{0, 1, 0, true, 0, 0},
			{0, 1, time.Second, true, 100 * time.Millisecond, 0},
			{0, 1, time.Second, true, 200 * time.Millisecond, 0},
			{0, 1, 250 * time.Millisecond, false, 300 * time.Millisecond, 0},
			{0, 1, 300 * time.Millisecond, true, 300 * time.Millisecond, 0},
		}},
		{"denied calls consume nothing", 2, time.Second, 0, []step{
			{0, 2, 0, true, 0, 0},
			{0, 1, 0, false, 500 * time.Millisecond, 0},
			{0, 1, 0, false, 500 * time.Millisecond, 0},
			{500 * time.Millisecond, 1, 0, true, 0, 0},
		}},
		// 1 s / 3 = 333,333,333.3 ns, rounded up to a whole ns per permit
		// so that the rate never exceeds the limit.
		{"uneven division rounds the rate down", 3, time.Second, 1, []step{
			{0, 1, 0, true, 0, 0},
			{333 * time.Millisecond, 1, 0, false, 333_334, 0},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			opts := []LocalOption{WithClock(clock)}
			if tt.burst != 0 {
				opts = append(opts, WithLocalBurst(tt.burst))
			}
			b, err := NewLocal(tt.limit, tt.interval, opts...)
			require.NoError(t, err)
			start := clock.Now()
			for i, s := range tt.steps {
				clock.Advance(start.Add(s.at).Sub(clock.Now()))
				d, err := b.Take(context.Background(), "", s.n, s.maxWait)
				require.NoError(t, err)
				msg := fmt.Sprintf("step %d at %v: %+v", i, s.at, d)
				assert.Equal(t, s.granted, d.Granted, msg)
				assert.Equal(t, s.delay, d.Delay, msg)
				assert.Equal(t, s.remain, d.Remaining, msg)
				assert.Equal(t, tt.limit, d.Limit, msg)
			}
		})
	}
}

// TestLocalGuarantee checks Local's stated guarantee, at most
// burst + limit·t/interval in any span t, on a long run of greedy takes
// at random-ish times.
func TestLocalGuarantee(t *testing.T) {
	clock := clockwork.NewFakeClock()
	const limit, burst = 50, 10
	b, err := NewLocal(limit, time.Second, WithClock(clock), WithLocalBurst(burst))
	require.NoError(t, err)
	var grants []time.Duration
	start := clock.Now()
	for i := range 20_000 {
		clock.Advance(time.Duration(i%7) * time.Millisecond)
		for {
			d, err := b.Take(context.Background(), "", 1, 0)
			require.NoError(t, err)
			if !d.Granted {
				break
			}
			grants = append(grants, clock.Since(start))
		}
	}
	// Every window [grants[i], grants[j]] holds j-i+1 grants.
	lo := 0
	for hi := range grants {
		for lo < hi {
			// n grants fit in span iff (n - burst)·(interval/limit) ≤ span;
			// in integer nanoseconds to stay exact.
			span := grants[hi] - grants[lo]
			n := int64(hi - lo + 1)
			if (n-burst)*int64(time.Second/limit) <= int64(span) {
				break
			}
			t.Fatalf("%d grants within %v, more than burst + rate·t", n, span)
		}
	}
	total := clock.Since(start).Seconds()
	assert.GreaterOrEqual(t, float64(len(grants)), 0.99*limit*total, "a greedy caller should get nearly the whole rate")
}

func TestLocalForgetsIdleKeys(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b, err := NewLocal(5, time.Second, WithClock(clock))
	require.NoError(t, err)
	for round := range 20 {
		for k := range 1000 {
			_, err := b.Take(context.Background(), fmt.Sprintf("r%d-k%d", round, k), 1, 0)
			require.NoError(t, err)
		}
		clock.Advance(2 * time.Second) // every key is full again
	}
	assert.Less(t, b.keys(), 5000, "keys idle for longer than an interval must be swept, not kept forever")
}

// TestLocalGivesBackOnlyAnAbandonedReservation: Local cannot tell which
// permits a refund would return, so it is no Refunder; only a Limiter's
// abandoned reservation, named exactly, goes back.
func TestLocalGivesBackOnlyAnAbandonedReservation(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b, err := NewLocal(2, time.Second, WithClock(clock))
	require.NoError(t, err)
	_, refunds := BucketAs[Refunder](b)
	require.False(t, refunds, "Local is no Refunder")
	ctx := context.Background()
	for _, key := range []string{"", "k"} {
		d, _ := b.Take(ctx, key, 2, 0)
		require.True(t, d.Granted)
		d, _ = b.Take(ctx, key, 1, 0)
		require.False(t, d.Granted, "key %q: spent", key)

		// A reservation that is still the last one booked goes back exactly.
		d, _ = b.Take(ctx, key, 1, time.Second)
		require.True(t, d.Granted)
		require.Positive(t, d.Delay)
		require.NotNil(t, d.Cancel)
		require.NoError(t, d.Cancel(context.Background()))
		d2, _ := b.Take(ctx, key, 1, time.Second)
		require.Equal(t, d.Delay, d2.Delay, "key %q: the abandoned slot is booked again", key)
		clock.Advance(2 * time.Second)
	}
}

func BenchmarkLocalTake(b *testing.B) {
	l, err := NewLocal(1<<40, time.Hour)
	require.NoError(b, err)
	ctx := context.Background()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, _ = l.Take(ctx, "", 1, 0)
		}
	})
}
