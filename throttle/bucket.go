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
// Beyond Take, a Limiter uses what else a bucket offers, found by type
// assertion ([BucketAs]): [Refunder] (give back permits not used),
// [Pauser] (stop granting a key for the fleet: a provider's Retry-After),
// [DimensionPauser] (the same per dimension of a [CostBucket]),
// [Fallbacker] (the limit and the live instances, for [FailLocal] and the
// adaptive rate), [AdaptiveStore] (the adaptive rate shared by the
// fleet), [Checker] (for [Limiter.Check]), and
//
//	// Immediate reports that Take decides at once, with no store that
//	// could fail or hang: no store timeout, no FailurePolicy.
//	Immediate() bool
//
// The buckets of package bucket and [Local] implement those that fit
// them. A bucket that wraps another (to count its calls, say) keeps them
// all by adding a method
//
//	Unwrap() Bucket
//
// that returns the bucket it wraps: the Limiter looks for each interface
// on the wrapper first, then along the chain of Unwrap calls, and uses
// the first bucket that has it (as errors.As does); Immediate only on b
// itself. A wrapper that embeds a bucket (struct{ *bucket.TokenBucket })
// keeps them as promoted methods, which call the wrapped bucket with the
// key as given: a wrapper that rewrites keys in Take (a tenant prefix,
// say) must have Pause, PaceAdaptive and SwapAdaptive of its own that
// rewrite them alike, and one whose Take waits over an embedded Local
// must define Immediate() bool { return false }. A wrapper that must see
// one of those calls has that method itself and passes it on to the
// wrapped bucket's. A reservation's exact cancellation travels in the
// Decision ([Decision.Cancel]): a wrapper that returns it keeps it.
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
	// Decision.Delay; a bucket that cannot reserve ignores it. A bucket
	// may book less far ahead than maxWait and refuse with the earliest
	// time instead.
	//
	// Take must return by ctx's end, even when its store hangs: the
	// Limiter gives each call a deadline a little before the end of the
	// caller's wait (or the store timeout, [WithStoreTimeout]), and its
	// failure policy decides for a call cut off there.
	//
	// Take returns an error wrapping [ErrExceedsLimit] when n can never be
	// granted (n above the bucket's capacity), and a [*BackendError] when
	// its store fails.
	Take(ctx context.Context, key string, n int64, maxWait time.Duration) (Decision, error)
}

// Decision is a bucket's answer to [Bucket.Take].
//
// Granted: the permits have a time, Delay from when Take returns (0:
// now), from which the caller may use them, and, when Margin is set, until
// Margin after it; the Limiter sleeps until that time before it returns. Not granted: Delay is the earliest time after which asking
// again can succeed (the end of a window or a pause); the Limiter sleeps
// until then, or fails at once when that is beyond the caller's wait.
type Decision struct {
	// Granted reports whether the permits were granted.
	Granted bool
	// Delay is the time to wait: until the permits' time when Granted,
	// before asking again when not. A bucket that cannot tell leaves it 0
	// and the Limiter retries after a short pause (1 ms).
	Delay time.Duration
	// Margin, when positive, is how long after their time granted
	// permits may still be used: the delay between a permit's time and
	// its call's arrival at the provider that the bucket's guarantee
	// absorbs, less what the store's answer took to come back (a bucket
	// whose store decided before Take returned: its permits' time may
	// have been that much earlier). A Limiter that cannot hand the
	// permits to its caller within it (a store that answered late, a
	// stalled process) asks for others instead. 0: no bound.
	Margin time.Duration
	// Next, when positive on a grant, is the time until the earliest
	// place one more permit of the key could have now that this grant is
	// made, counted as Delay is (it may come before the grant's own
	// place, which pacing may have put later): a bucket that places its
	// permits may say it (package bucket's TokenBucket does). A Limiter
	// then refuses a caller of the key whose wait ends before it without
	// asking the bucket, as after a refusal, until a give-back of the key
	// (a place may then come sooner). It holds as of the answer: permits
	// given back elsewhere or a raised live limit may bring the place
	// sooner, and a bucket must never name one later than a take of one
	// permit could have then. 0: not known, or a permit is free now.
	Next time.Duration
	// Limit is the bucket's capacity per interval for this key, for
	// rate-limit headers. 0 if unknown.
	Limit int64
	// Remaining is how many permits are left in the current interval after
	// this decision. -1 if unknown.
	Remaining int64
	// Reset is the time until the current interval ends or the bucket is
	// full again. 0 if unknown.
	Reset time.Duration

	// Cancel, when set on a grant, gives the permits back exactly, as if
	// they had never been granted, if the bucket still can (GCRA: nothing
	// booked after the slot, the slot not begun; TokenBucket: while they
	// still count); otherwise it does nothing. A Limiter calls it at most
	// once, when the permits will not be used: its caller gave up the wait
	// before their time, or a pause was reported meanwhile. A bucket that
	// cannot cancel exactly leaves it nil, and the Limiter hands the
	// permits back through its Refund.
	Cancel func(ctx context.Context) error

	// Settle, set on a grant of a [CostBucket] (TakeCost), corrects the
	// grant once the call's real cost is known: delta holds, per
	// dimension, the real cost less what was taken. A positive amount is
	// charged at once, even beyond what is left (later grants wait until
	// it stops counting); a negative one is given back only where the
	// grant was counted, while it still counts: never to later grants,
	// which would then count it twice. [CostGrant.Settle] calls it at
	// most once.
	Settle func(ctx context.Context, delta Cost) error
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

// MaxPause is the longest pause the buckets of this module keep; a longer
// one is clamped to it (see [Pauser]).
const MaxPause = 365 * 24 * time.Hour
