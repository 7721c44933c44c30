package bucket

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
)

// SlidingLog logs every granted permit in a Redis sorted set and checks one
// or more sliding windows against it in one script. It matches a provider
// that counts over a sliding window ("at most 500 calls in any 2 s, and
// 2000 in any 10 s").
//
// Guarantee: for each window, at most its Limit permits granted within any
// span of its Period, on the Redis server's clock. A
// denied call logs nothing, so refused traffic never uses up capacity.
//
// How: one script trims entries older than the longest window, counts each
// window with ZCOUNT, and adds n uniquely named entries (server time, a
// per-call nonce, an index) only if every window has room. The key expires
// after the longest window. When refused, Decision.Delay is the time until
// enough of the oldest entries have left every full window.
//
// Arrival jitter: calls granted in the same instant can reach the
// provider some milliseconds apart, which compresses one of its windows;
// [WithArrivalMargin] keeps every window that much longer.
//
// Round trips per grant: 1. Memory: one entry per permit granted within
// the longest window. A Limiter can pause it for the whole fleet. It is safe
// for concurrent use.
type SlidingLog struct {
	common
	args     []any // ARGV[4..]: limit, length µs per window
	longest  int64 // µs
	capacity int64
	nonce    string
	seq      atomic.Uint64
}

// NewSlidingLog returns a sliding-log bucket checking every window of
// windows (at least one, at most 16, Limit ≥ 1, Period ≥ 1 ms, distinct
// periods). A Take may ask for at most the smallest Limit. Each per-call key
// gets its own log. Options: [WithPrefix], [WithHeartbeat], [WithArrivalMargin].
func NewSlidingLog(rdb redis.UniversalClient, key string, windows []throttle.Tier, opts ...SlidingLogOption) (*SlidingLog, error) {
	const name = "bucket: NewSlidingLog"
	c, err := newCommon(name, rdb, key, opts)
	if err != nil {
		return nil, err
	}
	if err := checkTiers(name, windows); err != nil {
		return nil, err
	}
	c.name = "bucket: SlidingLog"
	b := &SlidingLog{common: c, capacity: windows[0].Limit, nonce: nonce()}
	for i, w := range windows {
		if c.cfg.margin < 0 || c.cfg.margin >= w.Period {
			return nil, errs.Invalid(name, "arrival margin", c.cfg.margin, fmt.Sprintf("must be at least 0 and below windows[%d].Period %v", i, w.Period))
		}
		l := ceilUs(w.Period + c.cfg.margin)
		b.args = append(b.args, w.Limit, l)
		b.longest = max(b.longest, l)
		b.capacity = min(b.capacity, w.Limit)
	}
	return b, nil
}

// Take implements [throttle.Bucket]. It never reserves: maxWait is
// ignored.
func (b *SlidingLog) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	return b.takeBy(ctx, key, n, b.capacity, maxWait, b.run)
}

// run is one round trip of sliding.lua; n < 0 asks for up to -n permits.
func (b *SlidingLog) run(ctx context.Context, key string, n int64, _ time.Duration, _ []time.Duration) (upTo, error) {
	tag, err := b.ks.tag(b.name, key)
	if err != nil {
		return upTo{}, err
	}
	keys := []string{tag + ":log", tag + ":pause"}
	args := make([]any, 0, 3+len(b.args))
	args = append(args, n, b.nonce+strconv.FormatUint(b.seq.Add(1), 36), b.longest)
	args = append(args, b.args...)
	r, _, err := b.eval(ctx, scriptSliding, keys, args...)
	if err := replyErr(err, len(r) >= 7 || len(r) == 6 && r[0] != 1, "sliding.lua"); err != nil {
		return upTo{}, backend("take", keys[0], err)
	}
	return windowsReply(r, b.capacity), nil
}
