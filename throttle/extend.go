package throttle

import (
	"context"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/internal/nilcheck"
)

// What a bucket may offer beyond Take (see [Bucket]). A Limiter, and the
// Transport of package throttle/httpclient, look for these interfaces with
// [BucketAs]; a bucket that lacks one goes without (each says what is lost).

// Refunder is implemented by buckets that can take back permits a caller
// was granted but did not use (a reservation abandoned because the caller's
// context ended, or leased permits handed back). Refund is best effort: a
// bucket may return fewer permits than asked, for example when the interval
// they belonged to has ended. Without it a Limiter gives back only what a
// grant's [Decision.Cancel] can, and the rest stays spent.
type Refunder interface {
	Refund(ctx context.Context, key string, n int64) error
}

// Pauser is implemented by buckets that can stop granting for a while, for
// every instance that shares them. A Pause seen by one instance holds for
// the whole fleet: Take answers "not granted" with Delay set to the pause
// left until it ends. A shorter pause never shortens a longer one, and d
// ≤ 0 does nothing.
//
// The Transport of package throttle/httpclient calls Pause when a
// provider answers "too many requests" with a retry time, and a Limiter
// when [Limiter.Report] hears of one; without it the pause holds in that
// Transport, or that Limiter's leased permits, only.
//
// A pause longer than [MaxPause] ([Forever], say) is clamped to MaxPause
// by every Pauser of this module: it holds for a year rather than
// overflow the clock's arithmetic and do nothing.
type Pauser interface {
	Pause(ctx context.Context, key string, d time.Duration) error
}

// DimensionPauser is implemented by a [CostBucket] that can stop granting
// some of a key's dimensions for a while, for every instance that shares
// it: until each named dimension's RetryAfter has passed, a cost that
// needs some of that dimension is refused, with Delay set to the pause
// left; a cost that needs none of it is not held. A shorter pause never
// shortens a longer one. The Transport of package throttle/httpclient
// with a cost per call (its WithCost) calls it when a provider's
// accounting headers (OpenAI's x-ratelimit-remaining-tokens: 0, say)
// alone name a retry time, so that "no tokens left for 6 s" holds back
// the tokens for 6 s, and a dimension that comes back sooner only until
// then. A dimension the bucket does not keep pauses the whole key for
// that long, as [Pauser] would. Without it the Transport pauses the whole
// key.
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

// Fallbacker is implemented by buckets that can tell their limit per
// interval, and, for a limit a fleet of instances shares, how many
// instances share it. A Limiter under [FailLocal] limits this instance on
// its own with it while the store is down (without it, FailLocal fails
// closed), and the adaptive rate ([Limiter.Report]) needs the limit
// (without it, refusals and advertised limits change no rate; a retry
// hint still pauses).
type Fallbacker interface {
	// Fallback returns the bucket's limit per interval and the number of
	// live instances sharing it. The limit is that of every key without a
	// live limit of its own (the constructor's): a limit set live for a
	// key is reported by that key's decisions (Decision.Limit), and the
	// Limiter keeps it from there. The instances are as last seen while
	// the store answered; 0 when never seen (an instance that started
	// while the store was down cannot know its share, and the Limiter
	// then fails closed). It must not block: it is called while the store
	// is down.
	Fallback() (limit int64, interval time.Duration, instances int64)
}

// Checker is implemented by buckets that can check their store cheaply
// (the Redis buckets: one round trip), for [Limiter.Check]; without it
// Check asks the bucket for nothing and succeeds.
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
	// the last increase and the last refusal, on the store's clock (the
	// Redis server's for a Redis bucket).
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
// for its own process. Either way the adaptive rate needs the bucket's
// limit: a bucket that is no [Fallbacker] does not adapt.
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

// AdaptiveObserver is implemented by an [Observer] that also wants to hear
// of the adaptive rate: Adapted is called after each change this Limiter
// made to key's state (a decrease, an increase, a new ceiling), with the
// state after it. The rules of Observer apply; Adapted may also be called
// from the Limiter's background work.
type AdaptiveObserver interface {
	Adapted(key string, s AdaptiveState)
}

// BucketAs returns the first bucket of b's chain (b, then what each
// Unwrap method returns, as errors.As follows Unwrap) that implements T:
// [Refunder], [Pauser], [DimensionPauser], [Fallbacker], [Checker],
// [AdaptiveStore] or any other interface; ok is false when none does. It
// is how a Limiter and the Transport find what a bucket offers:
//
//	if p, ok := throttle.BucketAs[throttle.Pauser](lim.Bucket()); ok {
//		err = p.Pause(ctx, "tenant-a", 30*time.Second)
//	}
func BucketAs[T any](b Bucket) (t T, ok bool) {
	for range 100 { // a chain that loops ends here
		if nilcheck.IsNil(b) {
			break
		}
		if t, ok := b.(T); ok {
			return t, true
		}
		u, ok := b.(interface{ Unwrap() Bucket })
		if !ok {
			break
		}
		b = u.Unwrap()
	}
	return t, false
}

// Bucket returns the bucket l draws from, as given to [New]; nil for a
// nil Limiter.
func (l *Limiter) Bucket() Bucket {
	if l == nil {
		return nil
	}
	return l.bucket
}

// Clock returns the clock l sleeps on ([WithClock]); the real clock for a
// nil Limiter.
func (l *Limiter) Clock() clockwork.Clock {
	if l == nil {
		return clockwork.NewRealClock()
	}
	return l.cfg.clock
}

// Limiter returns the Limiter k draws from; nil for the zero Keyed or the
// Key of a nil Limiter.
func (k Keyed) Limiter() *Limiter { return k.l }

// AdaptiveState returns the adaptive rate of k's key as k's Limiter last
// saw it (the fleet's, when the bucket is an [AdaptiveStore]), reading it
// from the store when the Limiter has not seen it within the last
// interval. The zero state means not adapting: no refusal was reported
// lately ([Limiter.Report], the Transport of throttle/httpclient).
func (k Keyed) AdaptiveState(ctx context.Context) (AdaptiveState, error) {
	if k.l == nil {
		return AdaptiveState{}, nil
	}
	return k.l.adaptiveState(ctx, k.key)
}
