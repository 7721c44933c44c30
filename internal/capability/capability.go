// Package capability holds what a bucket offers a throttle.Limiter
// beyond Take (refunds, fleet-wide pauses, its limit for the failure
// policy, the adaptive rate's shared store, ...), and what a Limiter shows
// the other packages of this module. It is internal: the Limiter discovers
// these on the buckets of package bucket through the registry below
// ([Register], [SetOf]), and on a user's bucket by its method set (see
// throttle.Bucket).
//
// # Why a registry
//
// The registry exists so that go doc of packages bucket and throttle shows
// only what users call: a bucket of package bucket has no exported method
// that hands the Limiter its capabilities, and a throttle.Keyed none that
// hands the other packages of this module its Limiter ([KeyedLimiter]).
// Instead package bucket registers, from its init function, a function
// giving the [Set] of each of its buckets, and package throttle registers
// how a Keyed is seen. Registration happens only in init functions, which
// complete before main (and any goroutine it starts) begins; the registry
// is read afterwards only, so it needs no lock.
package capability

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
)

// Refunder is implemented by buckets that can take back permits a caller
// was granted but did not use (a reservation abandoned because the caller's
// context ended, or leased permits handed back). Refund is best effort: a
// bucket may return fewer permits than asked, for example when the interval
// they belonged to has ended.
type Refunder interface {
	Refund(ctx context.Context, key string, n int64) error
}

// Pauser is implemented by buckets that can stop granting for a while, for
// every instance that shares them. A Pause seen by one instance holds for
// the whole fleet: Take answers "not granted" with Delay set to the pause
// left until it ends. A shorter pause never shortens a longer one.
//
// The Transport of package throttle/httpclient calls Pause when a
// provider answers "too many requests" with a retry time.
//
// A pause longer than throttle.MaxPause (throttle.Forever, say) is clamped to
// MaxPause by every Pauser of this module: it holds for a year rather
// than overflow the clock's arithmetic and do nothing.
type Pauser interface {
	Pause(ctx context.Context, key string, d time.Duration) error
}

// DimensionPauser is implemented by a throttle.CostBucket that can stop granting
// some of a key's dimensions for a while, for every instance that shares
// it: until each named dimension's RetryAfter has passed, a cost that
// needs some of that dimension is refused, with Delay set to the pause
// left; a cost that needs none of it is not held. A shorter pause never
// shortens a longer one. The Transport of package throttle/httpclient
// with a cost per call (its WithCost) calls it when a provider's
// accounting headers (OpenAI's x-ratelimit-remaining-tokens: 0, say)
// alone name a retry time, so that "no tokens left for 6 s" holds back
// the tokens for 6 s, and a
// dimension that comes back sooner only until then. A dimension the
// bucket does not keep pauses the whole key for that long, as [Pauser]
// would.
type DimensionPauser interface {
	PauseDimensions(ctx context.Context, key string, dims []Exhausted) error
}

// Exhausted is one dimension of a provider's limit (requests, tokens,
// input-tokens, ...) with nothing left, and the time until it has some
// again, for [DimensionPauser]. Dimension is named as the provider names
// it (OpenAI's and Anthropic's headers: "requests", "tokens",
// "input-tokens", "output-tokens"): name a budget's dimensions the same.
type Exhausted struct {
	Dimension  string
	RetryAfter time.Duration
}

// Immediate is implemented by buckets whose Take decides at once, with no
// store that could fail or hang (throttle.Local). A Limiter calls such a bucket
// without a deadline of its own and never applies its throttle.FailurePolicy to
// it. Immediate returns false for a wrapper that does wait on something.
type Immediate interface {
	Immediate() bool
}

// Checker is implemented by buckets that can check their store cheaply
// (the Redis buckets: one round trip), for throttle.Limiter.Check.
type Checker interface {
	Check(ctx context.Context) error
}

// AdaptiveState is the adaptive rate of one budget (a bucket's key), as an
// [AdaptiveStore] keeps it. Rates are in permits per interval of the
// bucket. The zero value means "not adapting": grants are not paced and
// the bucket's own limit is the only one.
type AdaptiveState struct {
	// Rate is the rate grants are paced at; 0 when not adapting.
	Rate float64
	// Ceiling is the limit the provider advertised last, per interval:
	// the highest Rate may reach is the lower of it and each instance's
	// configured limit. 0 when it advertised none: then the configured
	// limit is the ceiling (so that a limit raised in a rolling deploy is
	// not held down by the old one).
	Ceiling float64
	// Peak is the rate at the last decrease: increases approach it
	// quickly, then probe beyond it.
	Peak float64
	// Step is the next probe step beyond Peak.
	Step float64
	// Decreased, Increased and Refused are the times of the last decrease,
	// the last increase and the last refusal, on the
	// store's clock (the Redis server's for a Redis bucket).
	Decreased, Increased, Refused time.Time
	// Version counts the state's changes, for [AdaptiveStore.SwapAdaptive].
	Version int64
	// At is the store's time when the state was read.
	At time.Time
}

