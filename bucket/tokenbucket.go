package bucket

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
)

// TokenBucket is the default bucket: limit tokens per interval, refilled to
// limit on demand by the first caller after the interval. It matches a
// provider policy of "N calls per period, then wait for the next period".
//
// Guarantee: at most limit permits per refill, and refills at least
// interval apart on the Redis server's clock — so at most limit permits in
// any period — and at most limit permits in any span of one interval on
// that clock, the end of one period and the start of the next included
// (a sliding window of the interval, half open: a burst granted at one
// instant leaves it exactly one interval later). There is no burst beyond
// limit. So a provider counting a sliding window of the interval at the
// same limit refuses nothing, from the first period on.
//
// What it costs a burst: a period whose grants came late (a crowd that
// arrived in its second half) holds back the next period's early grants
// until they leave the window, an interval after they were granted; a
// refused caller is told that time (Decision.Delay), not the period's end.
// The period's own tokens are not lost: they are granted as the window
// lets them go, before the period ends. Demand that stays above the limit
// gets it all (the grants of one period free those of the next an interval
// later). The bound counts grants in slots of a fiftieth of the interval,
// a slot leaving the window when its latest grant does: a slot's earlier
// grants are held until then (at most a fiftieth of the interval). Redis
// losing the grant profiles (an empty restart, a failover to a replica
// that had not received them) leaves the period's bound alone for the
// first period after: at most limit more in one span, once per loss (a
// lost period itself is held, see Outages).
//
// How: the period's tokens live in one key whose expiry is the period's
// end. A take is one script (one round trip) that decrements the tokens
// only if enough are left, so a denied take consumes nothing, from this
// period or the next. When the key has expired, the same script starts the
// next period (the refill) and takes the caller's tokens from it. The
// script runs atomically and refills only when the period has really ended
// on the server's clock, so two refills can never land in one period, and
// no caller can be paused between the check and the refill. The classic
// refill mutex is kept as an exclusion for others: while anyone holds
// the Redsync mutex on the bucket's lock key (an operator's tool, an older
// instance), the script does not refill, and callers are told to come back
// after WithRetry (1 ms). A caller with no token is told exactly when the
// period ends (Decision.Delay, from the key's PTTL), so a Limiter sleeps
// instead of polling.
//
// A period behind its pace: a Limiter spreads a period's grants over it
// (throttle.SpreadSpan), so a crowd coming late in a period that a
// trickle started (a fleet starting on a key an earlier fleet used within
// the last interval) would find its places passed, take the period's
// tokens at once and meet the next period's first grants in a provider's
// sliding window. A take of several tokens (a crowd's coalesced takes)
// whose place has passed therefore lengthens the running period to end
// one interval after the start that makes its place now, so the period's
// other tokens are spread as in a fresh period and the next one starts
// an interval after that start (in the same script, no extra round
// trip). A take of one token counts its place over the whole interval
// instead (b/L of it, not of SpreadSpan): callers paced evenly at the
// limit's rate, one at a time, are that late, and a period lengthened to
// the Limiter's places would stop them at its end. A crowd whose takes
// come one at a time then has at most a twentieth of the tokens granted
// before it go at once. Only periods of at most
// throttle.MaxSpreadInterval (which a Limiter spreads) are lengthened; a
// period never gets shorter, nor longer than one interval from now.
//
// The sliding bound costs each take one more read (the previous period's
// grants still in the window) and each grant two writes (its slot's count
// and time), in the same script; a refill reads the running period's
// slots and writes them as the previous period's (at most 51 slots).
//
// Round trips per grant: at most 1, the refill included; concurrent takes
// of one token for the same key in one process share one round trip
// (coalesced, see the package doc), so under load it is well below 1.
//
// Outages: a period that the first refill after an outage would start
// within the last tenth of a period of the old phase is lengthened to end
// on it (at most a tenth of an interval's grants, once per outage), so a
// provider counting on the old phase sees no double burst. A period the
// fleet was told of but the server has no record of (Redis restarted
// empty, a failover to a replica without the latest refill, keys deleted
// by hand) is held at 0 tokens until its known end, and the next period
// starts on the old phase. Each instance keeps, per budget used in the
// last period, the end of the latest period it was told of; the server
// keeps the period's limit key (tb:cap) for a minute after the period. The
// measured outages: docs/reliability.md.
//
// Its limit can be changed live, for the whole fleet, with
// [TokenBucket.SetLimit]; the change applies from the next refill.
//
// A Limiter can pause a TokenBucket for the whole fleet (a provider's
// Retry-After). It takes no refunds: a token given back could not be told
// apart from one of the next period, and it never reserves, so a Limiter
// never needs one. It is safe for concurrent use.
type TokenBucket struct {
	common
	limit    int64
	periodMs int64
	rootKeys []string // tbKeys of key "", built once: the hot path
	outage   outageClock
	ends     periodEnds
}

