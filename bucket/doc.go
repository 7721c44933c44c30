// Package bucket has the Redis-backed buckets a fleet of instances shares:
// each implements [throttle.Bucket], so a [throttle.Limiter] draws from it.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	b, err := bucket.NewTokenBucket(rdb, "provider-x", 200, 500*time.Millisecond)
//	if err != nil {
//		return err // bad configuration is refused here
//	}
//	lim := throttle.New(b)
//	err = lim.Acquire(ctx, 2*time.Second)
//
// Pick the bucket that matches how the provider counts:
//
//	bucket       provider policy                      guarantee                           trips/grant
//	TokenBucket  N per interval, however counted      ≤ limit in any span of one          ≤ 1
//	             (default)                            interval, at send time
//	FixedWindow  wall-clock-aligned windows           ≤ limit per aligned window          1
//	Tiers        several aligned windows at once      each tier's own, all-or-nothing     1
//	SlidingLog   sliding window(s)                    ≤ limit in any span of the window   1
//	GCRA         smooth rate with a burst             ≤ burst + rate·t in any span t      1
//	Counter      N per period, reset by a leader      ≤ limit per reset, resets           1
//	 + Resetter                                       ≥ period apart
//	Budget       several dimensions (requests and     each dimension ≤ limit in any       1
//	             tokens per minute), cost settled     span of its interval, at send
//	             after the call                       time; all-or-nothing; Settle up
//	                                                  counts on top
//
// Besides rates, [Concurrency] caps the calls in flight per key across
// the fleet ([throttle.Slots]): at most N at once, a dead holder's slot
// back within a lease, waiters served in arrival order.
//
// Every bucket:
//   - decides on the Redis server's clock (TIME inside scripts, or key
//     expiry), never on the caller's, so instances with skewed clocks agree;
//   - takes at most one round trip per decision: one Lua script, run with
//     EVALSHA and reloaded after NOSCRIPT (a restart, a failover);
//   - coalesces concurrent takes of one permit for the same key in one
//     process into one round trip (see Coalesced takes below), but
//     [Budget], whose costs differ call by call;
//   - charges nothing for a denied call, and grants n permits all or none;
//   - names, when it refuses, the time after which asking again can succeed
//     (Decision.Delay), so a Limiter sleeps instead of polling; the
//     [TokenBucket] places a permit, and [GCRA] reserves a future slot, up
//     to the caller's maxWait ahead;
//   - fills Decision.Limit, Remaining and Reset, for X-RateLimit headers;
//   - keeps an independent budget per key passed to Take (a tenant, an
//     endpoint), and can be paused by a Limiter for the whole fleet: one
//     instance that sees a 429 with Retry-After can hold every instance.
//
// # Coalesced takes
//
// While a take for a key is on its way to Redis, other takes of one permit
// for the same key in the same process queue behind it; when it returns,
// one script call asks for "up to k" permits, k the callers queued at that
// moment (at most 1,000: a larger crowd goes in several calls), and the
// script grants as many as it can, from 1 to k, at once.
// The first callers in arrival order get them (for the two buckets below,
// those whose waits they fit); the others get the refusal the script gave
// for the rest (the period's end, the next slot) and wait as they would
// have. So under load a process makes one round trip per batch, not per
// caller (64 goroutines: about 0.03–0.04 commands per grant), with no
// permit taken ahead of demand and none refunded: each bucket's guarantee
// holds as it is, because the script counts an up-to-k take exactly as k
// takes of one. The [TokenBucket] and [GCRA] take their batch in order of
// the wait its callers have left, least first (arrival order when their
// waits are alike), place each caller's permit within that caller's own
// wait (a place, a reserved slot), and refuse alone a caller whose wait no
// place fits. Where the configured limit puts places less than a
// millisecond apart (above 1,000 permits a second) the waits go to Redis
// by the millisecond: a caller whose batch holds a shorter wait in the
// same millisecond is bounded by that one, so it may be refused a place
// in the last millisecond of its own.
//
// A take of n > 1 permits (AcquireN) is not coalesced: it goes to Redis on
// its own, all or nothing. A caller whose context ends while queued leaves
// the queue; one whose context ends while its batch is in flight returns at
// once with a [*throttle.BackendError] (as an uncoalesced call cut off
// mid-flight does), and the permit the batch took for it goes to a later
// caller of the batch that was refused and can wait for it, or to the next
// caller in line that can (for a bucket other than the TokenBucket and
// GCRA, whose permits carry their times, one in line before the batch's
// call was sent: its permits count from when the store decided them, and
// every grant is decided after its caller asked), or, if none is left, is
// lost as an abandoned uncoalesced call's permit is. A key's batches run
// on a goroutine of its own that ends when no caller is left in line; each
// call ends at the latest a few milliseconds after the latest deadline of
// its callers. When a call in flight has not returned for 50 ms (a dead
// connection), one caller of its key at a time asks Redis around it; the
// others stay in line.
//
// # Keys and Redis Cluster
//
// The keys of one budget share one hash tag, so every script's keys live in
// one cluster slot, and every key is passed in KEYS, never built inside a
// script:
//
//	<prefix>:{<key>}:<kind>           the constructor's key (Take key "")
//	<prefix>:{<key>/<tenant>}:<kind>  a per-call key
//
// kind is tb and tb:limit (TokenBucket: tb is the schedule of its
// permits' places, expiring when the last of them stops counting), fw:<µs>
// and fw:<µs>:limit (FixedWindow), tier:<µs> (Tiers), log (SlidingLog),
// gcra and gcra:limit (GCRA), ctr and ctr:lock (Counter), budget:<name>
// (Budget: one list per dimension) and pause:dims, adapt and adapt:tat
// (the adaptive rate of a bucket that keeps it), slots, slots-queue, slots-waiting,
// slots-seq, slots-gone and slots-gen (Concurrency; slots and slots-gen
// live max(1 h, 4 leases) past the last call), and pause for every
// bucket; under the constructor's tag only, every bucket also writes live
// (the sorted set of live instances, which expires two heartbeat windows
// after the last take). The prefix is "headway" unless [WithPrefix] says
// otherwise. User keys are percent-escaped ('%', '{', '}', and '/' in the
// constructor's key), so a stray brace cannot move a key to another slot,
// and are at most [MaxKeyLen] bytes. Each tenant has its own tag, so
// tenants spread over the cluster.
//
// # Live limits
//
// The limit of a [TokenBucket], [FixedWindow] or [GCRA] can be changed
// while the fleet runs, without a restart: SetLimit stores it in Redis next
// to the budget it governs,
//
//	<prefix>:{<key>[/<tenant>]}:<kind>:limit
//
// in the budget's hash tag (so its cluster slot), and the take script reads
// it in the round trip it already makes: still one round trip per grant,
// and every instance sees the change at its next Take. While the key is
// absent the constructor's limit applies (it is the default), and
// ClearLimit goes back to it. The override is per budget: a limit set for
// key "" governs the constructor's key only, a limit set for a tenant
// governs that tenant only; tenants without one keep the constructor's.
// It has no expiry. When it applies:
//
//	TokenBucket  from the next take: the permits placed before it count against the new limit
//	FixedWindow  from the next window (≤ one interval): a window's limit is fixed by its first grant
//	GCRA         at once; slots already reserved keep their times
//
// So lowering a limit never lets more than the old limit through in the
// running window (a TokenBucket: more than the new one in any span of one
// interval from the next take on), and Decision.Limit reports the limit
// in force (the running window's). State reads a budget's limit,
// usage, reset and pause in two round trips; cmd/headwayctl does both
// from a shell.
//
// # Errors
//
// Redis failures come back from Take as [*throttle.BackendError], for a
// [throttle.Limiter]'s failure policy to decide. Take returns by its
// context's deadline even when the client blocks (without go-redis's
// ContextTimeoutEnabled, the round trip goes on in a goroutine until the
// client's ReadTimeout). Build the client with ContextTimeoutEnabled: true:
// that bound then costs nothing, where otherwise each call pays for a
// goroutine. A take is never charged twice: scripts go out as commands
// go-redis must not resend once they may have reached the server, so a
// take whose reply was lost fails (and the failure policy decides) instead
// of running again. A Limiter's FailLocal shares the limit among the live
// instances, counted by heartbeats piggybacked on takes ([WithHeartbeat]).
//
// Constructors refuse bad configuration with an error naming the field,
// wrapping [throttle.ErrInvalid]; Take refuses n above what the bucket
// can ever grant with [throttle.ErrExceedsLimit], without a round trip.
//
// # Options
//
// Each constructor has its own option type ([TokenBucketOption],
// [GCRAOption], [ConcurrencyOption], ...): an option given to a
// constructor that does not read it does not compile. An option read by
// several constructors implements several of these types ([WithPrefix]
// every one of them).
//
// # What a Limiter uses beyond Take
//
// Every Redis bucket of this package offers a [throttle.Limiter] more than
// Take, through the interfaces of package throttle that the Limiter finds
// by type assertion ([throttle.BucketAs]): Pause, the fleet-wide pause
// ([throttle.Pauser]); Fallback, the limit and live instances for
// FailLocal ([throttle.Fallbacker]); PaceAdaptive and SwapAdaptive, the
// adaptive rate's store ([throttle.AdaptiveStore]); Check
// ([throttle.Checker]); and a [Budget] pauses single dimensions
// ([throttle.DimensionPauser]). A program may call them too (pause a
// tenant, read the fleet's adaptive rate). A wrapper of your own keeps
// them by embedding the bucket or by offering Unwrap (see
// [throttle.Bucket]).
package bucket
