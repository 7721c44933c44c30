package throttle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Answer is what a provider said about one call, for [Limiter.Report]:
// that it refused it, whether it named a time to come back, and the limit
// it advertises. The Transport of package throttle/httpclient reads it from HTTP responses (its ReadAnswer);
// other callers (a Kafka handler calling a gRPC API, say) fill it in
// themselves, or return it from a consumer handler in an [*AnswerError].
type Answer struct {
	// Refused reports that the provider turned the call away for its
	// rate limit (HTTP 429).
	Refused bool
	// Retry reports that the provider named a time before which calls
	// are useless (Retry-After on a refusal; a reset time when nothing
	// remains): RetryAfter from now. Such an answer pauses the bucket
	// for the whole fleet. A refusal with a retry time also counts as a
	// refusal for the adaptive rate, as one without: a provider that
	// keeps refusing the fleet's bursts with Retry-After (a sliding
	// window meeting a token bucket's period starts) teaches the fleet
	// to pace below it, rather than pause it at every period's edge. A
	// RetryAfter of 0 or less names no time to wait for: nothing is
	// paused.
	Retry      bool
	RetryAfter time.Duration
	// Limit is the limit the provider advertises (X-RateLimit-Limit,
	// RateLimit-Policy, ...), 0 when it advertises none, per Window; a
	// Window of 0 means the bucket's own interval. A limit below the
	// configured one lowers the fleet's adaptive ceiling.
	Limit  int64
	Window time.Duration
}

// AnswerError is an error that carries the provider's answer. A handler
// of package consumer returns one (wrapped or not) when the provider
// refused its call, so that the fleet adapts as it does for calls through
// the Transport:
//
//	if resp.StatusCode == http.StatusTooManyRequests {
//		return &throttle.AnswerError{Answer: httpclient.ReadAnswer(resp, time.Now()), Err: errRefused}
//	}
type AnswerError struct {
	Answer Answer
	Err    error
}

// Error implements error.
func (e *AnswerError) Error() string {
	what := "answered"
	if e.Answer.Refused {
		what = "refused the call"
	}
	if e.Err == nil {
		return "throttle: the provider " + what
	}
	return fmt.Sprintf("throttle: the provider %s: %v", what, e.Err)
}

// Unwrap returns the error the answer came with.
func (e *AnswerError) Unwrap() error { return e.Err }

// AnswerOf returns the answer carried by err, if err is or wraps an
// [*AnswerError].
func AnswerOf(err error) (Answer, bool) {
	var ae *AnswerError
	if errors.As(err, &ae) {
		return ae.Answer, true
	}
	return Answer{}, false
}

// Report tells l what the provider answered to a call made with one of
// its permits, so that the fleet sharing l's bucket adapts (see
// [AdaptiveState] for the law):
//
//   - an answer with a retry time (Answer.Retry) pauses the bucket until
//     then, for the whole fleet when the bucket is a [Pauser];
//   - a refusal, with a retry time or without, lowers the adaptive rate
//     (at most once per interval, however many callers report it) and
//     paces grants evenly;
//   - a limit advertised below the configured one lowers the ceiling
//     (with or without a retry time; before a refusal in the same answer
//     is applied, so that the refusal is measured against it).
//
// An answer that says nothing new (a success within the limit) costs
// nothing: no store call. Report needs the bucket's limit per interval:
// every bucket of package bucket and [Local] give it (through
// [Fallbacker]); for another bucket only the pause applies. It returns the
// store's errors, if any, joined: the pause and the adaptation are each
// best effort, and one may have been made when the other failed.
func (l *Limiter) Report(ctx context.Context, a Answer) error { return l.report(ctx, "", a) }

// Report is [Limiter.Report] for k's key.
func (k Keyed) Report(ctx context.Context, a Answer) error {
	if k.l == nil {
		return fmt.Errorf("throttle: zero Keyed: %w: build it with Limiter.Key", ErrInvalid)
	}
	return k.l.report(ctx, k.key, a)
}

// AdaptiveState returns the adaptive state of key ("" for the bucket's
// own) as l last saw it, reading it from the store when l has not seen it
// within the last interval. The zero state means not adapting.
func (l *Limiter) AdaptiveState(ctx context.Context, key string) (AdaptiveState, error) {
	a := l.adapt
	if a == nil || !a.ok {
		return AdaptiveState{}, nil
	}
	if v, fresh := a.view(key); fresh {
		return v.st, nil
	}
	s, _, err := a.swap(ctx, key, AdaptiveState{Version: -1}, AdaptiveState{})
	return s, err
}

