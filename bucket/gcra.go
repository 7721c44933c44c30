package bucket

import (
	"context"
	"time"

	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
)

// GCRA paces permits smoothly with a burst: the generic cell rate algorithm,
// a token bucket of capacity burst refilled continuously at limit per
// interval, kept as one timestamp in Redis. It smooths the burst a
// period-based bucket allows at each period's start, and matches a
// provider that enforces a smooth rate ("10 per second, at most 20 at
// once"), a leaky bucket, or any provider you would rather not hit in
// bursts (WithBurst(1) spaces calls evenly).
//
// Guarantee: in any span of time t, at most burst + limit·t/interval
// permits, counted at the times they may be used, on the Redis server's
// clock. The emission interval (interval/limit) is rounded up to the
// microsecond, which can only slow the rate.
//
// Reservations: asked with maxWait > 0, GCRA books the next free slot up
// to maxWait ahead and answers Granted with Delay = the time until it; the
// Limiter sleeps exactly that long, so waiters are served in order and
// nobody polls. A reservation the caller abandons is not given back: GCRA
// takes no refunds, as a refund cannot tell which of several queued
// reservations it frees, and freeing one in the middle of the queue would
// put two permits in one slot. An abandoned slot only costs throughput.
//
// Its rate can be changed live, for the whole fleet, with [GCRA.SetLimit];
// the change applies at once.
//
// Round trips per grant: 1. A Limiter can pause it for the whole fleet
// (a pause moves every slot past its end). It is safe for concurrent use.
type GCRA struct {
	common
	limit     int64
	burst     int64
	emission  int64 // µs per permit
	tolerance int64 // µs, burst × emission
	ivUs      int64 // interval in µs, for a live limit
	fixed     int64 // burst set by WithBurst, 0 when it follows the limit
}

// NewGCRA returns a GCRA bucket of limit permits per interval under key,
// with a burst of limit unless [WithBurst] says otherwise. Each per-call
// key gets its own budget.
//
// limit must be at least 1 and at most one per microsecond of interval;
// interval at least 1 ms; burst at least 1. Options: [WithBurst],
// [WithPrefix], [WithHeartbeat].
func NewGCRA(rdb redis.UniversalClient, key string, limit int64, interval time.Duration, opts ...GCRAOption) (*GCRA, error) {
	const name = "bucket: NewGCRA"
	c, err := newCommon(name, rdb, key, opts)
	if err != nil {
		return nil, err
	}
	if err := checkRate(name, limit, "interval", interval); err != nil {
		return nil, err
	}
	if limit > interval.Microseconds() {
		return nil, errs.Invalid(name, "limit", limit, "must be at most one per microsecond of interval "+interval.String())
	}
	burst := limit
	if c.cfg.burst != 0 {
		burst = c.cfg.burst
	}
	if burst < 1 {
		return nil, errs.Invalid(name, "burst", burst, "must be at least 1")
	}
	emission := (ceilUs(interval) + limit - 1) / limit
	if burst > (1<<50)/emission {
		return nil, errs.Invalid(name, "burst", burst, "too large for the rate: burst × interval/limit must stay below 2^50 µs")
	}
	c.name = "bucket: GCRA"
	c.co.byWait = true // run gives each caller of a batch a slot within its own wait
	return &GCRA{common: c, limit: limit, burst: burst, emission: emission, tolerance: burst * emission,
		ivUs: ceilUs(interval), fixed: max(c.cfg.burst, 0)}, nil
}

// Take implements [throttle.Bucket]: it grants, or reserves a slot at most
// maxWait ahead (Decision.Delay). Concurrent takes of one permit for the
// same key are coalesced into one round trip (see the package doc): each
// caller gets its own slot within its own maxWait, the least wait first,
// and a caller no slot fits is refused alone.
func (b *GCRA) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	return b.takeBy(ctx, key, n, b.burst, maxWait, b.run)
}

// run is one round trip of gcra.lua; n < 0 asks for up to -n permits.
// For n < -1, waits (ascending), when they differ, go too (waitGroups):
// each caller takes the next slot within its own wait.
func (b *GCRA) run(ctx context.Context, key string, n int64, maxWait time.Duration, waits []time.Duration) (upTo, error) {
	tag, err := b.ks.tag(b.name, key)
	if err != nil {
		return upTo{}, err
	}
	keys := []string{tag + ":gcra", tag + ":pause", tag + ":gcra:limit"}
	waitUs := func(d time.Duration) int64 {
		return int64(max(d, 0) / time.Microsecond) // rounded down: never reserve beyond the wait
	}
	args := []any{n, b.emission, b.tolerance, waitUs(maxWait), b.ivUs, b.fixed}
	if n < -1 && len(waits) == int(-n) {
		args = append(args, waitGroups(waits, waitGrid(us(b.emission)), waitUs)...)
	}
	r, _, err := b.eval(ctx, scriptGCRA, keys, args...)
	if err := replyErr(err, len(r) >= 9, "gcra.lua"); err != nil {
		return upTo{}, backend("take", keys[0], err)
	}
	limit := liveOr(r, 4, b.limit)
	if r[0] == 2 {
		return upTo{}, exceeds(b.name, max(n, -n), limit) // the burst in force is below n
	}
	rest := throttle.Decision{Delay: us(r[8]), Limit: limit, Remaining: 0, Reset: us(r[3])}
	// A burst above the limit can free more than Limit permits at once;
	// Remaining, for rate-limit headers, never says more.
	if r[0] != 1 {
		rest.Remaining = min(r[2], limit)
		return upTo{granted: rest, rest: rest}, nil
	}
	// Granted, r[2] is not clamped: negative when the slots are ahead. A
	// batch's callers get it plus the slots given after their own
	// (forCaller clamps it).
	d := throttle.Decision{Granted: true, Delay: us(r[1]), Limit: limit, Remaining: min(max(r[2], 0), limit), Reset: us(r[3])}
	if n < 0 {
		d.Remaining = r[2]
	}
	u := upTo{granted: d, got: r[5], rest: rest}
	switch {
	case n < 0 && len(r) > 10:
		u.eachCaller(r[10:])
		u.granted.Delay = max(u.delays[0], 0)
	case n < 0 && len(r) >= 10:
		// Caller i's slot: max(first + i·emission, pause left, 0).
		u.granted.Delay = max(us(r[9]), us(r[7]), 0)
		u.step, u.floor = us(r[6]), us(r[7])
		u.first = us(r[9])
	}
	return u, nil
}
