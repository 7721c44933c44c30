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

	// ticket names a reservation of a [Local] bucket (its state right
	// after the grant), so that an abandoned reservation can be given back
	// exactly; 0 for anything else.
	ticket int64
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