// AdaptiveObserver is implemented by an [Observer] that also wants to hear
// of the adaptive rate: Adapted is called after each change this Limiter
// made to key's state (a decrease, an increase, a new ceiling), with the
// state after it. The rules of Observer apply.
type AdaptiveObserver interface {
	Adapted(key string, s AdaptiveState)
}

// adapter is a Limiter's side of the adaptive rate: the law, the store
// (the bucket's or a memory one), and what this process last saw of each
// key's state, so that a key that is not adapting costs no store call.
type adapter struct {
	ok    bool // the bucket's limit is known: adaptation possible
	law   adaptLaw
	store AdaptiveStore
	lim   *Limiter
	views sync.Map // key → *adaptEntry
	// local paces this process alone, at its share of the last rate
	// seen, when the store does not answer a paced take in time.
	local *memAdaptive
}

// adaptView is the state of one key as seen at local clock time seen.
type adaptView struct {
	st   AdaptiveState
	seen time.Time
}

func newAdapter(l *Limiter) *adapter {
	a := &adapter{lim: l}
	limit, interval, ok := bucketRate(l.bucket)
	if !ok {
		return a
	}
	a.ok = true
	a.law = adaptLaw{limit: float64(limit), interval: interval}
	a.local = &memAdaptive{clock: l.cfg.clock, keys: make(map[string]*memAdaptiveKey)}
	if s, isStore := l.bucket.(AdaptiveStore); isStore {
		a.store = s
	} else {
		a.store = &memAdaptive{clock: l.cfg.clock, keys: make(map[string]*memAdaptiveKey)}
	}
	return a
}

// bucketRate is b's limit per interval, when b says.
func bucketRate(b Bucket) (int64, time.Duration, bool) {
	switch x := b.(type) {
	case *Local:
		return x.limit, time.Duration(x.emission * x.limit), true
	case Fallbacker:
		limit, interval, _ := x.Fallback()
		return limit, interval, limit >= 1 && interval > 0
	}
	return 0, 0, false
}

// adaptEntry is what this process knows of one key's state.
type adaptEntry struct {
	v atomic.Pointer[adaptView]
	// refreshing is set while one caller reads a stale state that was
	// not adapting: the others go on unpaced meanwhile, rather than all
	// ask the store at once.
	refreshing atomic.Bool
}

func (a *adapter) entry(key string) *adaptEntry {
	if e, ok := a.views.Load(key); ok {
		return e.(*adaptEntry)
	}
	e, _ := a.views.LoadOrStore(key, new(adaptEntry))
	return e.(*adaptEntry)
}

// view returns key's last seen state and whether it is at most one
// interval old.
func (a *adapter) view(key string) (adaptView, bool) {
	v := a.entry(key).v.Load()
	if v == nil {
		return adaptView{}, false
	}
	return *v, a.lim.cfg.clock.Since(v.seen) < a.law.interval
}

// note records s as key's state seen now, unless the view holds a state
// read later on the store's clock, of the same version or a later one,
// that is still fresh: replies of concurrent store calls (a background
// refresh, a swap) may land out of order, and the older must not undo the
// newer (a refusal's decrease replaced by a read from before it would stop
// the pacing). A later version always wins, so that a store clock that
// stepped back cannot hide a change.
func (a *adapter) note(key string, s AdaptiveState) {
	e := a.entry(key)
	now := a.lim.cfg.clock.Now()
	nv := &adaptView{st: s, seen: now}
	for {
		cur := e.v.Load()
		if cur != nil && s.At.Before(cur.st.At) && s.Version <= cur.st.Version && now.Sub(cur.seen) < a.law.interval {
			return
		}
		if e.v.CompareAndSwap(cur, nv) {
			return
		}
	}
}

// storeCtx bounds one store call like a bucket call.
func (a *adapter) storeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.lim.fail.timeout)
}

// swap is one SwapAdaptive, noting what it returns.
func (a *adapter) swap(ctx context.Context, key string, old, next AdaptiveState) (AdaptiveState, bool, error) {
	sctx, cancel := a.storeCtx(ctx)
	defer cancel()
	ttl := max(adaptMemory, 10*a.law.interval)
	s, ok, err := a.store.SwapAdaptive(sctx, key, old, next, ttl)
	if err != nil {
		return AdaptiveState{}, false, err
	}
	a.note(key, s)
	if ok {
		if o, isAO := a.lim.cfg.observer.(AdaptiveObserver); isAO {
			o.Adapted(key, s)
		}
	}
	return s, ok, nil
}

