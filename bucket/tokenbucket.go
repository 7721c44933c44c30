package bucket

import (
	"context"
	"errors"
	"time"

	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
)

// TokenBucket is the default bucket: limit tokens per interval, refilled to
// limit on demand. It replaces seed 002 (Azuga's Redis token bucket,
// refilled to max by the first caller after the interval, under a
// distributed mutex) and matches a provider policy of "N calls per period,
// then wait for the next period".
//
// Guarantee: at most limit permits per refill, and refills at least
// interval apart on the Redis server's clock — so at most limit permits in
// any period, and never more than 2·limit in any span of one interval (the
// end of one period and the start of the next). There is no burst beyond
// limit.
//
// How: the period's tokens live in one key whose expiry is the period's
// end. A take is one script (one round trip) that decrements the tokens
// only if enough are left, so a denied take consumes nothing, from this
// period or the next. When the key has expired, the same script starts the
// next period (the refill) and takes the caller's tokens from it. The
// script runs atomically and refills only when the period has really ended
// on the server's clock, so two refills can never land in one period, and
// no caller can be paused between the check and the refill. The refill
// mutex of seed 002 is kept as an exclusion for others: while anyone holds
// the Redsync mutex on the bucket's lock key (an operator's tool, an older
// instance), the script does not refill, and callers are told to come back
// after WithRetry (1 ms). A caller with no token is told exactly when the
// period ends (Decision.Delay, from the key's PTTL), so a Limiter sleeps
// instead of polling.
//
// Round trips per grant: at most 1, the refill included; concurrent takes
// of one token for the same key in one process share one round trip
// (coalesced, see the package doc), so under load it is well below 1.
//
// Its limit can be changed live, for the whole fleet, with
// [TokenBucket.SetLimit]; the change applies from the next refill.
//
// TokenBucket implements [throttle.Pauser]. It does not implement
// [throttle.Refunder]: a token given back could not be told apart from
// one of the next period, and it never reserves, so a Limiter never needs
// one. It is safe for concurrent use.
type TokenBucket struct {
	common
	limit    int64
	periodMs int64
	seen     *seenLimit // last limit in force seen, for Fallback
	rootKeys []string   // tbKeys of key "", built once: the hot path
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
		seen:     new(seenLimit),
		rootKeys: tbKeys(c.ks.root),
	}, nil
}

// tbKeys lists a budget's keys: tokens, pause, refill mutex, the running
// period's limit, the live limit. Scripts read them and never change the
// slice.
func tbKeys(tag string) []string {
	return []string{tag + ":tb", tag + ":pause", tag + ":tb:lock", tag + ":tb:cap", tag + ":tb:limit"}
}

// Take implements [throttle.Bucket]. It never reserves: maxWait is
// ignored. When no token is left, Decision.Delay is the time until the
// period ends. Concurrent takes of one token for the same key are
// coalesced into one round trip (see the package doc).
func (b *TokenBucket) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	one := func(ctx context.Context) (throttle.Decision, error) { return b.take(ctx, key, n) }
	if n != 1 {
		return bounded(ctx, &b.common, key, one)
	}
	return b.coalesced(ctx, key, maxWait, one, b.takeUpTo)
}

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
	r, err := b.eval(ctx, scriptTBTake, keys, n, b.limit, b.periodMs)
	if err != nil {
		return upTo{}, backend("take", keys[0], err)
	}
	if len(r) < 6 {
		return upTo{}, backend("take", keys[0], errors.New("unexpected reply from tb_take.lua"))
	}
	b.seen.note(key, r[4])
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

func (b *TokenBucket) retryLater() throttle.Decision {
	return throttle.Decision{Delay: b.cfg.retry, Limit: b.limit, Remaining: 0, Reset: b.cfg.retry}
}
