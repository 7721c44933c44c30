package throttle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// A Limiter's side of the adaptive rate (the law is in adaptive_law.go): what
// this process last saw of each key's state (in the key's state, so that a
// key that is not adapting costs no store call), where the state lives
// (the bucket's AdaptiveStore, or the key's state for a bucket that keeps
// none), and the background work that keeps the view fresh and applies
// increases off the callers' path.

// adapter is what a Limiter knows of the adaptive rate.
type adapter struct {
	ok       bool  // the bucket's limit is known: adaptation possible
	base     int64 // the bucket's limit per interval (its Fallback)
	interval time.Duration
	store    AdaptiveStore // nil: in memory, in each key's state
}

// adaptView is the state of one key as seen at seen (the Limiter's time).
type adaptView struct {
	st   AdaptiveState
	seen int64
}

// law is the adaptive law for st's key: its ceiling is the key's limit as
// its last shared decision reported it (a limit changed live included),
// or the bucket's.
func (l *Limiter) law(st *keyState) adaptLaw {
	limit := l.adapt.base
	if v := st.limit.Load(); v > 0 {
		limit = v
	}
	return adaptLaw{limit: float64(limit), interval: l.adapt.interval}
}

// view returns st's last seen state and whether it is at most one interval
// old at now on the time base (0: read the clock).
func (l *Limiter) view(st *keyState, now int64) (adaptView, bool) {
	v := st.adapt.view.Load()
	if v == nil {
		return adaptView{}, false
	}
	if now == 0 {
		now = l.tb.now()
	}
	return *v, now-v.seen < int64(l.adapt.interval)
}

// note records s, read by a store call sent at sent (on the time base),
// as st's state seen now, unless the view, still fresh, holds a state that
// s cannot be newer than: replies of concurrent store calls (a background
// refresh, a swap) may land out of order, and the older must not undo the
// newer (a refusal's decrease replaced by a read from before it would stop
// the pacing for an interval).
//
// The store's version orders its states while it keeps them, and a later
// version always wins. An earlier version is older, unless its call was
// sent after the view's state had come back: that call read the store
// after the view's state was in it, so the store lost the state (an empty
// restart) and counts its versions anew, and is believed. The order of
// the calls is read on this process's monotonic time base, never on the
// store's clock: two calls within one tick of it (a fake clock, Redis
// TIME's microsecond) read the same At, and it may step back, so that a
// read taken before a decrease carries the later At.
func (l *Limiter) note(st *keyState, s AdaptiveState, sent int64) {
	now := l.tb.now()
	nv := &adaptView{st: s, seen: now}
	for {
		cur := st.adapt.view.Load()
		if cur != nil && now-cur.seen < int64(l.adapt.interval) && older(s, sent, cur) {
			return
		}
		if st.adapt.view.CompareAndSwap(cur, nv) {
			return
		}
	}
}

// older reports whether s, read by a store call sent at sent, is older
// than the view cur (see note); cur's own version read again at an earlier
// store time counts as older (nothing newer to learn from it).
func older(s AdaptiveState, sent int64, cur *adaptView) bool {
	switch {
	case s.Version < cur.st.Version:
		return sent <= cur.seen
	case s.Version == cur.st.Version:
		return s.At.Before(cur.st.At)
	}
	return false
}

// adaptKey is what a Limiter keeps of one key's adaptive rate. Lock
// rule: view and busy are atomics, read and written without a lock; mem
// and paceMem are under mu, which guards nothing else.
type adaptKey struct {
	// view is the adaptive state as this process last saw it; busy is set
	// while a background read or update of it runs.
	view atomic.Pointer[adaptView]
	busy atomic.Bool

	mu  sync.Mutex
	mem *memAdaptive // the adaptive state, when the bucket keeps none
	// paceMem paces this process alone when the store does not answer a
	// paced take in time (paceLocal).
	paceMem *memAdaptive
}

// memory returns the key's in-memory adaptive state, creating it; the
// caller holds a.mu.
func (a *adaptKey) memory() *memAdaptive {
	if a.mem == nil {
		a.mem = &memAdaptive{}
	}
	return a.mem
}

