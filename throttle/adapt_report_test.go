package throttle

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heldRead is a sharedAdaptive whose first read of the state (SwapAdaptive
// with a version below 0) is taken in the store at once but answered only
// when release is closed: a reply that the network, or a scheduler under
// load, delivers late. taken is closed once that read was taken.
type heldRead struct {
	*sharedAdaptive
	first   atomic.Bool
	taken   chan struct{}
	release chan struct{}
}

func (h *heldRead) SwapAdaptive(ctx context.Context, key string, old, next AdaptiveState, ttl time.Duration) (AdaptiveState, bool, error) {
	s, ok, err := h.sharedAdaptive.SwapAdaptive(ctx, key, old, next, ttl)
	if old.Version < 0 && h.first.CompareAndSwap(false, true) {
		close(h.taken)
		<-h.release
	}
	return s, ok, err
}

// TestReportIsNotUndoneByAnEarlierReadAnsweredLate: a background read of
// a key's adaptive state taken in the store before a refusal's decrease
// but answered after it must not replace the decrease in the Limiter's
// view (the view went back to "not adapting", fresh for an
// interval, so the refused instance stopped pacing). The store's clock
// does not move between the two (a fake clock; the Redis TIME of one
// microsecond), so only the versions tell them apart.
func TestReportIsNotUndoneByAnEarlierReadAnsweredLate(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	b := &heldRead{sharedAdaptive: newSharedAdaptive(t, clock, 100), taken: make(chan struct{}), release: make(chan struct{})}
	lim := New(b, WithClock(clock))
	var once sync.Once
	unblock := func() { once.Do(func() { close(b.release) }) }
	defer lim.Close()
	defer unblock()
	k := lim.Key("tenant")
	// The first call finds no view of the key and reads it in the
	// background: that read is taken, its answer held.
	require.NoError(t, k.Acquire(ctx, 0))
	<-b.taken
	require.NoError(t, k.Report(ctx, Answer{Refused: true}))
	unblock()
	require.NoError(t, lim.Close()) // the background read has been noted
	s, err := lim.adaptiveState(ctx, "tenant")
	require.NoError(t, err)
	assert.True(t, s.Active(), "the refusal slows the key: %+v", s)
	stored, _, err := b.sharedAdaptive.SwapAdaptive(ctx, "tenant", AdaptiveState{Version: -1}, AdaptiveState{}, time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, stored.Version, s.Version, "the view is the stored state")
}

// alwaysLost is a sharedAdaptive where another instance changes the state
// (a version bump, nothing else) just before each swap of the Limiter's:
// every swap it tries is lost.
type alwaysLost struct{ *sharedAdaptive }

func (a alwaysLost) SwapAdaptive(ctx context.Context, key string, old, next AdaptiveState, ttl time.Duration) (AdaptiveState, bool, error) {
	if old.Version >= 0 {
		cur, _, err := a.sharedAdaptive.SwapAdaptive(ctx, key, AdaptiveState{Version: -1}, AdaptiveState{}, ttl)
		if err != nil {
			return AdaptiveState{}, false, err
		}
		if _, _, err := a.sharedAdaptive.SwapAdaptive(ctx, key, cur, cur, ttl); err != nil {
			return AdaptiveState{}, false, err
		}
	}
	return a.sharedAdaptive.SwapAdaptive(ctx, key, old, next, ttl)
}

// TestReportThatNeverWinsTheSwapSaysSo: a refusal whose decrease loses
// every swap to other changes of the state is not reported as made: Report
// returns nil only when the fleet's state holds the refusal.
func TestReportThatNeverWinsTheSwapSaysSo(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	b := alwaysLost{newSharedAdaptive(t, clock, 100)}
	lim := New(b, WithClock(clock))
	defer lim.Close()
	err := lim.Key("tenant").Report(ctx, Answer{Refused: true})
	stored, _, serr := b.sharedAdaptive.SwapAdaptive(ctx, "tenant", AdaptiveState{Version: -1}, AdaptiveState{}, time.Millisecond)
	require.NoError(t, serr)
	require.False(t, stored.Active(), "the store lost every swap")
	require.Error(t, err, "Report returned nil, and the fleet's state does not hold the refusal")
	assert.Contains(t, err.Error(), `"tenant"`)
}

// TestReportIsNotUndoneByAnEarlierReadWhenTheStoreClockStepsBack: as
// TestReportIsNotUndoneByAnEarlierReadAnsweredLate, but the store's clock
// steps back a second (NTP, a failover to a host behind) between the read
// and the decrease: the read, of the earlier version, carries the later
// store time. The decrease is still the newer state, and stays in the
// view (it was replaced by the read: At, not the version, decided).
func TestReportIsNotUndoneByAnEarlierReadWhenTheStoreClockStepsBack(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	storeClock := clockwork.NewFakeClock()
	b := &heldRead{sharedAdaptive: newSharedAdaptive(t, storeClock, 100), taken: make(chan struct{}), release: make(chan struct{})}
	lim := New(b, WithClock(clock))
	var once sync.Once
	unblock := func() { once.Do(func() { close(b.release) }) }
	defer lim.Close()
	defer unblock()
	k := lim.Key("tenant")
	require.NoError(t, k.Acquire(ctx, 0))
	<-b.taken
	storeClock.Advance(-time.Second)
	require.NoError(t, k.Report(ctx, Answer{Refused: true}))
	unblock()
	require.NoError(t, lim.Close()) // the background read has been noted
	s, err := lim.adaptiveState(ctx, "tenant")
	require.NoError(t, err)
	assert.True(t, s.Active(), "the refusal slows the key: %+v", s)
	stored, _, err := b.sharedAdaptive.SwapAdaptive(ctx, "tenant", AdaptiveState{Version: -1}, AdaptiveState{}, time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, stored.Version, s.Version, "the view is the stored state")
}

// lostToTheSame is a sharedAdaptive where another instance changes the
// state just before each swap of the Limiter's: a version bump the first
// times, then, the last time, the very change the Limiter swaps for
// (another instance's report of the same refusal).
type lostToTheSame struct {
	*sharedAdaptive
	swaps atomic.Int64
}

func (a *lostToTheSame) SwapAdaptive(ctx context.Context, key string, old, next AdaptiveState, ttl time.Duration) (AdaptiveState, bool, error) {
	if old.Version >= 0 {
		cur, _, err := a.sharedAdaptive.SwapAdaptive(ctx, key, AdaptiveState{Version: -1}, AdaptiveState{}, ttl)
		if err != nil {
			return AdaptiveState{}, false, err
		}
		theirs := cur
		if a.swaps.Add(1) == updateAttempts {
			theirs = next
		}
		if _, _, err := a.sharedAdaptive.SwapAdaptive(ctx, key, cur, theirs, ttl); err != nil {
			return AdaptiveState{}, false, err
		}
	}
	return a.sharedAdaptive.SwapAdaptive(ctx, key, old, next, ttl)
}

// TestReportWhoseLastSwapLosesToTheSameChangeSucceeds: a refusal whose
// last swap is lost to another instance's decrease for the same
// refusals is held by the fleet's state: Report returns nil, as when the
// change is found made before a swap.
func TestReportWhoseLastSwapLosesToTheSameChangeSucceeds(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	b := &lostToTheSame{sharedAdaptive: newSharedAdaptive(t, clock, 100)}
	lim := New(b, WithClock(clock))
	defer lim.Close()
	err := lim.Key("tenant").Report(ctx, Answer{Refused: true})
	stored, _, serr := b.sharedAdaptive.SwapAdaptive(ctx, "tenant", AdaptiveState{Version: -1}, AdaptiveState{}, time.Millisecond)
	require.NoError(t, serr)
	require.True(t, stored.Active(), "the other instance's decrease stands")
	assert.NoError(t, err, "the fleet's state holds the refusal")
	assert.Equal(t, int64(updateAttempts), b.swaps.Load())
}