// periodEnds remembers, per key, the end of the latest period this
// instance was told of, in ms on the clock of the Redis server that told
// it (its answer's now_ms + reset_ms), so that a take can tell
// tb_take.lua of a period the server has lost (see "Lost period" there).
// No clock of this machine is involved. An entry is useless once its end
// has passed; entries are swept when the map has doubled since the last
// sweep, so it holds about the keys taken from in the last period.
type periodEnds struct {
	mu    sync.Mutex
	m     map[string]int64 // key → end, ms on the server's clock
	swept int              // len(m) after the last sweep
}

// get returns key's known end, 0 when none is known.
func (p *periodEnds) get(key string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m[key]
}

// note records that key's running period ends at end; now is the
// server's clock of the same answer, for sweeping (ms).
func (p *periodEnds) note(key string, end, now int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = make(map[string]int64)
	}
	if end > p.m[key] {
		p.m[key] = end
	}
	if len(p.m) >= 2*max(p.swept, 64) {
		for k, e := range p.m {
			if e <= now {
				delete(p.m, k)
			}
		}
		p.swept = len(p.m)
	}
}

// outageClock remembers when this instance last saw the store fail or
// stall, so that takes soon after can ask tb_take.lua to keep the old
// phase.
type outageClock struct {
	last atomic.Int64 // Unix ns of the last failure; 0 none
}

// failed records a store failure (or a reply slower than slowReply) at
// now, Unix ns.
func (o *outageClock) failed(now int64) { o.last.Store(now) }

// recent reports whether the last failure was within the last within ns.
func (o *outageClock) recent(now, within int64) bool {
	last := o.last.Load()
	return last != 0 && now-last <= within
}

// slowReply is a round trip long enough to count as a stall of the store
// (a paused Redis answers late rather than not at all): ten times
// fairChance, a hundred times a slow round trip on loopback, which no
// healthy Redis takes. It is the bucket's own measure of its store, not a
// guess of the caller's timeout: a call the caller's deadline cuts off
// counts as a failure by storeFailed, whatever that deadline.
const slowReply = 10 * fairChance

// outageWindow is how long after its last store failure an instance asks
// for the old phase: one interval and a second.
func (b *TokenBucket) outageWindow() int64 {
	return b.periodMs*int64(time.Millisecond) + int64(time.Second)
}

// NewTokenBucket returns a token bucket of limit tokens per interval under
// key, shared by every instance that builds it with the same key and
// prefix. Every per-call key passed to Take gets its own budget of limit
// per interval.
//
// limit must be at least 1 and interval at least 1 ms (it is rounded up to
// the millisecond). Options: [WithPrefix], [WithHeartbeat], [WithRetry].
func NewTokenBucket(rdb redis.UniversalClient, key string, limit int64, interval time.Duration, opts ...TokenBucketOption) (*TokenBucket, error) {
	const name = "bucket: NewTokenBucket"
	c, err := newCommon(name, rdb, key, opts)
	if err != nil {
		return nil, err
	}
	if err := checkRate(name, limit, "interval", interval); err != nil {
		return nil, err
	}
	c.name = "bucket: TokenBucket"
	return &TokenBucket{
		common:   c,
		limit:    limit,
		periodMs: ceilMs(interval),
		rootKeys: tbKeys(c.ks.root),
	}, nil
}

// tbKeys lists a budget's keys: tokens, pause, refill mutex, the period's
// limit, the live limit, the lengthening owed to the phase, the grant
// profiles of the running and the previous period (the sliding bound).
// Scripts read them and never change the slice.
func tbKeys(tag string) []string {
	return []string{tag + ":tb", tag + ":pause", tag + ":tb:lock", tag + ":tb:cap", tag + ":tb:limit", tag + ":tb:phase", tag + ":tb:slide"}
}

// Take implements [throttle.Bucket]. It never reserves: maxWait is
// ignored. When no token is left, Decision.Delay is the time until the
// period ends. Concurrent takes of one token for the same key are
// coalesced into one round trip (see the package doc).
func (b *TokenBucket) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	one := func(ctx context.Context) (throttle.Decision, error) { return b.take(ctx, key, n) }
	start := time.Now()
	var d throttle.Decision
	var err error
	if n != 1 {
		d, err = bounded(ctx, &b.common, key, one)
	} else {
		d, err = b.coalesced(ctx, key, maxWait, one, b.takeUpTo)
	}
	if storeFailed(err, start) {
		b.outage.failed(time.Now().UnixNano())
	}
	return d, err
}

