package throttle

import (
	"context"
	"errors"
	"hash/maphash"
	"reflect"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMemoryFollowsTheKeysInUse: 40 rounds of 1,000 fresh keys, each used
// once, over a bucket whose adaptive state the Limiter keeps in memory;
// the clock past every expiry between rounds. The Limiter keeps the keys
// of about the last round, not every key ever seen (it kept 40,000
// adaptive views and 40,000 in-memory adaptive states, ≈ 550 bytes a key).
func TestMemoryFollowsTheKeysInUse(t *testing.T) {
	clock := clockwork.NewFakeClock()
	loc, err := NewLocal(10, time.Second, WithClock(clock))
	require.NoError(t, err)
	lim := New(loc, WithClock(clock))
	ctx := context.Background()
	for r := range 40 {
		for i := range 1000 {
			k := lim.Key(strconv.Itoa(r*1000 + i))
			require.NoError(t, k.Acquire(ctx, 0))
			if i%100 == 0 { // some keys adapt
				require.NoError(t, k.Report(ctx, Answer{Refused: true}))
			}
		}
		clock.Advance(time.Hour)
	}
	assert.LessOrEqual(t, lim.states.count(), 2000, "key states kept after 40,000 keys, each used once")
}

// downStore is a store that fails while down, and grants otherwise,
// reporting a period of a second.
type downStore struct{ down atomic.Bool }

func (s *downStore) Take(context.Context, string, int64, time.Duration) (Decision, error) {
	if s.down.Load() {
		return Decision{}, &BackendError{Op: "take", Err: errors.New("connection refused")}
	}
	return Decision{Granted: true, Limit: 1000, Remaining: 500, Reset: time.Second}, nil
}

func (s *downStore) Fallback() (int64, time.Duration, int64) { return 1000, time.Second, 1 }

// TestKeysAskedDuringAnOutageAreForgotten: 1,000 keys granted locally
// during an outage and never asked again once the store is back are
// forgotten once their grants no longer count, not kept for ever: only
// the key still asked is left.
func TestKeysAskedDuringAnOutageAreForgotten(t *testing.T) {
	clock := clockwork.NewFakeClock()
	s := &downStore{}
	lim := New(s, WithClock(clock))
	ctx := context.Background()
	for i := range 1000 {
		require.NoError(t, lim.Key(strconv.Itoa(i)).Acquire(ctx, 0))
	}
	s.down.Store(true)
	for i := range 1000 {
		require.NoError(t, lim.Key(strconv.Itoa(i)).Acquire(ctx, 0), "a local grant from what the period had left")
	}
	s.down.Store(false)
	for range 2 * stateShards {
		clock.Advance(time.Second)
		require.NoError(t, lim.Key("other").Acquire(ctx, 0))
	}
	assert.Equal(t, 1, lim.states.count(), "states kept")
}

// TestStateInUseIsNotForgotten: a state a caller holds (here, one queued
// at its gate) is not swept however long it idles, and the caller's
// grant lands in the state the next caller finds.
func TestStateInUseIsNotForgotten(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &refuseFirst{delay: time.Hour}
	lim := New(b, WithClock(clock))
	ctx := context.Background()
	k := lim.Key("held")
	require.ErrorIs(t, k.Acquire(ctx, 0), ErrTimeout) // closes the key's gate for an hour
	done := make(chan error, 1)
	go func() { done <- k.Acquire(ctx, Forever) }()
	require.Eventually(t, func() bool {
		st := lim.state("held")
		defer lim.release(st)
		return st.gate.queued.Load() == 1
	}, 10*time.Second, time.Millisecond)
	for range 2 * stateShards { // other keys sweep every shard, twice over, in 43 minutes
		clock.Advance(20 * time.Second)
		require.NoError(t, lim.Key("other").Acquire(ctx, 0))
	}
	st := lim.state("held")
	assert.Equal(t, int32(1), st.gate.queued.Load(), "the queued caller's state is the one the key finds")
	lim.release(st)
	clock.Advance(time.Hour)
	require.NoError(t, <-done)
}

// refuseFirst refuses key "held"'s first call for delay, and grants the rest.
type refuseFirst struct {
	delay   time.Duration
	refused atomic.Bool
}

func (b *refuseFirst) Take(_ context.Context, key string, _ int64, _ time.Duration) (Decision, error) {
	if key == "held" && b.refused.CompareAndSwap(false, true) {
		return Decision{Delay: b.delay}, nil
	}
	return Decision{Granted: true}, nil
}

// TestPeriodBoundKeepsTheFewestLeft: the ledger keeps the fewest permits
// any decision of a period reported left, whatever order they arrive in,
// starts afresh with a later period, and ignores a late answer of an
// earlier one.
func TestPeriodBoundKeepsTheFewestLeft(t *testing.T) {
	const tol = 500
	for _, tc := range []struct {
		name      string
		notes     [][2]int64 // end, remaining
		end, left int64
	}{
		{"one", [][2]int64{{1000, 7}}, 1000, 7},
		{"the fewest wins, not the last", [][2]int64{{1000, 3}, {1010, 9}, {990, 5}}, 1010, 3},
		{"unknown counts as none", [][2]int64{{1000, 8}, {1000, -1}}, 1000, 0},
		{"a later period starts afresh", [][2]int64{{1000, 0}, {2000, 99}}, 2000, 99},
		{"a late answer of an earlier period changes nothing", [][2]int64{{2000, 50}, {1000, 0}}, 2000, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p periodBound
			for _, n := range tc.notes {
				if !p.note(n[0], n[1], tol) {
					p.start(n[0], n[1], tol)
				}
			}
			assert.Equal(t, tc.end, p.end.Load())
			assert.Equal(t, tc.left, p.remaining.Load())
		})
	}
}

