// Package bucket has the Redis-backed buckets a fleet of instances shares:
// each implements [throttle.Bucket], so a [throttle.Limiter] draws from it.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	b, err := bucket.NewTokenBucket(rdb, "mparticle", 200, 500*time.Millisecond)
//	if err != nil {
//		return err // bad configuration is refused here
//	}
//	lim := throttle.New(b)
//	err = lim.Acquire(ctx, 2*time.Second)
//
// Pick the bucket that matches how the provider counts:
//
//	bucket       provider policy                      guarantee                           trips/grant  seed
//	TokenBucket  N per period, then wait (default)    ≤ limit per refill, refills         1            002
//	                                                  ≥ interval apart
//	FixedWindow  wall-clock-aligned windows           ≤ limit per aligned window          1            000
//	Tiers        several aligned windows at once      each tier's own, all-or-nothing     1            000, 003
//	SlidingLog   sliding window(s)                    ≤ limit in any span of the window   1            003
//	GCRA         smooth rate with a burst             ≤ burst + rate·t in any span t      1            (004's smoothing)
//	Counter      N per period, reset by a leader      ≤ limit per reset, resets           1            001
//	 + Resetter                                       ≥ period apart
//
// Every bucket:
//   - decides on the Redis server's clock (TIME inside scripts, or key
//     expiry), never on the caller's, so instances with skewed clocks agree;
//   - takes one round trip per decision in steady state: one Lua script,
//     run with EVALSHA and reloaded after NOSCRIPT (a restart, a failover);
//   - charges nothing for a denied call, and grants n permits all or none;
//   - names, when it refuses, the time after which asking again can succeed
//     (Decision.Delay), so a Limiter sleeps instead of polling; [GCRA] even
//     reserves a future slot up to the caller's maxWait;
//   - fills Decision.Limit, Remaining and Reset, for X-RateLimit headers;
//   - keeps an independent budget per key passed to Take (a tenant, an
//     endpoint), and implements [throttle.Pauser]: one instance that sees a
//     429 with Retry-After can hold the whole fleet.
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
// kind is tb and tb:lock (TokenBucket), fw:<µs> (FixedWindow), tier:<µs>
// (Tiers), log (SlidingLog), gcra (GCRA), ctr and ctr:lock (Counter), and
// pause for every bucket. The prefix is "headway" unless [WithPrefix] says
// otherwise. User keys are percent-escaped ('%', '{', '}', and '/' in the
// constructor's key), so a stray brace cannot move a key to another slot,
// and are at most [MaxKeyLen] bytes. Each tenant has its own tag, so
// tenants spread over the cluster.
//
// # Errors
//
// Constructors refuse bad configuration with an error wrapping
// [throttle.ErrInvalid] that names the field. Take refuses n above what the
// bucket can ever grant with [throttle.ErrExceedsLimit], without a round
// trip. Redis failures come back as [*throttle.BackendError].
package bucket