// storeFailed reports whether a take begun at start that ended with err
// saw the store fail: an error from Redis itself, or a context that ended
// after the store had had fairChance to answer (a paused Redis looks like
// that). A caller's own deadline or cancellation cutting a call shorter,
// with Redis healthy, is no outage.
func storeFailed(err error, start time.Time) bool {
	var be *throttle.BackendError
	if !errors.As(err, &be) {
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return time.Since(start) >= fairChance
	}
	return true
}

// fairChance is how long a take must have waited for Redis before a
// context ending counts as the store failing: ten times a slow round trip
// on loopback.
const fairChance = 10 * time.Millisecond

// keys returns the keys of key's budget.
func (b *TokenBucket) keys(key string) ([]string, error) {
	if key == "" {
		return b.rootKeys, nil
	}
	tag, err := b.ks.tag(b.name, key)
	if err != nil {
		return nil, err
	}
	return tbKeys(tag), nil
}

// take is Take's work for n tokens, all or nothing; bounded runs it.
func (b *TokenBucket) take(ctx context.Context, key string, n int64) (throttle.Decision, error) {
	if err := b.checkN(n, b.limit); err != nil {
		return throttle.Decision{}, err
	}
	u, err := b.run(ctx, key, n)
	if err != nil {
		return throttle.Decision{}, err
	}
	return u.granted, nil
}

// takeUpTo takes up to k tokens: as many as are left, at least one.
func (b *TokenBucket) takeUpTo(ctx context.Context, key string, k int64, _ time.Duration) (upTo, error) {
	return b.run(ctx, key, -k)
}

// run is one round trip of tb_take.lua; n < 0 asks for up to -n tokens.
// The answer for an all-or-nothing take is in granted (also when refused).
func (b *TokenBucket) run(ctx context.Context, key string, n int64) (upTo, error) {
	keys, err := b.keys(key)
	if err != nil {
		return upTo{}, err
	}
	start := time.Now().UnixNano()
	aware := 0 // 1: this instance saw the store fail lately (tb_take.lua's ARGV[4])
	if b.outage.recent(start, b.outageWindow()) {
		aware = 1
	}
	// The end of the latest period this instance was told of (ARGV[5]).
	known := b.ends.get(key)
	r, err := b.eval(ctx, scriptTBTake, keys, n, b.limit, b.periodMs, aware, known, b.pace())
	if now := time.Now().UnixNano(); err == nil && now-start > int64(slowReply) {
		b.outage.failed(now) // answered, but late: a stall
	}
	if err != nil {
		return upTo{}, backend("take", keys[0], err)
	}
	if len(r) < 6 {
		return upTo{}, backend("take", keys[0], errors.New("unexpected reply from tb_take.lua"))
	}
	if len(r) > 6 && r[6] > 0 && (r[0] == 1 || r[0] == 0) && r[2] >= 0 && r[3] > 0 { // (a pause answers remaining -1)
		b.ends.note(key, r[6]+r[3], r[6])
	}
	limit := liveOr(r, 4, b.limit)
	// The key expires once the server's clock is past its expiry: 1 ms
	// after PTTL reads 0.
	refused := throttle.Decision{Delay: ms(r[1] + 1), Limit: limit, Remaining: r[2], Reset: ms(r[3] + 1)}
	switch r[0] {
	case 1:
		granted := throttle.Decision{Granted: true, Limit: limit, Remaining: r[2], Reset: ms(r[3])}
		refused.Remaining = 0
		return upTo{granted: granted, got: r[5], rest: refused}, nil
	case 0:
		return upTo{granted: refused, rest: refused}, nil
	case 4:
		return upTo{}, exceeds(b.name, max(n, -n), limit)
	}
	// Someone else holds the refill mutex.
	d := b.retryLater()
	return upTo{granted: d, rest: d}, nil
}

// pace is tb_take.lua's ARGV[6]: the span of a period a Limiter places
// its grants over, in ten-thousandths of the period; 0 for periods a
// Limiter does not spread.
func (b *TokenBucket) pace() int64 {
	if b.periodMs > throttle.MaxSpreadInterval.Milliseconds() {
		return 0
	}
	return int64(throttle.SpreadSpan * 10000)
}

func (b *TokenBucket) retryLater() throttle.Decision {
	return throttle.Decision{Delay: b.cfg.retry, Limit: b.limit, Remaining: 0, Reset: b.cfg.retry}
}