// TestRecoveryCapTable walks the first-back cap through its cases.
func TestRecoveryCapTable(t *testing.T) {
	granted := Decision{Granted: true, Reset: 100}
	refused := Decision{Reset: 100}
	for _, tc := range []struct {
		name    string
		first   Decision
		share   int64
		owed    int64
		took    int64
		asks    []int64 // n asked at time 10 each
		granted []bool
		at      int64 // then one more of 1 at this time
		last    bool
	}{
		{"room is the share less the debt and the first take", granted, 10, 4, 1, []int64{5, 1}, []bool{true, false}, 50, false},
		{"the cap ends with the period", granted, 10, 10, 0, []int64{1}, []bool{false}, 100, true},
		{"a refused first answer caps the next period too", refused, 10, 2, 0, []int64{8, 1}, []bool{true, false}, 150, true},
		{"nothing owed, no cap", granted, 10, 0, 0, nil, nil, 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := newRecoveryCap(tc.first, 0, tc.share, tc.owed, tc.took, 100)
			if tc.owed == 0 {
				assert.Nil(t, rc)
				return
			}
			require.NotNil(t, rc)
			for i, n := range tc.asks {
				_, refusedNow, _ := rc.reserve(n, 10)
				assert.Equal(t, tc.granted[i], !refusedNow, "ask %d of %d", i, n)
			}
			_, refusedNow, _ := rc.reserve(1, tc.at)
			assert.Equal(t, tc.last, !refusedNow, "one more at %d", tc.at)
		})
	}
}

// fleetWindow is a shared store stand-in: limit per aligned window of its
// clock, a Reset to the window's end, Remaining; four live instances; it
// fails while down.
type fleetWindow struct {
	*windowBucket
	down atomic.Bool
}

func (f *fleetWindow) Take(ctx context.Context, key string, n int64, w time.Duration) (Decision, error) {
	if f.down.Load() {
		return Decision{}, &BackendError{Op: "take", Err: errors.New("connection refused")}
	}
	return f.windowBucket.Take(ctx, key, n, w)
}

func (f *fleetWindow) Fallback() (int64, time.Duration, int64) { return f.limit, f.interval, 4 }

// TestFirstBackCapBoundsTheLeaseRefill: after an outage in which this
// instance granted locally, its first shared period is capped at its share
// less what it owed, and the lease's refills stay within that room: when
// the cap refuses, the lease holds nothing. (A lease that had taken full
// batches below the cap held permits of that period until the cap's end,
// then handed them out next to the next period's burst.)
func TestFirstBackCapBoundsTheLeaseRefill(t *testing.T) {
	clock := clockwork.NewFakeClock()
	f := &fleetWindow{windowBucket: newWindowBucket(clock, 400, time.Second)}
	lim := New(f, WithClock(clock), WithLeasing(Leasing{Share: 0.5}))
	defer lim.Close()
	ctx := context.Background()
	for range 50 { // batches grow
		require.NoError(t, lim.Acquire(ctx, 0))
		clock.Advance(time.Millisecond)
	}
	f.down.Store(true)  // mid-window: the window had permits left
	granted := int64(0) // from the lease (the store's already) or the local share
	for range 150 {
		if lim.Acquire(ctx, 0) == nil {
			granted++
		}
		clock.Advance(5 * time.Millisecond)
	}
	require.Positive(t, granted, "grants in the outage")
	f.down.Store(false)
	clock.Advance(time.Second - time.Duration(clock.Since(f.start)%time.Second)) // the next window begins
	before := f.grantedIn(int64(clock.Since(f.start) / time.Second))
	handed, refused := int64(0), false
	for range 400 {
		if err := lim.Acquire(ctx, 0); err != nil {
			require.ErrorIs(t, err, ErrTimeout)
			assert.Zero(t, lim.leaseHeld(""), "refused while the lease holds permits")
			refused = true
			break
		}
		handed++
	}
	require.True(t, refused, "the cap refused (handed %d)", handed)
	t.Logf("%d granted in the outage; %d handed in the first period back; the store granted %d in it, debts included", granted, handed, f.grantedIn(int64(clock.Since(f.start)/time.Second))-before)
	w := int64(clock.Since(f.start) / time.Second)
	share := int64(400 / 4)
	assert.LessOrEqual(t, f.grantedIn(w)-before, share, "taken from the store in the first period back, debts included (handed %d)", handed)
}

