package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/headway-go/headway/throttle"
)

// memBucket is a bucket of a program's own, written against package
// throttle's exported interfaces only: a fixed window of limit permits
// per interval for each key, in memory. Beyond Take it offers what a
// throttle.Limiter and httpclient.Transport look for:
//
//   - throttle.Pauser: the Transport pauses a key when the provider
//     answers 429 with Retry-After;
//   - throttle.Fallbacker: the limit, which the adaptive rate needs;
//   - throttle.AdaptiveStore: where the Limiter keeps each key's adaptive
//     rate, and the pacing at that rate.
//
// A fleet would keep all of it in a shared store; one process keeps it in
// a map. Safe for concurrent use.
type memBucket struct {
	limit    int64
	interval time.Duration

	mu      sync.Mutex
	windows map[string]*window
	paused  map[string]time.Time
	adapt   map[string]*adaptiveKey
	pauses  []string // "key for d", every Pause, for the demo and its test
}

type window struct {
	start time.Time
	used  int64
}

// adaptiveKey is one key's adaptive state, until when it is kept (ttl
// after its last swap), and its next paced slot.
type adaptiveKey struct {
	state   throttle.AdaptiveState
	expires time.Time
	next    time.Time
}

func newMemBucket(limit int64, interval time.Duration) *memBucket {
	return &memBucket{
		limit: limit, interval: interval,
		windows: map[string]*window{}, paused: map[string]time.Time{}, adapt: map[string]*adaptiveKey{},
	}
}

// Take grants n permits of key's window when they fit; otherwise it says
// when the window ends, or the pause.
func (b *memBucket) Take(_ context.Context, key string, n int64, _ time.Duration) (throttle.Decision, error) {
	if n > b.limit {
		return throttle.Decision{}, fmt.Errorf("memBucket: %d permits at once: %w", n, throttle.ErrExceedsLimit)
	}
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if until := b.paused[key]; now.Before(until) {
		return throttle.Decision{Delay: until.Sub(now), Remaining: -1}, nil
	}
	b.forgetIdle(now)
	w := b.windows[key]
	if w == nil || now.Sub(w.start) >= b.interval {
		w = &window{start: now}
		b.windows[key] = w
	}
	reset := w.start.Add(b.interval).Sub(now)
	if w.used+n > b.limit {
		return throttle.Decision{Delay: reset, Limit: b.limit, Remaining: b.limit - w.used, Reset: reset}, nil
	}
	w.used += n
	return throttle.Decision{Granted: true, Limit: b.limit, Remaining: b.limit - w.used, Reset: reset}, nil
}

// Pause implements throttle.Pauser.
func (b *memBucket) Pause(_ context.Context, key string, d time.Duration) error {
	d = min(d, throttle.MaxPause)
	b.mu.Lock()
	defer b.mu.Unlock()
	if until := time.Now().Add(d); until.After(b.paused[key]) {
		b.paused[key] = until
	}
	b.pauses = append(b.pauses, fmt.Sprintf("%q for %v", key, d.Round(time.Second)))
	return nil
}

// Fallback implements throttle.Fallbacker: one instance holds the limit.
func (b *memBucket) Fallback() (int64, time.Duration, int64) {
	return b.limit, b.interval, 1
}

// PaceAdaptive implements throttle.AdaptiveStore: while key adapts, n
// slots at its rate, evenly spaced, when the first is within horizon.
func (b *memBucket) PaceAdaptive(_ context.Context, key string, n int64, interval, horizon time.Duration) (throttle.AdaptivePace, error) {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	a := b.adaptiveKey(key, now)
	st := a.state
	st.At = now
	if !st.Active() {
		return throttle.AdaptivePace{Granted: true, State: st}, nil
	}
	slot := now
	if a.next.After(now) {
		slot = a.next
	}
	wait := slot.Sub(now)
	if wait > horizon {
		return throttle.AdaptivePace{Delay: wait, State: st}, nil
	}
	a.next = slot.Add(time.Duration(float64(n) * float64(interval) / st.Rate))
	return throttle.AdaptivePace{Granted: true, Delay: wait, State: st}, nil
}

// SwapAdaptive implements throttle.AdaptiveStore: the state is kept ttl
// after its last swap, then forgotten (not adapting).
func (b *memBucket) SwapAdaptive(_ context.Context, key string, old, next throttle.AdaptiveState, ttl time.Duration) (throttle.AdaptiveState, bool, error) {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	a := b.adaptiveKey(key, now)
	if old.Version < 0 || old.Version != a.state.Version {
		st := a.state
		st.At = now
		return st, false, nil
	}
	next.Version = a.state.Version + 1
	a.state, a.expires = next, now.Add(ttl)
	next.At = now
	return next, true, nil
}

// adaptiveKey returns key's adaptive state at now, a new one (not
// adapting) when it expired or was never set. b.mu is held.
func (b *memBucket) adaptiveKey(key string, now time.Time) *adaptiveKey {
	a := b.adapt[key]
	if a == nil || now.After(a.expires) {
		a = &adaptiveKey{expires: now.Add(time.Hour)}
		b.adapt[key] = a
	}
	return a
}

// forgetIdle drops, once the maps hold many keys, the windows that
// ended, the pauses that passed and the adaptive states that expired, so
// that memory follows the keys in use. b.mu is held.
func (b *memBucket) forgetIdle(now time.Time) {
	if len(b.windows)+len(b.paused)+len(b.adapt) < 1024 {
		return
	}
	for k, w := range b.windows {
		if now.Sub(w.start) >= b.interval {
			delete(b.windows, k)
		}
	}
	for k, until := range b.paused {
		if !now.Before(until) {
			delete(b.paused, k)
		}
	}
	for k, a := range b.adapt {
		if now.After(a.expires) {
			delete(b.adapt, k)
		}
	}
}

// pausesSoFar returns every Pause so far.
func (b *memBucket) pausesSoFar() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.pauses...)
}

var (
	_ throttle.Pauser        = (*memBucket)(nil)
	_ throttle.Fallbacker    = (*memBucket)(nil)
	_ throttle.AdaptiveStore = (*memBucket)(nil)
)