// holds reports whether the in-memory states still matter at now.
func (a *adaptKey) holds(now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mem != nil && a.mem.holds(now) || a.paceMem != nil && a.paceMem.holds(now)
}

// paceStore is one PaceAdaptive of st's key, in the store or in memory.
func (l *Limiter) paceStore(ctx context.Context, st *keyState, n int64, horizon time.Duration) (AdaptivePace, error) {
	if s := l.adapt.store; s != nil {
		return s.PaceAdaptive(ctx, st.key, n, l.adapt.interval, horizon)
	}
	st.adapt.mu.Lock()
	defer st.adapt.mu.Unlock()
	return st.adapt.memory().pace(l.tb.wall(l.tb.now()), n, l.adapt.interval, horizon, 0), nil
}

// swapStore is one SwapAdaptive of st's key, in the store or in memory.
func (l *Limiter) swapStore(ctx context.Context, st *keyState, old, next AdaptiveState, ttl time.Duration) (AdaptiveState, bool, error) {
	if s := l.adapt.store; s != nil {
		return s.SwapAdaptive(ctx, st.key, old, next, ttl)
	}
	st.adapt.mu.Lock()
	defer st.adapt.mu.Unlock()
	s, ok := st.adapt.memory().swap(l.tb.wall(l.tb.now()), old, next, ttl)
	return s, ok, nil
}

// swap is one SwapAdaptive, bounded by ctx and the store timeout, noting
// what it returns and telling the observer of a change.
func (l *Limiter) swap(ctx context.Context, st *keyState, old, next AdaptiveState) (AdaptiveState, bool, error) {
	sctx, cancel := context.WithTimeout(ctx, l.storeBound())
	defer cancel()
	ttl := max(adaptMemory, 10*l.adapt.interval)
	sent := l.tb.now()
	s, ok, err := l.swapStore(sctx, st, old, next, ttl)
	if err != nil {
		return AdaptiveState{}, false, err
	}
	l.note(st, s, sent)
	if ok {
		if ao, ok := l.cfg.observer.(AdaptiveObserver); ok {
			ao.Adapted(st.key, s)
		}
	}
	return s, ok, nil
}

// updateAttempts bounds the swaps of one update: each one lost means that
// another change of the state was made meanwhile.
const updateAttempts = 5