// update applies f to key's state in the store, retrying when another
// instance changed it meanwhile. A fresh view that f leaves unchanged
// saves the store call.
func (a *adapter) update(ctx context.Context, key string, f func(AdaptiveState, time.Time) (AdaptiveState, bool)) error {
	if v, fresh := a.view(key); fresh {
		if _, changed := f(v.st, v.st.At.Add(a.lim.cfg.clock.Since(v.seen))); !changed {
			return nil
		}
	}
	s, _, err := a.swap(ctx, key, AdaptiveState{Version: -1}, AdaptiveState{})
	for attempt := 0; err == nil && attempt < 4; attempt++ {
		next, changed := f(s, s.At)
		if !changed {
			return nil
		}
		var swapped bool
		if s, swapped, err = a.swap(ctx, key, s, next); swapped {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("throttle: adaptive rate of key %q: %w", key, err)
	}
	return nil // others keep changing it: theirs stands
}

// maxAnswerPause caps the pause one answer can impose (a provider that
// names a reset days ahead is most likely wrong), as the Transport of
// package throttle/httpclient caps its own.
const maxAnswerPause = time.Hour

func (l *Limiter) report(ctx context.Context, key string, ans Answer) error {
	if l.bucket == nil {
		return invalid("throttle", "Bucket", nil, "throttle.New needs a non-nil Bucket")
	}
	// The adaptation matters beyond this call: do not let its
	// cancellation skip it.
	ctx = context.WithoutCancel(ctx)
	hint := ans.Retry && ans.RetryAfter > 0
	var errs []error
	if p, ok := l.bucket.(Pauser); ok && hint {
		// Honour the hint first: the pause is what the provider asked.
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		errs = append(errs, p.Pause(pctx, key, min(ans.RetryAfter, maxAnswerPause)))
		cancel()
	}
	a := l.adapt
	if a == nil || !a.ok {
		return errors.Join(errs...)
	}
	if ans.Limit > 0 {
		adv := float64(ans.Limit)
		if ans.Window > 0 {
			adv = adv * float64(a.law.interval) / float64(ans.Window)
		}
		errs = append(errs, a.update(ctx, key, func(s AdaptiveState, now time.Time) (AdaptiveState, bool) {
			return a.law.advertised(s, adv, now)
		}))
	}
	if ans.Refused {
		// With a hint or without: a provider that refuses the fleet's
		// bursts with a retry time is answered by pacing, not only by
		// pausing. After the advertised limit: the refusal is measured
		// against it.
		errs = append(errs, a.update(ctx, key, a.law.refused))
	}
	return errors.Join(errs...)
}

// paceHorizon is how far ahead, as a share of the interval, a caller may
// reserve a paced slot. Callers further back sleep and ask again, so that
// a change of rate reaches the queue within a quarter interval.
const paceHorizon = 4

// pace waits for an evenly spaced slot at key's adaptive rate, within
// left, before a caller asks the bucket; paced reports that it asked the
// store (and so may have taken time). It returns at once, with no store
// call, while key is known not to be adapting. A store failure skips the
// pacing: the bucket call that follows meets the same store and the
// failure policy.
func (a *adapter) pace(ctx context.Context, key string, n int64, left time.Duration, tb timeoutBound) (paced bool, err error) {
	if a == nil || !a.ok {
		return false, nil
	}
	if v, fresh := a.view(key); !v.st.Active() {
		if !fresh {
			a.refresh(key)
		}
		return false, nil
	}
	clock := a.lim.cfg.clock
	start := clock.Now()
	for {
		remaining := left
		if left != Forever {
			remaining = max(left-clock.Since(start), 0)
		}
		horizon := min(a.law.interval/paceHorizon, remaining)
		// Bounded like a bucket call, and within the caller's wait.
		bound := a.lim.fail.timeout
		if remaining > 0 {
			bound = min(bound, remaining)
		}
		sctx, cancel := context.WithTimeout(ctx, bound)
		p, err := a.store.PaceAdaptive(sctx, key, n, a.law.interval, horizon)
		cancel()
		if err != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// The caller's wait ran out while the store was asked:
				// ErrTimeout, as from a bucket call (see wait).
				return true, expiredWhileAsking(n, "the adaptive pace", err)
			}
			if ctx.Err() != nil {
				return true, waitErr(ctx)
			}
			// A slow or failed store must not let a burst through:
			// pace this process at its share of the last rate seen.
			return true, a.paceLocal(ctx, key, n, remaining, tb)
		}
		a.note(key, p.State)
		if !p.State.Active() {
			return true, nil
		}
		if next, due := a.law.increase(p.State, p.State.At); due {
			_, _, _ = a.swap(ctx, key, p.State, next) // the first instance to try wins
		}
		if p.Granted {
			if p.Delay <= 0 {
				return true, nil
			}
			return true, a.lim.sleep(ctx, p.Delay)
		}
		if p.Delay > remaining {
			return true, tb.err(p.Delay)
		}
		if err := a.lim.sleep(ctx, max(p.Delay-horizon, retryFloor)); err != nil {
			return true, err
		}
	}
}

