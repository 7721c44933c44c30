// Package throttle keeps callers under a rate limit, locally or across a
// fleet: it is headway's front door.
//
// A [Limiter] hands out permits from a [Bucket]. The bucket decides (is a
// permit free, and if not, when will one be?); the Limiter waits. Most
// callers want [Limiter.Acquire]:
//
//	lim := throttle.New(b)
//	if err := lim.Acquire(ctx, 2*time.Second); err != nil {
//		return err // throttle.ErrTimeout, or ctx's error
//	}
//	callTheProvider()
//
// maxWait 0 takes a permit only if one is free now; a positive maxWait
// waits at most that long; [Forever] waits until ctx ends. The earlier of
// maxWait and ctx's deadline bounds the wait.
//
// Buckets: [Local] limits one process, in memory. Package
// github.com/headway-go/headway/bucket has the Redis-backed buckets that
// a whole fleet shares (token bucket, fixed window, counter with resetter,
// sliding log, GCRA, tiers); each states the guarantee it keeps. A
// Limiter built [WithLeasing] takes permits in batches sized by demand and
// hands them out from memory (far fewer round trips).
//
// The limit holds where the provider counts it, when the calls arrive: a
// bucket may give its permits a time (Decision.Delay) and a margin
// (Decision.Margin), and the Limiter returns at that time, within the
// margin, whatever the caller's wait; package bucket's TokenBucket places
// every permit so that at most the limit is sent in any span of one
// interval.
//
// Per key: [Limiter.Key] gives each tenant or endpoint its own budget in
// one bucket.
//
// Answers: [Limiter.Report] tells the Limiter what a provider answered to a
// call (an [Answer]: a refusal, a retry time, an advertised limit); a retry
// time pauses the bucket for the whole fleet, and a refusal lowers the
// fleet's adaptive rate (docs/adaptive.md gives the law). A handler of
// package consumer returns the answer in an [AnswerError].
//
// Errors: [ErrTimeout] when no permit comes within the wait,
// [ErrExceedsLimit] when one never can, [ErrInvalid] for a bad argument or
// configuration, and a [*BackendError] when the bucket's store fails
// (the [FailurePolicy] decides meanwhile).
//
// Calls in flight: [Slots] caps how many calls run at once per key, a
// slot held from Hold until its release; [NewLocalSlots] caps one process,
// and package bucket's Concurrency a fleet.
//
// Costs: a call that spends several things at once (one request and 800
// tokens of an LLM API), known only after it, takes an estimated [Cost]
// with [Limiter.AcquireCost] and corrects it with the grant's
// [CostGrant.Settle] (a give-back only where the grant was counted, while
// it counts), from a [CostBucket] (package bucket's Budget) that takes
// every dimension or none.
//
// Around the core, in packages of their own: throttle/httpclient has an
// http.RoundTripper that takes a permit before each outbound request and
// turns a provider's "too many requests" into a pause of the shared
// bucket; throttle/httpserver limits a provider's own API per tenant and
// endpoint; throttle/otelmetrics reports a Limiter's work to
// OpenTelemetry.
//
// Options: each constructor has its own option type ([LimiterOption] for
// [New], [LocalOption] for [NewLocal]); [WithClock], read by both,
// implements both, and an option given to a constructor that does not
// read it does not compile.
//
// Guarantees of this package:
//   - A Limiter never polls: when a bucket refuses it names when to come
//     back, and the Limiter sleeps until then (on the clock of
//     [WithClock]), or returns [ErrTimeout] at once when that is beyond
//     the caller's wait.
//   - A cancelled context ends a wait at once; no goroutine outlives a call,
//     but the Limiter's own updates of the adaptive rate, each at most the
//     store timeout long, and give-backs of permits unused, each at most
//     a second ([Limiter.Close] waits for both).
//   - Bad arguments are refused with an error matching [ErrInvalid] that
//     names the argument; nothing here panics on user input.
//   - Acquire returns by the end of the caller's wait even when the
//     bucket's store hangs; while the store fails, the Limiter's
//     [FailurePolicy] decides (default [FailLocal]: this instance's share
//     of the limit, in memory), and the shared limit resumes at the first
//     call after the store answers again. [Limiter.Check] tells a
//     readiness probe whether the store answers.
//   - A Limiter's memory follows the keys in use: a key idle for a second
//     (or the bucket's interval, up to ten minutes) that holds nothing in
//     force is forgotten.
//   - Time is measured on the clock's monotonic readings: a wall clock
//     that steps (NTP, a VM resumed) changes no wait.
//
// Package throttle depends on the standard library, clockwork and
// packages internal to this module only.
package throttle