// Active reports whether the state paces grants.
func (s AdaptiveState) Active() bool { return s.Rate > 0 }

// AdaptivePace is an [AdaptiveStore]'s answer to a paced take.
type AdaptivePace struct {
	// Granted reports that a slot was reserved: the caller may go on
	// after Delay. Not granted, Delay is how far the first free slot is.
	// When the state is not active, Granted is true and Delay 0: no
	// pacing.
	Granted bool
	Delay   time.Duration
	// State is the adaptive state read with the slot, at State.At.
	State AdaptiveState
}

// AdaptiveStore is implemented by buckets that keep the adaptive rate of
// each of their keys in their shared store, so that a refusal seen by one
// instance slows the whole fleet (the Redis buckets of package bucket).
// A Limiter whose bucket does not implement it keeps the state in memory,
// for its own process.
//
// Both calls read the time from the store's clock and return it in
// AdaptiveState.At; the Limiter applies the law at that time.
type AdaptiveStore interface {
	// PaceAdaptive reserves n evenly spaced slots of key at the stored
	// rate (emission interval/Rate, burst 1), when the slot is at most
	// horizon away; it changes nothing when the state is not active.
	PaceAdaptive(ctx context.Context, key string, n int64, interval, horizon time.Duration) (AdaptivePace, error)
	// SwapAdaptive replaces key's state by next if its version is still
	// old.Version, and returns the state in the store afterwards (next
	// with its new version, or the one that won) and whether it swapped.
	// The stored state expires after ttl without a swap. With old.Version
	// below 0 it only reads.
	SwapAdaptive(ctx context.Context, key string, old, next AdaptiveState, ttl time.Duration) (AdaptiveState, bool, error)
}

// Fallbacker is implemented by buckets that can tell their limit per
// interval, and, for a limit a fleet of instances shares, how many
// instances share it: a Limiter under throttle.FailLocal limits this instance on
// its own with it while the store is down, and the adaptive rate
// (throttle.Limiter.Report) needs the limit. The Redis buckets of package bucket
// and throttle.Local implement it.
type Fallbacker interface {
	// Fallback returns the bucket's limit per interval and the number of
	// live instances sharing it. The limit is that of every key without a
	// live limit of its own (the constructor's): a limit set live for a
	// key, "" included, is reported by that key's decisions
	// (Decision.Limit), and the Limiter keeps it from there. The instances
	// are as last seen while the store answered; 0 when never seen (an instance that started while the
	// store was down cannot know its share, and the Limiter then fails
	// closed). It must not block: it is called while the store is down.
	Fallback() (limit int64, interval time.Duration, instances int64)
}

// AdaptiveObserver is implemented by an throttle.Observer that also wants to hear
// of the adaptive rate: Adapted is called after each change this Limiter
// made to key's state (a decrease, an increase, a new ceiling), with the
// state after it. The rules of Observer apply; Adapted may also be called
// from the Limiter's background work.
type AdaptiveObserver interface {
	Adapted(key string, s AdaptiveState)
}

// RegisterAdapted adds f to the functions [AdaptedOf] asks: f returns
// the function that tells o of adaptive changes when o is an Observer of
// f's package (package throttle/otelmetrics), and false otherwise. Call
// it from an init function only, as [Register].
func RegisterAdapted(f func(o any) (func(key string, s AdaptiveState), bool)) {
	adaptedProviders = append(adaptedProviders, f)
}

// AdaptedOf returns the function a Limiter calls after each change of a
// key's adaptive rate, for its Observer o: o's Adapted when it is an
// [AdaptiveObserver], else what a registered package gives.
func AdaptedOf(o any) (func(key string, s AdaptiveState), bool) {
	if ao, ok := o.(AdaptiveObserver); ok {
		return ao.Adapted, true
	}
	for _, f := range adaptedProviders {
		if fn, ok := f(o); ok {
			return fn, true
		}
	}
	return nil, false
}

var adaptedProviders []func(o any) (func(key string, s AdaptiveState), bool)

// Set is what a bucket of this module offers a Limiter beyond Take, as
// [SetOf] returns it: a nil field, or false, is a capability
// the bucket does not have.
type Set struct {
	Refunder        Refunder
	Pauser          Pauser
	DimensionPauser DimensionPauser
	Fallbacker      Fallbacker
	AdaptiveStore   AdaptiveStore
	// Immediate answers Immediate.Immediate.
	Immediate bool
}

