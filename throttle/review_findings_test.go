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
// nobody else uses enough times to visit every shard (each call acquires
// the key's state, which sweeps, before it asks the bucket).
func sweepAll(t *testing.T, lim *Limiter, clock *clockwork.FakeClock, idle time.Duration) {
	t.Helper()
	clock.Advance(idle + time.Second)
	for range 2 * stateShards {
		_ = lim.Key("sweeper").Acquire(context.Background(), 0) // refused or not, it sweeps
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

// sharedAdaptive is a bucket over a Local whose adaptive state lives in a
// store of its own (as a Redis bucket's does, shared by a fleet), kept
// here in memory. While block is set, reads of the state (SwapAdaptive
// with a version below 0) wait for it to be cleared.
type sharedAdaptive struct {
	*Local
	clock clockwork.Clock
	mu    chan struct{} // a lock
	mem   map[string]*memAdaptive
	block atomic.Pointer[chan struct{}]
}

func newSharedAdaptive(t *testing.T, clock clockwork.Clock, limit int64) *sharedAdaptive {
	loc, err := NewLocal(limit, time.Second, WithClock(clock))
	require.NoError(t, err)
	return &sharedAdaptive{Local: loc, clock: clock, mu: make(chan struct{}, 1), mem: map[string]*memAdaptive{}}
}

// state returns key's state; the caller holds mu.
func (s *sharedAdaptive) state(key string) *memAdaptive {
	if s.mem[key] == nil {
		s.mem[key] = &memAdaptive{}
	}
	return s.mem[key]
}

func (s *sharedAdaptive) PaceAdaptive(_ context.Context, key string, n int64, interval, horizon time.Duration) (AdaptivePace, error) {
	s.mu <- struct{}{}
	defer func() { <-s.mu }()
	return s.state(key).pace(s.clock.Now(), n, interval, horizon, 0), nil
}

func (s *sharedAdaptive) SwapAdaptive(ctx context.Context, key string, old, next AdaptiveState, ttl time.Duration) (AdaptiveState, bool, error) {
	if b := s.block.Load(); b != nil && old.Version < 0 {
		select {
		case <-*b:
		case <-ctx.Done():
			return AdaptiveState{}, false, ctx.Err()
		}
	}
	s.mu <- struct{}{}
	defer func() { <-s.mu }()
	st, ok := s.state(key).swap(s.clock.Now(), old, next, ttl)
	return st, ok, nil
}

// FINDING (wrong grant: the adaptive rate skipped; fixed): a key whose adaptive
// rate lives in the bucket's store (a Redis bucket) and is still in force
// there is forgotten after a second idle, like any key; when its callers
// come back, this instance has no view of the rate, so none of them is
// paced until a background read lands. A key slowed to 90/s by a
// refusal, idle 2 s, then 20 callers with maxWait 0 at once: paced, one
// gets a slot (the next is 11 ms away); all 20 were granted.
func TestFindingAForgottenKeyForgetsTheStoredAdaptiveRate(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	b := newSharedAdaptive(t, clock, 100)
	lim := New(b, WithClock(clock))
	defer lim.Close()
	k := lim.Key("tenant")
	require.NoError(t, k.Acquire(ctx, 0))
	require.NoError(t, k.Report(ctx, Answer{Refused: true}))
	s, err := lim.AdaptiveState(ctx, "tenant")
	require.NoError(t, err)
	require.True(t, s.Active(), "the refusal slows the key")

	sweepAll(t, lim, clock, 2*time.Second)
	block := make(chan struct{})
	b.block.Store(&block)
	defer close(block)
	granted := 0
	for range 20 {
		if k.Acquire(ctx, 0) == nil {
			granted++
		}
	}
	assert.LessOrEqual(t, granted, 1, "callers granted at once at a paced rate of %.0f/s", s.Rate)
}
