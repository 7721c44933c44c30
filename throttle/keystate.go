package throttle

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
)

// timeBase is a Limiter's one measure of time: nanoseconds since an epoch,
// read with the clock's Since, which is monotonic (time.Now carries a
// monotonic reading, and a fake clock's Since follows its Advance). A wall
// clock that steps back or forth (NTP, a VM resumed) changes nothing. The
// epoch is a second before the Limiter was built, so that no time on it is
// 0, which the states use for "none".
type timeBase struct {
	clock clockwork.Clock
	epoch time.Time
}

func newTimeBase(c clockwork.Clock) timeBase {
	return timeBase{clock: c, epoch: c.Now().Add(-time.Second)}
}

// now is the time on the base, in ns.
func (t *timeBase) now() int64 { return int64(t.clock.Since(t.epoch)) }

// wall is a time of the base as a time.Time, for states that keep
// time.Time (the in-memory adaptive state): monotonic like the base.
func (t *timeBase) wall(now int64) time.Time { return t.epoch.Add(time.Duration(now)) }

// keyState is everything a Limiter keeps for one key, one small struct
// per mechanism, each in its file with its lock rule: the gate where its
// callers queue after a refusal (gate, gate.go), what it last saw of the
// key's adaptive rate (adapt, adaptive_state.go), the failure policy's
// ledger of the shared period, its local share during an outage and the
// first-back cap after one (out, degraded.go), the lease (lease,
// lease.go), and the bucket's next place for one permit (next, place.go).
// No lock guards two of them, nor is held while another's is taken. One
// map holds the states, with one rule for forgetting them (keyStates).
type keyState struct {
	key string
	// refs counts the callers and background tasks using the state; used
	// is when it was last acquired (on the Limiter's time base).
	refs atomic.Int32
	used atomic.Int64

	gate  gate
	adapt adaptKey
	out   outageKey
	lease lease
	next  nextPlace

	// limit is the key's limit as its last shared Decision reported it
	// (a limit changed live included); 0 when none was reported.
	limit atomic.Int64
	// pausedUntil is the end of the latest pause reported for the key
	// through this Limiter (Report with a retry time), on the Limiter's
	// time base; 0 none. Callers waiting for their grant's time read it
	// when the time comes (waiter.usable), and the key's gate stays
	// closed until then (gate.hold).
	pausedUntil atomic.Int64
}

// notePause records a pause of the key until until (see pausedUntil).
func (st *keyState) notePause(until int64) { atLeast(&st.pausedUntil, until) }

// atLeast raises a to v if it is below; atMost lowers it if above.
func atLeast(a *atomic.Int64, v int64) {
	for old := a.Load(); old < v; old = a.Load() {
		if a.CompareAndSwap(old, v) {
			return
		}
	}
}

func atMost(a *atomic.Int64, v int64) {
	for old := a.Load(); old > v; old = a.Load() {
		if a.CompareAndSwap(old, v) {
			return
		}
	}
}

// spend removes n from a if it holds that many, without a lock, and
// returns what is left.
func spend(a *atomic.Int64, n int64) (left int64, ok bool) {
	for {
		left := a.Load()
		if left < n {
			return left, false
		}
		if a.CompareAndSwap(left, left-n) {
			return left - n, true
		}
	}
}

// holds reports whether st keeps something that must outlive an idle
// spell: a mechanism at work or holding something (each one's holds,
// idle, filling or busy says), an adaptive rate seen in the store within
// adaptMemory, or a limit lowered live below base, the limit of keys
// without one of their own (the bucket's Fallback), which the failure
// policy must keep applying to the key (forgotten, it would fall back to
// base). A limit raised above base is forgotten: base is the stricter.
func (st *keyState) holds(now, base int64, wall time.Time) bool {
	if st.adapt.busy.Load() || !st.gate.idle(now) || st.lease.holds(now) || !st.next.idle(now) {
		return true
	}
	if l := st.limit.Load(); l > 0 && l < base {
		return true
	}
	if v := st.adapt.view.Load(); v != nil && v.st.Active() && now-v.seen < int64(adaptMemory) {
		// A rate the bucket's store keeps (and this instance paces by)
		// may still be in force: a key back from an idle spell must not
		// burst past it while its view is read again.
		return true
	}
	return st.out.holds(now) || st.adapt.holds(wall) || st.lease.filling()
}

const stateShards = 64