// providers are the functions [Register] added; keyedLimiter is the
// function [RegisterKeyed] set. Both are written by init functions only.
var (
	providers    []func(b any) (Set, bool)
	keyedLimiter func(k any) Limiter
)

// Register adds f to the functions [SetOf] asks: f returns the Set of b
// when b is a bucket of f's package, and false otherwise. Package bucket
// calls it from its init function; call it from nowhere else (the
// registry is read without a lock).
func Register(f func(b any) (Set, bool)) { providers = append(providers, f) }

// SetOf returns the Set of b if b is a bucket of a registered package
// (package bucket), and false otherwise (a user's bucket, a wrapper: the
// Limiter then looks at b's method set and its Unwrap chain).
func SetOf(b any) (Set, bool) {
	for _, f := range providers {
		if s, ok := f(b); ok {
			return s, true
		}
	}
	return Set{}, false
}

// RegisterKeyed sets the function [KeyedLimiter] calls. Package throttle
// calls it from its init function; call it from nowhere else.
func RegisterKeyed(f func(k any) Limiter) { keyedLimiter = f }

// KeyedLimiter returns what the throttle.Keyed k shows the other packages
// of this module (throttle/httpclient, consumer, the examples and
// commands): its Limiter's clock and capabilities, its permits. k must be
// a throttle.Keyed (any other value gives an inert Limiter: the real
// clock, no capabilities, nothing to forfeit).
func KeyedLimiter(k any) Limiter { return keyedLimiter(k) }

// Find returns what of s implements T (one of this package's interfaces),
// if s has it. Immediate is found only when true: false leaves the
// question to the next bucket of a chain.
func Find[T any](s Set) (T, bool) {
	var immediate any
	if s.Immediate {
		immediate = immediateFlag{}
	}
	for _, c := range [...]any{s.Refunder, s.Pauser, s.DimensionPauser, s.Fallbacker, s.AdaptiveStore, immediate} {
		if t, ok := c.(T); ok {
			return t, true
		}
	}
	var zero T
	return zero, false
}

// Limiter is what a throttle.Keyed shows the other packages of this
// module (throttle/httpclient, consumer, the examples and commands), as
// [KeyedLimiter] returns it.
type Limiter interface {
	// Clock is the clock the Limiter sleeps on (throttle.WithClock).
	Clock() clockwork.Clock
	// Capabilities is what the Limiter found on its bucket, along its
	// Unwrap chain.
	Capabilities() Set
	// Forfeit gives up the permits of the key that ctx holds
	// (throttle.Keyed.ContextWithPermit), so that a later Acquire takes
	// new ones, and returns how many of the innermost ones were never
	// used: given up now, or by an earlier Forfeit.
	Forfeit(ctx context.Context) int64
	// AdaptiveState is the key's adaptive rate as the Limiter last knew
	// it, read from the store when that view is stale.
	AdaptiveState(ctx context.Context) (AdaptiveState, error)
	// None reports that the Keyed has no Limiter: the zero Keyed, or the
	// Key of a nil Limiter (whose key still names a concurrency slot).
	None() bool
}

// immediateFlag answers Immediate: true.
type immediateFlag struct{}

func (immediateFlag) Immediate() bool { return true }

// Funcs for the buckets that build a Set from their own methods.
type (
	// RefundFunc is a Refunder.
	RefundFunc func(ctx context.Context, key string, n int64) error
	// PauseFunc is a Pauser.
	PauseFunc func(ctx context.Context, key string, d time.Duration) error
	// PauseDimensionsFunc is a DimensionPauser.
	PauseDimensionsFunc func(ctx context.Context, key string, dims []Exhausted) error
	// FallbackFunc is a Fallbacker.
	FallbackFunc func() (limit int64, interval time.Duration, instances int64)
)

// Refund calls f.
func (f RefundFunc) Refund(ctx context.Context, key string, n int64) error { return f(ctx, key, n) }

// Pause calls f.
func (f PauseFunc) Pause(ctx context.Context, key string, d time.Duration) error {
	return f(ctx, key, d)
}

// PauseDimensions calls f.
func (f PauseDimensionsFunc) PauseDimensions(ctx context.Context, key string, dims []Exhausted) error {
	return f(ctx, key, dims)
}

// Fallback calls f.
func (f FallbackFunc) Fallback() (int64, time.Duration, int64) { return f() }

// AdaptiveFuncs is an AdaptiveStore.
type AdaptiveFuncs struct {
	Pace func(ctx context.Context, key string, n int64, interval, horizon time.Duration) (AdaptivePace, error)
	Swap func(ctx context.Context, key string, old, next AdaptiveState, ttl time.Duration) (AdaptiveState, bool, error)
}

