package throttle

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/internal/capability"
)

func TestNewSmoothRefusesBadConfig(t *testing.T) {
	inner := newWindowBucket(clockwork.NewFakeClock(), 10, time.Second)
	tests := []struct {
		inner    Bucket
		limit    int64
		interval time.Duration
		opts     []SmoothOption
		want     string
	}{
		{nil, 10, time.Second, nil, "inner = <nil>"},
		{inner, 0, time.Second, nil, "limit = 0"},
		{inner, -3, time.Second, nil, "limit = -3"},
		{inner, 10, 0, nil, "interval = 0s"},
		{inner, 10, time.Second, []SmoothOption{WithSmoothInstances(0)}, "instances = 0"},
		{inner, 10, time.Duration(math.MaxInt64 / 2), []SmoothOption{WithSmoothInstances(3)}, "overflows"},
		{inner, 2_000_000_000, time.Second, nil, "at most one per nanosecond"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			s, err := NewSmooth(tt.inner, tt.limit, tt.interval, tt.opts...)
			require.ErrorIs(t, err, ErrInvalid)
			assert.Nil(t, s)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	s, err := NewSmooth(inner, 10, time.Second)
	require.NoError(t, err)
	_, err = s.Take(context.Background(), "", 0, 0)
	require.ErrorIs(t, err, ErrInvalid)
}

// tenths counts grants per tenth of an interval, aligned on start.
type tenths struct {
	clock    clockwork.Clock
	start    time.Time
	interval time.Duration
	count    map[int64]int64
}

func (c *tenths) add(n int64) { c.count[int64(c.clock.Since(c.start)*10/c.interval)] += n }

// check asserts the smoothing target on every complete tenth and returns
// the permits granted per complete interval.
func (c *tenths) check(t *testing.T, limit int64) []int64 {
	t.Helper()
	last := int64(c.clock.Since(c.start) * 10 / c.interval) // incomplete
	var perInterval []int64
	for i := int64(0); i < last; i++ {
		assert.LessOrEqual(t, float64(c.count[i]), 1.5*float64(limit)/10, "tenth %d", i)
		if i%10 == 0 {
			perInterval = append(perInterval, 0)
		}
		perInterval[len(perInterval)-1] += c.count[i]
	}
	if last%10 != 0 {
		perInterval = perInterval[:len(perInterval)-1]
	}
	return perInterval
}

// greedy takes from b until refused, at each millisecond for d, and
// records the grants.
func greedy(t *testing.T, clock *clockwork.FakeClock, d time.Duration, c *tenths, bs ...Bucket) {
	t.Helper()
	for range d / time.Millisecond {
		for _, b := range bs {
			for {
				dec, err := b.Take(context.Background(), "", 1, 0)
				require.NoError(t, err)
				if !dec.Granted {
					require.Positive(t, dec.Delay)
					break
				}
				c.add(1)
			}
		}
		clock.Advance(time.Millisecond)
	}
}

// TestSmoothSpreadsThePermits: over a fixed-window bucket, which alone lets
// a whole window's budget go in its first instant, demand far above the
// limit gets no tenth of an interval above 1.5 × limit/10, and still about
// the limit per interval.
func TestSmoothSpreadsThePermits(t *testing.T) {
	const limit, interval = 200, time.Second
	t.Run("without Smooth the burst is there", func(t *testing.T) {
		clock := clockwork.NewFakeClock()
		c := &tenths{clock: clock, start: clock.Now(), interval: interval, count: map[int64]int64{}}
		greedy(t, clock, 3*interval, c, newWindowBucket(clock, limit, interval))
		assert.Equal(t, int64(limit), c.count[0], "the check below could fail: the whole budget lands in the first tenth")
	})
	clock := clockwork.NewFakeClock()
	s, err := NewSmooth(newWindowBucket(clock, limit, interval), limit, interval, WithClock(clock))
	require.NoError(t, err)
	c := &tenths{clock: clock, start: clock.Now(), interval: interval, count: map[int64]int64{}}
	greedy(t, clock, 5*interval, c, s)
	per := c.check(t, limit)
	require.Len(t, per, 5)
	for i, n := range per {
		assert.InDelta(t, limit, n, 0.02*limit, "interval %d", i)
	}
}

// TestSmoothFleet: four instances, each paced at a quarter, share one
// fixed-window bucket; the fleet as a whole stays smooth.
func TestSmoothFleet(t *testing.T) {
	const limit, interval, k = 400, time.Second, 4
	clock := clockwork.NewFakeClock()
	shared := &counting{Bucket: newWindowBucket(clock, limit, interval)}
	var fleet []Bucket
	for range k {
		s, err := NewSmooth(shared, limit, interval, WithClock(clock), WithSmoothInstances(k))
		require.NoError(t, err)
		fleet = append(fleet, s)
	}
	c := &tenths{clock: clock, start: clock.Now(), interval: interval, count: map[int64]int64{}}
	greedy(t, clock, 5*interval, c, fleet...)
	per := c.check(t, limit)
	require.Len(t, per, 5)
	for i, n := range per {
		assert.InDelta(t, limit, n, 0.02*limit, "interval %d", i)
	}
}

// TestSmoothKeepsItsInnerCapabilities: a Limiter over a Smooth finds
// what the inner bucket offers (its limit for the failure policy and the
// adaptive rate, that it decides in memory) through unwrap, and uses
// Smooth's own Pause and Refund, which pace as well.
func TestSmoothKeepsItsInnerCapabilities(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner, err := NewLocal(10, time.Second, WithClock(clock))
	require.NoError(t, err)
	s, err := NewSmooth(inner, 10, time.Second, WithClock(clock))
	require.NoError(t, err)
	c := findCapabilities(s)
	assert.Equal(t, capability.Fallbacker((*localCaps)(inner)), c.fallbacker)
	assert.Equal(t, capability.Pauser((*smoothCaps)(s)), c.pauser)
	assert.Equal(t, capability.Refunder((*smoothCaps)(s)), c.refunder)
	assert.True(t, c.immediate)
}

// TestSmoothArithmetic walks the pacer through a timeline.
func TestSmoothArithmetic(t *testing.T) {
	clock := clockwork.NewFakeClock()
	inner := &counting{Bucket: newWindowBucket(clock, 1000, time.Hour)}
	s, err := NewSmooth(inner, 10, time.Second, WithClock(clock)) // 100 ms apart
	require.NoError(t, err)
	ctx := context.Background()
	take := func(key string, n int64) Decision {
		t.Helper()
		d, err := s.Take(ctx, key, n, 0)
		require.NoError(t, err)
		return d
	}
	for _, key := range []string{"", "k"} {
		assert.True(t, take(key, 1).Granted, "key %q: first permit at once", key)
		d := take(key, 1)
		assert.False(t, d.Granted)
		assert.Equal(t, 50*time.Millisecond, d.Delay, "key %q: after a quiet spell, the half slot of slack", key)
	}
	calls := inner.calls.Load()
	clock.Advance(100 * time.Millisecond) // t = 100 ms; slot due at 50 ms
	assert.True(t, take("", 3).Granted, "a slot has come: n = 3 takes it and the next two")
	d := take("", 1)
	assert.False(t, d.Granted)
	assert.Equal(t, 250*time.Millisecond, d.Delay, "three slots from the one due at 50 ms: 350 ms")
	assert.Equal(t, calls+1, inner.calls.Load(), "a refusal by the pacer costs no inner call")

	// A caller that wakes a little late keeps its place.
	clock.Advance(290 * time.Millisecond) // t = 390 ms, 40 ms late
	assert.True(t, take("", 1).Granted)
	d = take("", 1)
	assert.Equal(t, 60*time.Millisecond, d.Delay, "the next slot is 100 ms after the one due (450 ms), not after the late caller")
	// One later than the slack loses the rest.
	clock.Advance(140 * time.Millisecond) // t = 530 ms, 80 ms late
	assert.True(t, take("", 1).Granted)
	d = take("", 1)
	assert.Equal(t, 50*time.Millisecond, d.Delay, "paced from 50 ms ago at most: 480 + 100 ms = 580 ms")
}

// TestSmoothGivesTheSlotBack: when the inner bucket refuses, the slot is
// not lost.
func TestSmoothGivesTheSlotBack(t *testing.T) {
	clock := clockwork.NewFakeClock()
	wb := newWindowBucket(clock, 1, 10*time.Millisecond)
	s, err := NewSmooth(wb, 100, time.Second, WithClock(clock)) // 10 ms apart
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, wb.Refund(ctx, "", 0))
	d, _ := wb.Take(ctx, "", 1, 0) // someone else used the window
	require.True(t, d.Granted)
	d, err = s.Take(ctx, "", 1, 0)
	require.NoError(t, err)
	require.False(t, d.Granted)
	assert.Equal(t, 10*time.Millisecond, d.Delay, "the inner refusal comes through")
	clock.Advance(10 * time.Millisecond)
	d, err = s.Take(ctx, "", 1, 0)
	require.NoError(t, err)
	assert.True(t, d.Granted, "the slot the inner bucket refused was given back")
}

// TestSmoothPauseAndRefund: Pause holds this instance and reaches the inner
// bucket; Refund gives the permit back to the inner bucket and keeps the
// slot used.
func TestSmoothPauseAndRefund(t *testing.T) {
	clock := clockwork.NewFakeClock()
	wb := newWindowBucket(clock, 1000, time.Hour)
	inner := &counting{Bucket: wb}
	s, err := NewSmooth(inner, 10, time.Second, WithClock(clock))
	require.NoError(t, err)
	ctx := context.Background()
	for _, key := range []string{"", "k"} {
		require.NoError(t, s.pause(ctx, key, time.Second))
		d, err := s.Take(ctx, key, 1, 0)
		require.NoError(t, err)
		assert.False(t, d.Granted)
		assert.Equal(t, time.Second, d.Delay, "key %q", key)
	}
	assert.Equal(t, int64(2), inner.pauses.Load())
	clock.Advance(time.Second)
	d, err := s.Take(ctx, "", 1, 0)
	require.NoError(t, err)
	require.True(t, d.Granted)
	require.NoError(t, s.refund(ctx, "", 1))
	assert.Equal(t, int64(1), inner.refunded.Load())
	d, err = s.Take(ctx, "", 1, 0)
	require.NoError(t, err)
	assert.False(t, d.Granted, "the refunded slot stays used")
}

// TestSmoothWithLimiter: callers of a Limiter sleep until their slot, on
// the fake clock, and are served interval/limit apart.
func TestSmoothWithLimiter(t *testing.T) {
	clock := clockwork.NewFakeClock()
	s, err := NewSmooth(newWindowBucket(clock, 100, time.Second), 100, time.Second, WithClock(clock))
	require.NoError(t, err)
	lim := New(s, WithClock(clock))
	start := clock.Now()
	ctx, cancel := context.WithCancel(testCtx(t))
	var at []time.Duration
	go func() {
		defer cancel()
		for range 5 {
			if err := lim.Acquire(context.Background(), Forever); err != nil { // no deadline timer: the only sleeper is the wait
				t.Error(err)
				return
			}
			at = append(at, clock.Since(start))
		}
	}()
	// Move the clock a millisecond at a time while a caller sleeps.
	for clock.BlockUntilContext(ctx, 1) == nil {
		clock.Advance(time.Millisecond)
	}
	<-ctx.Done()
	ms := time.Millisecond
	assert.Equal(t, []time.Duration{0, 5 * ms, 15 * ms, 25 * ms, 35 * ms}, at, "the half slot of slack after a quiet spell, then 10 ms apart")
}
