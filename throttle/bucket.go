package throttle

import (
	"context"
	"time"
)

// Bucket is the store of permits a [Limiter] draws from. The in-memory
// [Local] bucket and the Redis-backed buckets of package
// github.com/headway-go/headway/bucket implement it; so can a user's own.
//
// A Bucket decides; it never sleeps. The Limiter does the waiting, on its
// clock, for exactly as long as the Decision says, so no caller polls.
//
// Beyond Take, a Limiter uses what a bucket offers through optional
// interfaces: [Refunder], [Pauser], [Fallbacker], [AdaptiveStore],
// [Immediate], [Checker], [Periodic]. A bucket that wraps another (to
// count its calls, say) keeps them all by adding a method
//
//	Unwrap() Bucket
//
// that returns the bucket it wraps: the Limiter looks for each interface
// on the wrapper first, then along the chain of Unwrap calls, and uses the
// first bucket that has it (as errors.As does). A wrapper that must see
// one of those calls implements that interface itself. A reservation's
// exact cancellation travels in the Decision ([Decision.Cancel]), so a
// wrapper that returns the inner Decision keeps it.
//
// Implementations must be safe for concurrent use.
type Bucket interface {
	// Take asks for n permits under key at the moment of the call.
	//
	// key names a sub-limit (a tenant, an endpoint) with the bucket's own
	// limit; "" is the bucket's own key. Buckets keep one independent
	// budget per key and must accept any non-empty string as a key,
	// escaping it as their store needs.
	//
	// maxWait is how far ahead the caller is willing to wait (never
	// negative; [Forever] for no bound). A bucket that can reserve (GCRA)
	// may grant a slot up to maxWait in the future and say so with
	// Decision.Delay; a bucket that cannot reserve ignores it.
	//
	// Take returns an error wrapping [ErrExceedsLimit] when n can never be
	// granted (n above the bucket's capacity), and a [*BackendError] when
	// its store fails.
	Take(ctx context.Context, key string, n int64, maxWait time.Duration) (Decision, error)
}

// Decision is a bucket's answer to [Bucket.Take].
//
// Granted with Delay == 0: the permits are the caller's now. Granted with
// Delay > 0: the permits are reserved for the caller from Delay on (the
// Limiter sleeps that long before returning). Not granted: Delay is the
// earliest time after which asking again can succeed (a refill, a window's
// end, the end of a pause); the Limiter sleeps until then, or fails at once
// when that is beyond the caller's wait.
type Decision struct {
	// Granted reports whether the permits were granted or reserved.
	Granted bool
	// Delay is the time to wait: before using reserved permits when
	// Granted, before asking again when not. A bucket that cannot tell
	// leaves it 0 and the Limiter retries after a short pause (1 ms).
	Delay time.Duration
	// Limit is the bucket's capacity per interval for this key, for
	// rate-limit headers. 0 if unknown.
	Limit int64
	// Remaining is how many permits are left in the current interval after
	// this decision. -1 if unknown.
	Remaining int64
	// Reset is the time until the current interval ends or the bucket is
	// full again. 0 if unknown.
	Reset time.Duration

	// Cancel, when set on a reservation (Granted with Delay > 0), gives
	// the reservation back exactly, as if it had never been made, if the
	// bucket still can (nothing booked after it, its slot not begun);
	// otherwise it does nothing. A Limiter calls it at most once, when its
	// caller gives up the wait. A bucket that cannot cancel exactly leaves
	// it nil, and the Limiter hands the permits back through [Refunder].
	Cancel func(ctx context.Context) error

	// Settle, set on a grant of a [CostBucket] (TakeCost), corrects the
	// grant once the call's real cost is known: delta holds, per
	// dimension, the real cost less what was taken. A positive amount is
	// charged at once, even beyond what is left (a debt the next refills
	// pay first); a negative one is given back only to the period the
	// grant was taken from, while it runs (once it has ended, it can only
	// lessen a debt): never to a later period, which would grant it a
	// second time. [CostGrant.Settle] calls it at most once.
	Settle func(ctx context.Context, delta Cost) error
}

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
// A pause longer than [MaxPause] (throttle.Forever, say) is clamped to
// MaxPause by every Pauser of this module: it holds for a year rather
// than overflow the clock's arithmetic and do nothing.
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
// store that could fail or hang ([Local]). A Limiter calls such a bucket
// without a deadline of its own and never applies its [FailurePolicy] to
// it. Immediate returns false for a wrapper that does wait on something.
type Immediate interface {
	Immediate() bool
}

// Periodic is implemented by buckets that grant up to their limit afresh
// in each period, at any pace within it: a token bucket refilled at once,
// a fixed window, a counter reset every period. Their Decisions count one
// period each: Limit is the period's limit, Remaining what is left of it
// after the decision, Reset the time until it ends; the period's length is
// the interval [Fallbacker] reports.
//
// Such a bucket lets the end of one period's grants and the start of the
// next period's meet within one interval: up to twice the limit, which a
// provider counting a sliding window (or periods of its own) refuses. A
// Limiter spreads a crowd's grants over the period instead (see
// [Limiter.Acquire]). Periodic returns false for a wrapper whose
// Decisions do not count periods that way.
type Periodic interface {
	Periodic() bool
}

// Checker is implemented by buckets that can check their store cheaply
// (the Redis buckets: one round trip), for [Limiter.Check].
type Checker interface {
	Check(ctx context.Context) error
}

// capability returns the first bucket in b's chain (b, then what each
// Unwrap returns) that implements T.
func capability[T any](b Bucket) (T, bool) {
	for range 100 { // a chain that loops ends here
		if b == nil {
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
	var zero T
	return zero, false
}

// Tier is one limit: at most Limit permits per Period. Buckets that keep
// several limits at once (package bucket's Tiers and SlidingLog, the SLAs
// of package httpserver) take a list of them, and grant a call only when
// every tier has room.
type Tier struct {
	// Limit is how many permits a key may take per Period; at least 1.
	Limit int64
	// Period is the window's length; positive.
	Period time.Duration
}

// MaxPause is the longest pause the Pausers of this module keep; a longer
// one is clamped to it (see [Pauser]).
const MaxPause = 365 * 24 * time.Hour
