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

// TestIdleKeyKeepsTheStoredAdaptiveRate: a key whose adaptive rate lives in
// the bucket's store (a Redis bucket) and was in force there is kept past
// its idle window (for adaptMemory), so that its callers, back from an
// idle spell, are paced by the rate this instance saw rather than not at
// all until a background read of it lands. A key slowed to 90/s by a
// refusal, idle 2 s, then 20 callers with maxWait 0 at once: one gets a
// slot (the next is 11 ms away).
func TestIdleKeyKeepsTheStoredAdaptiveRate(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	b := newSharedAdaptive(t, clock, 100)
	lim := New(b, WithClock(clock))
	defer lim.Close()
	k := lim.Key("tenant")
	require.NoError(t, k.Acquire(ctx, 0))
	require.NoError(t, k.Report(ctx, Answer{Refused: true}))
	s, err := lim.adaptiveState(ctx, "tenant")
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