// refresh reads key's state from the store in the background, at most
// one read per key at a time, so that an instance that has not been
// refused itself learns within about an interval that the fleet is
// adapting. The caller does not wait for it: the read costs no Acquire
// any time, even with the store down. The goroutine ends with the read,
// within the store timeout.
func (a *adapter) refresh(key string) {
	if m, inMemory := a.store.(*memAdaptive); inMemory {
		s, _, _ := m.SwapAdaptive(context.Background(), key, AdaptiveState{Version: -1}, AdaptiveState{}, 0)
		a.note(key, s)
		return
	}
	e := a.entry(key)
	if !e.refreshing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer e.refreshing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), a.lim.fail.timeout)
		defer cancel()
		s, _, err := a.store.SwapAdaptive(ctx, key, AdaptiveState{Version: -1}, AdaptiveState{}, time.Millisecond)
		if err == nil {
			a.note(key, s)
		}
	}()
}

// paceLocal paces key in this process alone, at its share (the rate over
// the live instances the bucket counted) of the last rate seen, reserving
// a slot within left.
func (a *adapter) paceLocal(ctx context.Context, key string, n int64, left time.Duration, tb timeoutBound) error {
	v, _ := a.view(key)
	if !v.st.Active() {
		return nil
	}
	share := v.st.Rate
	if fb, ok := a.lim.bucket.(Fallbacker); ok {
		if _, _, inst := fb.Fallback(); inst > 1 {
			share /= float64(inst)
		}
	}
	p, _ := a.local.pace(key, n, a.law.interval, left, max(share, 1e-3))
	if !p.Granted {
		return tb.err(p.Delay)
	}
	if p.Delay <= 0 {
		return nil
	}
	return a.lim.sleep(ctx, p.Delay)
}

// memAdaptive keeps adaptive states in memory, for a bucket that is not
// an AdaptiveStore: the adaptation is then this process's alone.
type memAdaptive struct {
	clock interface{ Now() time.Time }
	mu    sync.Mutex
	keys  map[string]*memAdaptiveKey
}

type memAdaptiveKey struct {
	st      AdaptiveState
	tat     time.Time // next free slot
	tatRate float64   // the rate the slots up to tat were reserved at
	expires time.Time
	version int64 // survives expiry, so a stale swap fails
}

func (m *memAdaptive) get(key string, now time.Time) *memAdaptiveKey {
	k := m.keys[key]
	if k == nil {
		k = &memAdaptiveKey{}
		m.keys[key] = k
	}
	if k.st.Active() && !now.Before(k.expires) {
		k.st = AdaptiveState{}
	}
	return k
}

// PaceAdaptive implements [AdaptiveStore].
func (m *memAdaptive) PaceAdaptive(_ context.Context, key string, n int64, interval, horizon time.Duration) (AdaptivePace, error) {
	return m.pace(key, n, interval, horizon, 0)
}

// pace is PaceAdaptive, at rate instead of the stored one when rate > 0.
func (m *memAdaptive) pace(key string, n int64, interval, horizon time.Duration, rate float64) (AdaptivePace, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	k := m.get(key, now)
	if rate > 0 {
		k.st.Rate, k.expires = rate, now.Add(interval)
	}
	st := k.st
	st.Version, st.At = k.version, now
	if !st.Active() {
		return AdaptivePace{Granted: true, State: st}, nil
	}
	if k.tatRate > 0 && k.tatRate != st.Rate && k.tat.After(now) {
		// The last slot was reserved at another rate: the next comes one
		// new spacing after it (as adapt_pace.lua does).
		k.tat = k.tat.Add(-durationOf(float64(interval)/k.tatRate) + durationOf(float64(interval)/st.Rate))
	}
	if k.tat.Before(now) {
		k.tat = now
	}
	wait := k.tat.Sub(now)
	if wait > horizon {
		return AdaptivePace{Delay: wait, State: st}, nil
	}
	k.tat = k.tat.Add(durationOf(float64(n) * float64(interval) / st.Rate))
	k.tatRate = st.Rate
	return AdaptivePace{Granted: true, Delay: wait, State: st}, nil
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

// SwapAdaptive implements [AdaptiveStore].
func (m *memAdaptive) SwapAdaptive(_ context.Context, key string, old, next AdaptiveState, ttl time.Duration) (AdaptiveState, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	k := m.get(key, now)
	if old.Version < 0 || old.Version != k.version {
		st := k.st
		st.Version, st.At = k.version, now
		return st, false, nil
	}
	k.version++
	k.st, k.expires = next, now.Add(ttl)
	st := k.st
	st.Version, st.At = k.version, now
	return st, true, nil
}