// update applies f to st's state in the store, retrying when another
// instance changed it meanwhile. It returns nil only when the state in the
// store holds f's change: this update swapped it in, or f found nothing to
// change in the state read (another instance made the change first). A
// fresh view that f leaves unchanged saves the store call. An update that
// loses every swap returns an error: another change stands, but not f's.
func (l *Limiter) update(ctx context.Context, st *keyState, f func(AdaptiveState, time.Time) (AdaptiveState, bool)) error {
	if v, fresh := l.view(st, 0); fresh {
		if _, changed := f(v.st, v.st.At.Add(time.Duration(l.tb.now()-v.seen))); !changed {
			return nil
		}
	}
	s, _, err := l.swap(ctx, st, AdaptiveState{Version: -1}, AdaptiveState{})
	for attempt := 0; err == nil; attempt++ {
		// Each lost swap returns the state that won: f looks at it, the
		// last one's included (it may hold f's change, made by another).
		next, changed := f(s, s.At)
		if !changed {
			return nil
		}
		if attempt == updateAttempts {
			break
		}
		var swapped bool
		if s, swapped, err = l.swap(ctx, st, s, next); swapped {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("throttle: adaptive rate of key %q: %w", st.key, err)
	}
	return fmt.Errorf("throttle: adaptive rate of key %q not changed: the store's state changed under each of %d swaps", st.key, updateAttempts)
}

// adaptiveState returns the adaptive state of key ("" for the bucket's
// own) as l last saw it, reading it from the store when l has not seen it
// within the last interval. The zero state means not adapting.
func (l *Limiter) adaptiveState(ctx context.Context, key string) (AdaptiveState, error) {
	if l.bad != nil || !l.adapt.ok {
		return AdaptiveState{}, nil
	}
	st := l.state(key)
	defer l.release(st)
	if v, fresh := l.view(st, 0); fresh {
		return v.st, nil
	}
	s, _, err := l.swap(ctx, st, AdaptiveState{Version: -1}, AdaptiveState{})
	return s, err
}

// pace is the adaptive rate's stage: while st's key adapts, the caller
// waits for an evenly spaced slot at its adaptive rate before it asks the
// bucket. It returns at once, with no store call, while the key is known
// not to be adapting. A store failure skips the shared pacing (the bucket
// call that follows meets the same store and the failure policy) for this
// process's share of the last rate seen. An increase the law finds due is
// written in the background: no caller waits for it.
//
// Its store calls and sleeps end by w's deadline (paceCall, paceHorizon),
// and it takes no slot that begins after it: the slot the store names
// begins at most its Delay after the reply came (the store decided
// before), so what is left of the wait is measured again once the reply
// is in. A slot granted beyond it is spent (a store cannot take a slot
// back), and the caller gets ErrTimeout by its deadline.
func (w *waiter) pace(st *keyState) error {
	l := w.l
	now := w.first // the wait's first clock reading, if any, serves its first round
	w.first = 0
	if !l.adapt.ok {
		return nil
	}
	if v, fresh := l.view(st, now); !v.st.Active() {
		if !fresh {
			l.refresh(st)
		}
		return nil
	}
	if l.leasing == nil || !st.lease.holds(l.tb.now()) {
		// A caller the key's next place refuses takes no slot of the
		// pace (a store call, a slot of the fleet's); one the lease may
		// serve goes on.
		if c, ok := st.next.refusal(w, st); ok {
			return c.err
		}
	}
	for {
		horizon, err := w.paceHorizon()
		if err != nil {
			return err
		}
		sent := l.tb.now()
		var p AdaptivePace
		cut, timedOut, err := w.paceCall(func(ctx context.Context) error {
			var err error
			p, err = l.paceStore(ctx, st, w.n, horizon)
			return err
		})
		remaining := w.left() // the reply took some of it
		if err != nil {
			return l.paceFailed(w, st, cut, timedOut, remaining, err)
		}
		l.note(st, p.State, sent)
		if !p.State.Active() {
			return nil
		}
		if next, due := l.law(st).increase(p.State, p.State.At); due {
			l.raise(st, p.State, next)
		}
		switch {
		case p.Delay > remaining:
			return w.tb.err(p.Delay) // granted or not, the slot begins after the wait's end
		case p.Granted && p.Delay <= 0:
			return nil
		case p.Granted:
			w.pacedSleep = true
			return l.sleep(w.ctx, p.Delay)
		}
		w.pacedSleep = true
		if err := l.sleep(w.ctx, min(max(p.Delay-horizon, retryFloor), remaining)); err != nil {
			return err
		}
	}
}

// paceFailed ends pace when its store call failed with err: with
// ErrTimeout or the context's error when w's wait ran out (cut says how
// the wait cut the call; timedOut, that the store timeout did), else by
// pacing this process alone (paceLocal) within remaining.
func (l *Limiter) paceFailed(w *waiter, st *keyState, cut storeCut, timedOut bool, remaining time.Duration, err error) error {
	ctx, n, tb := w.ctx, w.n, w.tb
	switch {
	case cut.outOfTime() && tb.ctxBound || errors.Is(ctx.Err(), context.DeadlineExceeded):
		// As from a bucket call (see waiter.failed).
		return fmt.Errorf("%w: the context's deadline passed while the adaptive pace was asked for %d permit(s) (%w; the adaptive pace: %v)", ErrTimeout, n, context.DeadlineExceeded, err)
	case ctx.Err() != nil:
		return waitErr(ctx)
	case cut.outOfTime():
		return fmt.Errorf("%w: maxWait %v ran out while the adaptive pace was asked for %d permit(s) (the adaptive pace: %v)", ErrTimeout, tb.maxWait, n, err)
	case remaining <= 0 && !w.noWait():
		return w.ranOut("the adaptive pace")
	}
	if isStoreFailure(ctx, cut.expired || timedOut, err) && !cut.unfair(l.cfg.storeTimeout) {
		// The bucket call that follows may have little of a wait of
		// none left (its calls share one store timeout): cut, it is the
		// store's failure all the same.
		w.failedFairly = true
	}
	// A slow or failed store must not let a burst through.
	return l.paceLocal(w, st, remaining)
}

// raise writes an increase of st's state from old to next, off the
// caller's path; the first instance to try wins.
func (l *Limiter) raise(st *keyState, old, next AdaptiveState) {
	if l.adapt.store == nil {
		_, _, _ = l.swap(context.Background(), st, old, next) // in memory: at once
		return
	}
	l.bg.run(l, st, func(ctx context.Context) { _, _, _ = l.swap(ctx, st, old, next) })
}

// refresh reads st's state from the store off the caller's path, so that
// an instance that has not been refused itself learns within about an
// interval that the fleet is adapting. The read costs no Acquire any time,
// even with the store down.
func (l *Limiter) refresh(st *keyState) {
	read := func(ctx context.Context) {
		sent := l.tb.now()
		if s, _, err := l.swapStore(ctx, st, AdaptiveState{Version: -1}, AdaptiveState{}, time.Millisecond); err == nil {
			l.note(st, s, sent)
		}
	}
	if l.adapt.store == nil {
		read(context.Background()) // in memory: at once
		return
	}
	l.bg.run(l, st, read)
}

// paceLocal paces st's key in this process alone, at its share (the rate
// over the live instances the bucket counted) of the last rate seen,
// reserving a slot within left.
func (l *Limiter) paceLocal(w *waiter, st *keyState, left time.Duration) error {
	n := w.n
	v, _ := l.view(st, 0)
	if !v.st.Active() {
		return nil
	}
	share := v.st.Rate
	if fb := l.caps.fallbacker; fb != nil {
		if _, _, inst := fb.Fallback(); inst > 1 {
			share /= float64(inst)
		}
	}
	st.adapt.mu.Lock()
	if st.adapt.paceMem == nil {
		st.adapt.paceMem = &memAdaptive{}
	}
	p := st.adapt.paceMem.pace(l.tb.wall(l.tb.now()), n, l.adapt.interval, left, max(share, 1e-3))
	st.adapt.mu.Unlock()
	if !p.Granted {
		return w.tb.err(p.Delay)
	}
	if p.Delay <= 0 {
		return nil
	}
	w.pacedSleep = true
	return l.sleep(w.ctx, p.Delay)
}

// background is a Limiter's work off the callers' path: reads and updates
// of the adaptive rate in its store, at most one at a time per key and
// maxBackground at a time in all (a task that finds no room is skipped: the
// key's next call tries again), each bounded by the store timeout and
// holding a reference to its key's state. Close stops it and waits.
type background struct {
	ctx      context.Context
	cancel   context.CancelFunc
	mu       sync.Mutex
	closed   bool
	wg       sync.WaitGroup
	inflight atomic.Int32
}

// maxBackground bounds a Limiter's background tasks at once: many new keys
// at the same time (a start, a churn of tenants) read their state a few at
// a time rather than with a goroutine each.
const maxBackground = 8

// run runs f for st in a goroutine of its own, unless one runs for st or
// the Limiter is closed. The caller holds a reference to st.
func (b *background) run(l *Limiter, st *keyState, f func(context.Context)) {
	if !st.adapt.busy.CompareAndSwap(false, true) {
		return
	}
	if b.inflight.Add(1) > maxBackground {
		b.inflight.Add(-1)
		st.adapt.busy.Store(false)
		return
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		b.inflight.Add(-1)
		st.adapt.busy.Store(false)
		return
	}
	b.wg.Add(1)
	b.mu.Unlock()
	if st != l.root {
		st.refs.Add(1) // lent by the caller's reference: st cannot be swept meanwhile
	}
	go func() {
		defer b.wg.Done()
		defer b.inflight.Add(-1)
		defer l.release(st)
		defer st.adapt.busy.Store(false)
		ctx, cancel := context.WithTimeout(b.ctx, l.storeBound())
		defer cancel()
		f(ctx)
	}()
}

// Close stops l's background work (reads and updates of the adaptive rate
// in the bucket's store, each at most the store timeout long) and waits
// for it to end, and for the give-backs of permits that callers left and
// did not wait for (a store slower than what was left of their wait; each
// at most a second long). It is optional: that work ends on its own within a
// second, so a Limiter dropped without Close leaks nothing for long; call
// Close where a test or a shutdown must know that nothing of l runs any
// more. After Close, l keeps granting; its adaptive view is then
// refreshed only by its own reports, and callers make their give-backs
// themselves. Close is safe to call more than once.
func (l *Limiter) Close() error {
	b := &l.bg
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	if b.cancel != nil {
		b.cancel()
	}
	b.wg.Wait()
	l.gives.close()
	return nil
}

// memAdaptive keeps one key's adaptive state in memory, for a bucket that
// is not an AdaptiveStore: the adaptation is then this process's alone.
// Its times are the Limiter's (timeBase.wall), monotonic. The caller holds
// the key's adaptKey.mu.
type memAdaptive struct {
	st      AdaptiveState
	tat     time.Time // next free slot
	tatRate float64   // the rate the slots up to tat were reserved at
	expires time.Time
	version int64 // survives expiry, so a stale swap fails
}

// current forgets the state once expired at now, and returns it as the
// store would: with its version, read at now.
func (m *memAdaptive) current(now time.Time) AdaptiveState {
	if m.st.Active() && !now.Before(m.expires) {
		m.st = AdaptiveState{}
	}
	st := m.st
	st.Version, st.At = m.version, now
	return st
}

// holds reports whether the state still matters at now: it paces, or a
// slot is reserved ahead.
func (m *memAdaptive) holds(now time.Time) bool {
	return m.st.Active() && now.Before(m.expires) || m.tat.After(now)
}

// pace is PaceAdaptive at now, at rate instead of the stored one when
// rate > 0.
func (m *memAdaptive) pace(now time.Time, n int64, interval, horizon time.Duration, rate float64) AdaptivePace {
	m.current(now)
	if rate > 0 {
		m.st.Rate, m.expires = rate, now.Add(interval)
	}
	st := m.current(now)
	if !st.Active() {
		return AdaptivePace{Granted: true, State: st}
	}
	if m.tatRate > 0 && m.tatRate != st.Rate && m.tat.After(now) {
		// The last slot was reserved at another rate: the next comes one
		// new spacing after it (as adapt_pace.lua does).
		m.tat = m.tat.Add(-durationOf(float64(interval)/m.tatRate) + durationOf(float64(interval)/st.Rate))
	}
	if m.tat.Before(now) {
		m.tat = now
	}
	wait := m.tat.Sub(now)
	if wait > horizon {
		return AdaptivePace{Delay: wait, State: st}
	}
	m.tat = m.tat.Add(durationOf(float64(n) * float64(interval) / st.Rate))
	m.tatRate = st.Rate
	return AdaptivePace{Granted: true, Delay: wait, State: st}
}

// durationOf is ns as a Duration, saturating at a century rather than
// overflowing (n slots at a rate of a thousandth of a permit per hour).
func durationOf(ns float64) time.Duration {
	const most = 100 * 365 * 24 * time.Hour
	if !(ns < float64(most)) {
		return most
	}
	return time.Duration(ns)
}

// swap is SwapAdaptive at now.
func (m *memAdaptive) swap(now time.Time, old, next AdaptiveState, ttl time.Duration) (AdaptiveState, bool) {
	if st := m.current(now); old.Version < 0 || old.Version != m.version {
		return st, false
	}
	m.version++
	m.st, m.expires = next, now.Add(ttl)
	next.Version, next.At = m.version, now
	return next, true
}