// hungStore fails while down, hangs until its call's context ends while
// hung, and grants otherwise.
type hungStore struct {
	down, hung atomic.Bool
	calls      atomic.Int64
}

func (s *hungStore) Take(ctx context.Context, _ string, _ int64, _ time.Duration) (Decision, error) {
	s.calls.Add(1)
	if s.hung.Load() {
		<-ctx.Done()
		return Decision{}, &BackendError{Op: "take", Err: ctx.Err()}
	}
	if s.down.Load() {
		return Decision{}, &BackendError{Op: "take", Err: errors.New("connection refused")}
	}
	return Decision{Granted: true, Limit: 1000, Remaining: 900, Reset: time.Second}, nil
}

func (s *hungStore) Fallback() (int64, time.Duration, int64) { return 1000, time.Second, 1 }

// TestLeasingDecidesByThePolicyWhileARefillProbes: with the store down,
// while one caller's refill probes it (and hangs), the others decide by
// the failure policy at once instead of waiting on that refill, which
// would hold every caller of the key through an outage: FailLocal grants
// them locally, and only the probe asks the store.
func TestLeasingDecidesByThePolicyWhileARefillProbes(t *testing.T) {
	s := &hungStore{}
	lim := New(s, WithLeasing(Leasing{}))
	defer lim.Close()
	ctx := context.Background()
	require.NoError(t, lim.Acquire(ctx, 0))
	s.down.Store(true)
	require.NoError(t, lim.Acquire(ctx, 0), "the outage begins: a local grant from what the period had left")
	s.down.Store(false)
	s.hung.Store(true)
	probe := make(chan error, 1)
	go func() { probe <- lim.Acquire(ctx, 2*time.Second) }() // its store call hangs until its wait ends
	require.Eventually(t, func() bool { return s.calls.Load() == 3 }, 10*time.Second, time.Millisecond, "the probe is at the store")
	for range 20 {
		require.NoError(t, lim.Acquire(ctx, time.Second), "a local grant while the probe hangs")
	}
	assert.Equal(t, int64(3), s.calls.Load(), "only the probe asked the store")
	require.NoError(t, <-probe, "when its wait ends, the probe too is granted locally")
}

// TestACrowdOfKeysGoneLeavesNoLargeMaps: 300 keys in every shard used
// once, then only one key for longer than the idle window. A Go map keeps
// the room of its largest size, so each shard's map must be a new one,
// sized for the few states left, not the one that held the crowd.
func TestACrowdOfKeysGoneLeavesNoLargeMaps(t *testing.T) {
	clock := clockwork.NewFakeClock()
	loc, err := NewLocal(10, time.Second, WithClock(clock))
	require.NoError(t, err)
	lim := New(loc, WithClock(clock))
	ctx := context.Background()
	// The shard of a key depends on the Limiter's random hash seed, so the
	// keys are chosen by their shard: every shard gets exactly perShard.
	const perShard = 300
	var filled [stateShards]int
	for i, full := 0, 0; full < stateShards; i++ {
		key := strconv.Itoa(i)
		sh := maphash.String(lim.states.seed, key) % stateShards
		if filled[sh] == perShard {
			continue
		}
		require.NoError(t, lim.Key(key).Acquire(ctx, 0))
		if filled[sh]++; filled[sh] == perShard {
			full++
		}
	}
	var crowd [stateShards]uintptr
	for i := range lim.states.shards {
		sh := &lim.states.shards[i]
		sh.mu.Lock()
		crowd[i] = reflect.ValueOf(sh.m).Pointer()
		require.Equal(t, perShard, len(sh.m), "shard %d's share of the crowd", i)
		sh.mu.Unlock()
	}
	for range 2 * stateShards { // one key sweeps every shard, twice over
		clock.Advance(time.Minute)
		require.NoError(t, lim.Key("other").Acquire(ctx, 0))
	}
	for i := range lim.states.shards {
		sh := &lim.states.shards[i]
		sh.mu.Lock()
		assert.NotEqual(t, crowd[i], reflect.ValueOf(sh.m).Pointer(), "shard %d still holds the crowd's map", i)
		assert.LessOrEqual(t, len(sh.m), 1, "shard %d's states", i)
		sh.mu.Unlock()
	}
}
