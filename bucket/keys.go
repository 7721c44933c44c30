package bucket

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/internal/nilcheck"
	"github.com/headway-go/headway/throttle"
)

// MaxKeyLen is the longest key, in bytes before escaping, that a bucket
// accepts: the constructor's key and every key passed to Take or Pause.
// A call with a longer key fails with an error matching both
// [throttle.ErrInvalid] and [throttle.ErrInvalidKey]: the key is at
// fault, not the bucket's configuration.
const MaxKeyLen = 512

// maxPrefixLen bounds WithPrefix.
const maxPrefixLen = 64

// Key layout: see the package doc ("Keys and Redis Cluster"). escKey
// escapes a per-call key, escBase the constructor's ('/' too: it parts
// base and key), so that no user key can end the hash tag early or make
// two budgets share a name.
var (
	escKey  = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")
	escBase = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D", "/", "%2F")
)

// keyspace names the Redis keys of one bucket.
type keyspace struct {
	prefix string // "<prefix>:{<escaped base>"
	root   string // "<prefix>:{<escaped base>}", the tag of key ""
}

func newKeyspace(prefix, base string) keyspace {
	p := prefix + ":{" + escBase.Replace(base)
	return keyspace{prefix: p, root: p + "}"}
}

// tag returns the "<prefix>:{...}" part of every key of key's budget. A
// key longer than MaxKeyLen fails with an error matching
// throttle.ErrInvalidKey and throttle.ErrInvalid.
func (k keyspace) tag(pkg, key string) (string, error) {
	if key == "" {
		return k.root, nil
	}
	if len(key) > MaxKeyLen {
		return "", errs.InvalidKey(pkg, fmt.Sprintf("%.32q… (%d bytes)", key, len(key)), fmt.Sprintf("must be at most %d bytes", MaxKeyLen))
	}
	return k.prefix + "/" + escKey.Replace(key) + "}", nil
}

// budgetKeys returns the keys of key's budget: root, built once for key
// "" (the hot path), or of(its tag).
func (c *common) budgetKeys(key string, root []string, of func(tag string) []string) ([]string, error) {
	if key == "" {
		return root, nil
	}
	tag, err := c.ks.tag(c.name, key)
	if err != nil {
		return nil, err
	}
	return of(tag), nil
}

// common holds what every bucket shares: the client, the key layout, the
// options and the name used in errors.
type common struct {
	rdb  redis.UniversalClient
	ks   keyspace
	cfg  config
	name string // "bucket: TokenBucket", for error messages
	// calls: heartbeats and bounded, never-resent round trips (call.go).
	calls *calls
	// co: coalesced takes of one permit (coalesce.go).
	co *coalescer
}

// MaxInterval is the longest interval (period, window, expiry) a bucket
// accepts: a year. Longer ones, throttle.Forever among them, would overflow
// the microsecond and millisecond arithmetic of the scripts (a window of
// negative length grants without limit), so constructors refuse them.
const MaxInterval = 365 * 24 * time.Hour

// checkRate validates a constructor's limit per interval: 1 ≤ limit ≤ 2^50 and
// 1 ms ≤ interval ≤ MaxInterval. intervalField names the interval as the
// constructor's parameter ("interval", "period").
func checkRate(name string, limit int64, intervalField string, interval time.Duration) error {
	if err := checkLimitRange(name, "limit", limit); err != nil {
		return err
	}
	return checkDuration(name, intervalField, interval, time.Millisecond)
}

// maxRateLimit is the largest limit a constructor accepts. The scripts
// count in Lua doubles, and Redis writes a double of 10^17 or more back
// with an exponent ("1e+17"), which INCRBY and DECRBY then refuse; 2^50
// keeps every count exact and written as an integer.
const maxRateLimit = 1 << 50

// checkLimitRange refuses a constructor's limit below 1 or above
// maxRateLimit.
func checkLimitRange(name, field string, limit int64) error {
	if limit < 1 {
		return errs.Invalid(name, field, limit, "must be at least 1")
	}
	if limit > maxRateLimit {
		return errs.Invalid(name, field, limit, "must be at most 2^50 (the scripts' arithmetic is exact only below it)")
	}
	return nil
}

// checkDuration refuses a duration below least or above MaxInterval.
func checkDuration(name, field string, d, least time.Duration) error {
	if d < least {
		return errs.Invalid(name, field, d, "must be at least "+least.String())
	}
	if d > MaxInterval {
		return errs.Invalid(name, field, d, "must be at most a year (bucket.MaxInterval); for no limit at all, use no bucket")
	}
	return nil
}

