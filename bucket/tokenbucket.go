package bucket

import (
	"context"
	"errors"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
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
// period or the next. When the key has expired, the first caller to notice
// takes a Redsync mutex with a single try and runs a refill script that
// sets the tokens only if the period has really ended: a lock holder
// paused past its lock's expiry can never refill twice in one period.
// The same script takes the refilling caller's tokens. Callers that find
// the mutex held are told to come back after WithRetry (1 ms). A caller
// with no token is told exactly when the period ends (Decision.Delay, from
// the key's PTTL), so a Limiter sleeps instead of polling.
//
// Round trips per grant: 1 in steady state; about once per interval one
// caller adds 3 (lock, refill-and-take, unlock).
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
	rs       *redsync.Redsync
	seen     *seenLimit // last limit in force seen, for Fallback
	rootKeys []string   // tbKeys of key "", built once: the hot path

	// afterLock, when set (tests only), runs between taking the refill
	// mutex and running the refill script.
	afterLock func()
}

// NewTokenBucket returns a token bucket of limit tokens per interval under
// key, shared by every instance that builds it with the same key and
// prefix. Every per-call key passed to Take gets its own budget of limit
// per interval.
//
// limit must be at least 1 and interval at least 1 ms (it is rounded up to
// the millisecond). Options: [WithPrefix], [WithLockExpiry], [WithRetry],
// [WithLogger].
func NewTokenBucket(rdb redis.UniversalClient, key string, limit int64, interval time.Duration, opts ...Option) (*TokenBucket, error) {
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
		rs:       redsync.New(goredis.NewPool(rdb)),
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
// period ends.
func (b *TokenBucket) Take(ctx context.Context, key string, n int64, _ time.Duration) (throttle.Decision, error) {
	return bounded(ctx, &b.common, key, func(ctx context.Context) (throttle.Decision, error) { return b.take(ctx, key, n) })
}

// take is Take's work; bounded runs it.
func (b *TokenBucket) take(ctx context.Context, key string, n int64) (throttle.Decision, error) {
	if err := b.checkN(n, b.limit); err != nil {
		return throttle.Decision{}, err
	}
	keys := b.rootKeys
	if key != "" {
		tag, err := b.ks.tag(b.name, key)
		if err != nil {
			return throttle.Decision{}, err
		}
		keys = tbKeys(tag)
	}
	for attempt := 0; ; attempt++ {
		r, err := b.eval(ctx, scriptTBTake, keys[:4], n)
		if err != nil {
			return throttle.Decision{}, backend("take", keys[0], err)
		}
		if len(r) < 4 {
			return throttle.Decision{}, backend("take", keys[0], errors.New("unexpected reply from tb_take.lua"))
		}
		b.seen.note(key, liveOr(r, 4, 0))
		switch r[0] {
		case 1:
			return throttle.Decision{Granted: true, Limit: liveOr(r, 4, b.limit), Remaining: r[2], Reset: ms(r[3])}, nil
		case 0:
			// The key expires once the server's clock is past its
			// expiry: 1 ms after PTTL reads 0.
			return throttle.Decision{Delay: ms(r[1] + 1), Limit: liveOr(r, 4, b.limit), Remaining: r[2], Reset: ms(r[3] + 1)}, nil
		case 4:
			return throttle.Decision{}, exceeds(b.name, n, liveOr(r, 4, b.limit))
		case 2:
			if attempt > 0 {
				break
			}
			d, retry, err := b.refill(ctx, keys, n)
			if err != nil || !retry {
				b.seen.note(key, d.Limit)
				return d, err
			}
			continue // someone else refilled first: take from their period
		}
		// Someone else is refilling right now.
		return b.retryLater(), nil
	}
}

func (b *TokenBucket) retryLater() throttle.Decision {
	return throttle.Decision{Delay: b.cfg.retry, Limit: b.limit, Remaining: 0, Reset: b.cfg.retry}
}

// refill takes the refill mutex with one try and runs the fenced refill,
// which also takes the caller's n tokens from the new period. retry
// reports that the caller should take again (the period was already
// running).
func (b *TokenBucket) refill(ctx context.Context, keys []string, n int64) (d throttle.Decision, retry bool, err error) {
	m := b.rs.NewMutex(keys[2],
		redsync.WithTries(1),
		redsync.WithExpiry(b.cfg.lockExpiry),
		redsync.WithTimeoutFactor(0.5),
	)
	if err := m.TryLockContext(ctx); err != nil {
		var rerr *redsync.RedisError
		if errors.As(err, &rerr) {
			return throttle.Decision{}, false, backend("lock", m.Name(), err)
		}
		return b.retryLater(), false, nil // taken: someone else is refilling
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.lockExpiry)
		defer cancel()
		_, _ = m.UnlockContext(uctx) // it expires on its own if this fails
	}()
	if b.afterLock != nil {
		b.afterLock()
	}
	rkeys := []string{keys[0], keys[1], keys[4], keys[3]} // tokens, pause, live limit, period's limit
	r, err := b.eval(ctx, scriptTBRefill, rkeys, b.limit, b.periodMs, n)
	if err != nil {
		return throttle.Decision{}, false, backend("refill", keys[0], err)
	}
	if len(r) < 3 {
		return throttle.Decision{}, false, backend("refill", keys[0], errors.New("unexpected reply from tb_refill.lua"))
	}
	switch r[0] {
	case 1:
		return throttle.Decision{Granted: true, Limit: liveOr(r, 3, b.limit), Remaining: r[1], Reset: ms(r[2])}, false, nil
	case 2:
		return throttle.Decision{}, true, nil // paused: the take says for how long
	case 3:
		return throttle.Decision{}, false, exceeds(b.name, n, liveOr(r, 3, b.limit))
	}
	return throttle.Decision{}, true, nil
}
