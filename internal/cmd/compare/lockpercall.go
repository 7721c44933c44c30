package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// lockPerCall is the classic lock-per-call token bucket, written out as
// the baseline: every call takes a distributed mutex, reads the bucket's last
// refill time and refills it to limit if the interval has elapsed,
// releases the mutex, then takes a token with DECR; a result ≥ 0 is a
// grant.
//
//	lock.lock(); refill(); lock.unlock(); return getToken() >= 0
//
// The mutex is Redsync's. Redsync retries a
// taken lock after a random 50–250 ms by default, which would make this
// baseline a straw man; it retries every lockRetry instead, a tuning a
// careful user would make. The refill reads the caller's clock, as the
// classic design does, so callers must share one host's clock: here they
// do.
type lockPerCall struct {
	rdb                 *redis.Client
	rs                  *redsync.Redsync
	tokens, last, mutex string
	limit               int64
	interval            time.Duration
	lockRetry           time.Duration
}

func newLockPerCall(rdb *redis.Client, key string, limit int64, interval, lockRetry time.Duration) *lockPerCall {
	return &lockPerCall{
		rdb:       rdb,
		rs:        redsync.New(goredis.NewPool(rdb)),
		tokens:    key + ":tokens",
		last:      key + ":last",
		mutex:     key + ":lock",
		limit:     limit,
		interval:  interval,
		lockRetry: lockRetry,
	}
}

// take makes one call of the design: it reports whether a token was
// granted.
func (b *lockPerCall) take(ctx context.Context) (bool, error) {
	m := b.rs.NewMutex(b.mutex,
		redsync.WithTries(math.MaxInt32), // until ctx ends
		redsync.WithRetryDelay(b.lockRetry),
	)
	if err := m.LockContext(ctx); err != nil {
		return false, fmt.Errorf("lock: %w", err)
	}
	err := b.refill(ctx)
	if _, uerr := m.UnlockContext(context.WithoutCancel(ctx)); uerr != nil && err == nil {
		err = fmt.Errorf("unlock: %w", uerr)
	}
	if err != nil {
		return false, err
	}
	n, err := b.rdb.Decr(ctx, b.tokens).Result()
	if err != nil {
		return false, fmt.Errorf("decr: %w", err)
	}
	return n >= 0, nil
}

// refill sets the tokens to limit if the interval has elapsed since the
// last refill. The caller holds the mutex.
func (b *lockPerCall) refill(ctx context.Context) error {
	now := time.Now().UnixNano()
	last, err := b.rdb.Get(ctx, b.last).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("get: %w", err)
	}
	if err == nil && now-last <= int64(b.interval) {
		return nil
	}
	if err := b.rdb.Set(ctx, b.last, now, 0).Err(); err != nil {
		return fmt.Errorf("set: %w", err)
	}
	if err := b.rdb.Set(ctx, b.tokens, b.limit, 0).Err(); err != nil {
		return fmt.Errorf("set: %w", err)
	}
	return nil
}