// PaceAdaptive calls a.Pace.
func (a AdaptiveFuncs) PaceAdaptive(ctx context.Context, key string, n int64, interval, horizon time.Duration) (AdaptivePace, error) {
	return a.Pace(ctx, key, n, interval, horizon)
}

// SwapAdaptive calls a.Swap.
func (a AdaptiveFuncs) SwapAdaptive(ctx context.Context, key string, old, next AdaptiveState, ttl time.Duration) (AdaptiveState, bool, error) {
	return a.Swap(ctx, key, old, next, ttl)
}

// ReadAdaptive reads key's adaptive state from s in one call (a swap with
// a version below 0); the zero state means the budget is not adapting.
func ReadAdaptive(ctx context.Context, s AdaptiveStore, key string) (AdaptiveState, error) {
	st, _, err := s.SwapAdaptive(ctx, key, AdaptiveState{Version: -1}, AdaptiveState{}, time.Millisecond)
	return st, err
}

// Of returns b's capability T: b itself when its method set has it (a
// user's bucket), else what [SetOf] gives (a bucket of package bucket). It
// does not follow Unwrap.
func Of[T any](b any) (T, bool) {
	if t, ok := b.(T); ok {
		return t, true
	}
	if s, ok := SetOf(b); ok {
		return Find[T](s)
	}
	var zero T
	return zero, false
}

// PaceNote, carried by a context ([WithPaceNote]), learns whether a
// throttle.Limiter's wait under that context waited for its bucket's
// pace: for a grant's place in its period, a refusal's retry time (in
// private or behind the key's closed gate), a reservation, or the
// adaptive pace. A grant that came without any of these came as fast as
// the bucket answered. The consumer's fairness scheduler keeps more
// permit requests outstanding only while grants come that fast (more
// requests then make more permits), and one while the Limiter paces them
// (more would only take places in a row). Safe for concurrent use.
//
// It also learns until when the permit the wait handed over may be used
// (UseBy): its time plus the bucket's margin (throttle.Decision.Margin),
// so that a holder of a permit it cannot use at once (the scheduler,
// waiting for a worker) drops it rather than send late.
type PaceNote struct {
	paced atomic.Bool
	useBy atomic.Int64 // Unix ns; 0: no bound
}

// Paced reports whether a wait under the note's context waited for the
// bucket's pace since the note was made or last Reset.
func (n *PaceNote) Paced() bool { return n.paced.Load() }

// UseBy is until when the permit of the last wait under the note's
// context may be used; zero when its bucket bounds nothing.
func (n *PaceNote) UseBy() time.Time {
	if ns := n.useBy.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Reset forgets what the note learned, for the next wait under its
// context.
func (n *PaceNote) Reset() {
	n.paced.Store(false)
	n.useBy.Store(0)
}

type paceNoteKey struct{}

// NoteOf returns the PaceNote ctx carries, nil if none.
func NoteOf(ctx context.Context) *PaceNote {
	n, _ := ctx.Value(paceNoteKey{}).(*PaceNote)
	return n
}

// WithPaceNote returns ctx carrying n.
func WithPaceNote(ctx context.Context, n *PaceNote) context.Context {
	return context.WithValue(ctx, paceNoteKey{}, n)
}

// NotePaced tells the PaceNote ctx carries, if any, that its wait waited
// for the bucket's pace; the Limiter calls it before each such wait.
func NotePaced(ctx context.Context) {
	if n, ok := ctx.Value(paceNoteKey{}).(*PaceNote); ok {
		n.paced.Store(true)
	}
}

// NoteUseBy tells the PaceNote ctx carries, if any, until when the permit
// its wait hands over may be used; the Limiter calls it as it returns.
func NoteUseBy(ctx context.Context, t time.Time) {
	if n, ok := ctx.Value(paceNoteKey{}).(*PaceNote); ok {
		n.useBy.Store(t.UnixNano())
	}
}

type useByKey struct{}

// WithUseBy returns ctx carrying t, until when the permits a
// throttle.Keyed.ContextWithPermit made with it (or a context derived
// from it) hold may be used: the consumer hands its attempt's permit to
// the handler that way, and a call made later takes one of its own.
func WithUseBy(ctx context.Context, t time.Time) context.Context {
	if t.IsZero() {
		return ctx
	}
	return context.WithValue(ctx, useByKey{}, t)
}

// UseByOf returns the time WithUseBy put in ctx, zero if none.
func UseByOf(ctx context.Context) time.Time {
	t, _ := ctx.Value(useByKey{}).(time.Time)
	return t
}