// keyStates holds a Limiter's states of keys other than "" (the Limiter
// holds that one itself, never forgotten: its hot path takes no lock).
//
// Forgetting: a state unused for idle (the bucket's interval, at least a
// second and at most ten minutes) that holds nothing (keyState.holds) is
// removed when its shard is swept: on the call path, when the shard has
// doubled since its last sweep or idle has passed since it, and each call
// sweeps one more shard in turn on the same terms, a call of key "" too
// while any state is kept (a fleet whose traffic went back to key ""
// after an outage of its tenant keys forgets them). No goroutine: nothing
// to stop, and a Limiter nobody calls keeps what it had. Memory follows
// the keys used within idle, plus those that still hold something; a
// shard's map is made anew once it holds under a quarter of its peak.
//
// A state in use is never removed: refs is raised under the shard's lock
// (acquire) and the sweep removes a state only under that lock with refs
// at 0; a removed state is out of the map, so nobody can acquire it again.
// A caller still holding a state (refs > 0) keeps it in the map. Background
// tasks take a reference of their own from a caller that holds one.
type keyStates struct {
	seed   maphash.Seed
	next   atomic.Uint32 // the shard the next acquire sweeps besides its own
	idle   int64         // ns
	tb     *timeBase
	base   func() int64
	shards [stateShards]stateShard
	init   func(*keyState)
	// kept counts the states in the shards, so that calls of key "" sweep
	// only while there is something to sweep.
	kept atomic.Int64
}

type stateShard struct {
	mu    sync.RWMutex // read-locked to find a state, locked to add or remove one
	m     map[string]*keyState
	grow  int          // sweep when len(m) reaches it
	peak  int          // the most states m has held since it was made
	swept atomic.Int64 // when last swept
}

func (s *keyStates) setup(idle time.Duration, tb *timeBase, base func() int64, init func(*keyState)) {
	s.seed = maphash.MakeSeed()
	s.idle = int64(idle)
	s.tb = tb
	s.base = base
	s.init = init
	for i := range s.shards {
		s.shards[i].m = make(map[string]*keyState)
		s.shards[i].grow = 64
	}
}

// acquire returns key's state, creating it, with a reference the caller
// gives back with release. A key already kept costs a read lock of its
// shard: callers of one key, on several cores, do not queue for it.
func (s *keyStates) acquire(key string, now int64) *keyState {
	sh := &s.shards[maphash.String(s.seed, key)%stateShards]
	sh.mu.RLock()
	st := sh.m[key]
	if st != nil && len(sh.m) < sh.grow && now-sh.swept.Load() < s.idle {
		st.refs.Add(1)
		sh.mu.RUnlock()
	} else {
		sh.mu.RUnlock()
		sh.mu.Lock()
		if len(sh.m) >= sh.grow || now-sh.swept.Load() >= s.idle {
			s.sweep(sh, now)
		}
		st = sh.m[key]
		if st == nil {
			st = &keyState{key: key}
			s.init(st)
			sh.m[key] = st
			s.kept.Add(1)
			sh.peak = max(sh.peak, len(sh.m))
		}
		st.refs.Add(1)
		sh.mu.Unlock()
	}
	s.sweepTurn(sh, now)
	// used need not be exact to the nanosecond: a hot key's callers on
	// several cores write it at most once a millisecond. (The sweep reads
	// it with the state's refs at 0, so a caller's own write is not needed
	// while it holds the state.)
	if now-st.used.Load() > int64(time.Millisecond) {
		st.used.Store(now)
	}
	return st
}

// sweepTurn sweeps one more shard in turn (see keyStates), other than sh
// (the caller's own, nil for key ""), if it is due. It costs two atomic
// operations when the shard is not due, and never waits for a shard's lock.
func (s *keyStates) sweepTurn(sh *stateShard, now int64) {
	if o := &s.shards[s.next.Add(1)%stateShards]; o != sh && now-o.swept.Load() >= s.idle && o.mu.TryLock() {
		s.sweep(o, now)
		o.mu.Unlock()
	}
}

// release gives back a reference from acquire.
func (s *keyStates) release(st *keyState) { st.refs.Add(-1) }

// sweep removes the shard's states unused for idle that hold nothing. The
// caller holds sh.mu.
func (s *keyStates) sweep(sh *stateShard, now int64) {
	base := s.base()
	for k, st := range sh.m {
		if st.refs.Load() == 0 && now-st.used.Load() >= s.idle && !st.holds(now, base, s.tb.wall(now)) {
			delete(sh.m, k)
			s.kept.Add(-1)
		}
	}
	if sh.peak > 256 && len(sh.m) < sh.peak/4 {
		// A map keeps the room of its largest size: after a crowd of keys
		// (a spike, an outage) has gone, move the few left to a new one.
		m := make(map[string]*keyState, len(sh.m))
		for k, st := range sh.m {
			m[k] = st
		}
		sh.m, sh.peak = m, len(m)
	}
	sh.grow = max(64, 2*len(sh.m))
	sh.swept.Store(now)
}

// count returns how many states are kept; for tests.
func (s *keyStates) count() int {
	n := 0
	for i := range s.shards {
		s.shards[i].mu.RLock()
		n += len(s.shards[i].m)
		s.shards[i].mu.RUnlock()
	}
	return n
}