// newCommon validates what every constructor takes.
func newCommon[O interface{ apply(*config) }](name string, rdb redis.UniversalClient, key string, opts []O) (common, error) {
	cfg := newConfig(opts)
	if nilcheck.IsNil(rdb) {
		return common{}, errs.Invalid(name, "rdb", "nil", "must be a redis client (*redis.Client, *redis.ClusterClient, *redis.Ring, ...)")
	}
	if key == "" {
		return common{}, errs.Invalid(name, "key", `""`, "must be non-empty")
	}
	if len(key) > MaxKeyLen {
		return common{}, errs.Invalid(name, "key", fmt.Sprintf("%.32q… (%d bytes)", key, len(key)), fmt.Sprintf("must be at most %d bytes", MaxKeyLen))
	}
	switch {
	case cfg.prefix == "":
		return common{}, errs.Invalid(name, "prefix", `""`, "must be non-empty")
	case len(cfg.prefix) > maxPrefixLen:
		return common{}, errs.Invalid(name, "prefix", fmt.Sprintf("%q", cfg.prefix), fmt.Sprintf("must be at most %d bytes", maxPrefixLen))
	case strings.ContainsAny(cfg.prefix, "{}"):
		return common{}, errs.Invalid(name, "prefix", fmt.Sprintf("%q", cfg.prefix), "must not contain '{' or '}' (they would break the keys' cluster hash tags)")
	}
	if err := checkDuration(name, "lease", cfg.lease, 30*time.Millisecond); err != nil {
		return common{}, err
	}
	if cfg.retry < 100*time.Microsecond || cfg.retry > time.Second {
		return common{}, errs.Invalid(name, "retry", cfg.retry, "must be between 100µs and 1s")
	}
	if cfg.liveWindow < 100*time.Millisecond || cfg.liveWindow > time.Hour {
		return common{}, errs.Invalid(name, "heartbeat window", cfg.liveWindow, "must be between 100ms and 1h")
	}
	ks := newKeyspace(cfg.prefix, key)
	return common{rdb: rdb, ks: ks, cfg: cfg, name: name, calls: newCalls(rdb, ks, cfg.liveWindow), co: newCoalescer()}, nil
}

// checkN validates the n of a Take against the most the bucket can grant at
// once. It needs no round trip.
func (c *common) checkN(n, capacity int64) error {
	if n < 1 {
		return errs.Invalid(c.name, "n", n, "must be at least 1")
	}
	if n > capacity {
		return fmt.Errorf("%s: %d permits asked at once, at most %d can ever be granted: %w", c.name, n, capacity, throttle.ErrExceedsLimit)
	}
	return nil
}

// backend wraps a Redis error.
func backend(op, key string, err error) error {
	return &throttle.BackendError{Op: op, Key: key, Err: err}
}

// Pause stops granting key's permits ("" for the constructor's key) to
// every instance sharing the bucket until d has passed ([throttle.Pauser]):
// their takes are refused with Delay set to the pause left. The Transport
// of package throttle/httpclient calls it when a provider answers "too
// many requests" with a retry time. A shorter pause never shortens a
// longer one. d is rounded up to the millisecond and clamped to
// [throttle.MaxPause]; d ≤ 0 does nothing. It returns by ctx's deadline,
// with a [*throttle.BackendError] when Redis fails.
func (c *common) Pause(ctx context.Context, key string, d time.Duration) error {
	d = min(d, throttle.MaxPause) // ceilMs(Forever) would overflow and pause nothing
	if d <= 0 {
		return nil
	}
	tag, err := c.ks.tag(c.name, key)
	if err != nil {
		return err
	}
	pk := tag + ":pause"
	// Bounded like a take: a hung store must not hold the caller (a
	// Transport reacting to a 429) past its context.
	_, err = bounded(ctx, c, key, func(ctx context.Context) (throttle.Decision, error) {
		if err := scriptPause.Run(ctx, c.rdb, []string{pk}, ceilMs(d)).Err(); err != nil {
			return throttle.Decision{}, backend("pause", pk, err)
		}
		return throttle.Decision{}, nil
	})
	return err
}

// ceilMs is d in whole milliseconds, rounded up.
func ceilMs(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// ceilUs is d in whole microseconds, rounded up.
func ceilUs(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
func us(v int64) time.Duration { return time.Duration(v) * time.Microsecond }
