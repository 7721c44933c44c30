package throttle

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/internal/capability"
)

// Smooth is a [Bucket] that spreads permits evenly through the interval
// instead of letting a whole interval's budget go out at its start. It
// paces its callers interval/limit apart, per key, and asks the inner
// bucket for each permit only when its slot has come, so every permit is
// both paced and granted by the inner bucket. Most users wrap a fleet's
// shared bucket: NewSmooth(sharedBucket, limit, interval).
//
// Guarantee, per instance and key, for calls of one permit: at most
// 1.5 + limit·t/interval permits in any span t (a call of n permits takes n
// slots; the extra half slot lets a caller that wakes a little late keep
// its place instead of losing throughput). So no tenth of an interval gets
// more than limit/10 + 1.5, and the inner bucket's own guarantee holds as
// well.
//
// # A fleet
//
// Pacing is local: each Smooth knows only its own callers. When k instances
// share one inner bucket, give each WithSmoothInstances(k): each paces at
// limit/k per interval, and the fleet at most limit/10 + 1.5·k in any tenth
// of an interval (within 1.5 × limit/10 as long as limit ≥ 30·k). This is
// the partial-limit trade of a fleet without coordination: the fleet can
// use the whole limit only when every instance has demand for its
// limit/k; an instance with less leaves the rest unused. For a fleet whose
// load is uneven and must stay smooth as a whole, make the shared bucket
// itself smooth instead (package bucket's GCRA with a burst of 1 or a few,
// one round trip per permit) and use it without Smooth.
//
// Smooth wraps inner: a [Limiter] uses inner's limit, adaptive rate and
// Check, and Smooth's own pause (of this instance, passed on to inner)
// and refund (passed on to inner). Under a Limiter with leasing
// ([WithLeasing]) each batch is one take of Smooth: permits are then paced
// per batch, not one by one.
//
// Waiting: a caller refused because its slot has not come is told the time
// to it (Decision.Delay), so a [Limiter] sleeps until then. Refusals before
// the slot cost memory work only, never a call to the inner bucket. When the
// inner bucket refuses, the slot is given back and its refusal (with its
// Delay) is the answer.
//
// A Smooth is safe for concurrent use; it has no background goroutine.
// Keys whose pace has caught up with the clock are forgotten.
type Smooth struct {
	inner    Bucket
	refunder capability.Refunder
	pauser   capability.Pauser
	limit    int64
	emission int64 // ns between this instance's permits
	slack    int64 // how far behind the clock a pace may lag: emission/2
	clock    clockwork.Clock
	epoch    time.Time

	root   atomic.Int64 // next slot for key "", ns since epoch
	seed   maphash.Seed
	shards [localShards]localShard // key → next slot, ns since epoch
}

// idlePace is the pace of a key never seen: long caught up with any clock.
const idlePace = math.MinInt64 / 4

// smoothOnly is a [SmoothOption] that only [NewSmooth] reads.
type smoothOnly func(*smoothConfig)

func (smoothOnly) apply(*config) {}
func (smoothOnly) smoothOption() {}

type smoothConfig struct {
	instances int
}

// WithSmoothInstances tells a [Smooth] bucket that k instances share its
// limit: it paces its own callers at limit/k per interval, so that the
// fleet together stays smooth. Default: 1. k must be at least 1.
func WithSmoothInstances(k int) SmoothOption {
	return smoothOnly(func(c *smoothConfig) { c.instances = k })
}

// NewSmooth returns a [Smooth] bucket that paces permits from inner at
// limit per interval, interval/limit apart. Options: [WithClock],
// [WithSmoothInstances].
//
// limit must be at least 1 and interval positive, with at most one permit
// per nanosecond per instance.
func NewSmooth(inner Bucket, limit int64, interval time.Duration, opts ...SmoothOption) (*Smooth, error) {
	if inner == nil {
		return nil, invalid("throttle: NewSmooth", "inner", nil, "must be a Bucket, such as one from package bucket")
	}
	base := newConfig(opts)
	sc := smoothConfig{instances: 1}
	for _, o := range opts {
		if so, ok := o.(smoothOnly); ok && so != nil {
			so(&sc)
		}
	}
	if limit < 1 {
		return nil, invalid("throttle: NewSmooth", "limit", limit, "must be at least 1")
	}
	if interval <= 0 {
		return nil, invalid("throttle: NewSmooth", "interval", interval, "must be positive")
	}
	if sc.instances < 1 {
		return nil, invalid("throttle: NewSmooth", "instances", sc.instances, "must be at least 1")
	}
	if int64(sc.instances) > math.MaxInt64/interval.Nanoseconds() {
		return nil, invalid("throttle: NewSmooth", "instances", sc.instances, "too many for the interval: instances × interval overflows")
	}
	span := int64(sc.instances) * interval.Nanoseconds()
	if limit > span {
		return nil, invalid("throttle: NewSmooth", "limit", limit, "must be at most one per nanosecond of interval "+interval.String()+" per instance")
	}
	e := ceilDiv(span, limit)
	s := &Smooth{
		inner:    inner,
		limit:    limit,
		emission: e,
		slack:    e / 2,
		clock:    base.clock,
		epoch:    base.clock.Now(),
		seed:     maphash.MakeSeed(),
	}
	s.root.Store(idlePace)
	s.refunder, _ = findCap[capability.Refunder](inner)
	s.pauser, _ = findCap[capability.Pauser](inner)
	for i := range s.shards {
		s.shards[i].tats = make(map[string]int64)
		s.shards[i].sweepSize = 64
	}
	return s, nil
}

func (s *Smooth) now() int64 { return int64(s.clock.Since(s.epoch)) }

// unwrap returns the bucket s paces: a Limiter looks there for what s
// does not offer itself (see [Bucket] on wrappers).
func (s *Smooth) unwrap() Bucket { return s.inner }

// capabilities are what s offers a Limiter itself: refunds and pauses.
func (s *Smooth) capabilities() capability.Set {
	c := (*smoothCaps)(s)
	return capability.Set{Refunder: c, Pauser: c}
}

// smoothCaps is a Smooth seen through its capabilities.
type smoothCaps Smooth

func (c *smoothCaps) Refund(ctx context.Context, key string, n int64) error {
	return (*Smooth)(c).refund(ctx, key, n)
}

func (c *smoothCaps) Pause(ctx context.Context, key string, d time.Duration) error {
	return (*Smooth)(c).pause(ctx, key, d)
}

// Take implements [Bucket]: when key's next slot has come it takes it and
// returns the inner bucket's decision for n permits (asked with maxWait);
// before that it refuses with the time to the slot. n above the limit
// fails with [ErrExceedsLimit] at once (n the inner bucket cannot grant
// fails when its slot has come), and a ctx that has ended takes nothing
// and returns its error.
func (s *Smooth) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, fmt.Errorf("throttle: Smooth: %w", err)
	}
	if n < 1 {
		return Decision{}, invalid("throttle: Smooth", "n", n, "must be at least 1")
	}
	if n > s.limit || n > math.MaxInt64/4/s.emission {
		return Decision{}, fmt.Errorf("throttle: Smooth: %d permits asked at once, at most %d (the limit) can ever be granted: %w", n, s.limit, ErrExceedsLimit)
	}
	now := s.now()
	if wait := s.pace(key, n, now); wait > 0 {
		return Decision{Delay: time.Duration(wait), Limit: s.limit, Remaining: -1}, nil
	}
	d, err := s.inner.Take(ctx, key, n, maxWait)
	if err != nil || !d.Granted {
		s.unpace(key, n, s.now()) // the slot was not used
	}
	return d, err
}

// next is the slot decision: granted when the pace has reached now, and
// then the pace moves n slots on from where it was (or from slack ago, if
// it lagged more).
func (s *Smooth) next(tat, now, n int64) (wait, next int64) {
	if tat > now {
		return tat - now, tat
	}
	return 0, max(tat, now-s.slack) + n*s.emission
}

// pace takes n slots for key if its next slot has come and returns 0, or
// returns the time until it comes.
func (s *Smooth) pace(key string, n, now int64) int64 {
	if key == "" {
		for {
			old := s.root.Load()
			wait, next := s.next(old, now, n)
			if wait > 0 || s.root.CompareAndSwap(old, next) {
				return wait
			}
		}
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	tat, ok := sh.tats[key]
	if !ok {
		sh.sweep(now)
		tat = idlePace
	}
	wait, next := s.next(tat, now, n)
	if wait == 0 {
		sh.tats[key] = next
	}
	return wait
}

// unpace gives n slots of key back.
func (s *Smooth) unpace(key string, n, now int64) {
	back := func(tat int64) int64 { return max(tat-n*s.emission, now-s.slack) }
	if key == "" {
		for {
			old := s.root.Load()
			if s.root.CompareAndSwap(old, min(old, back(old))) {
				return
			}
		}
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if tat, ok := sh.tats[key]; ok {
		sh.tats[key] = min(tat, back(tat))
	}
}

func (s *Smooth) shard(key string) *localShard {
	return &s.shards[maphash.String(s.seed, key)%localShards]
}

// refund refunds the permits to the inner bucket, if it takes them back. Their slots stay used: Refund does not
// say which slots come back, and moving the pace back would free the
// slots of permits granted since (late refunds of old permits would let
// several permits through at once).
func (s *Smooth) refund(ctx context.Context, key string, n int64) error {
	if n < 1 {
		return nil
	}
	if s.refunder != nil {
		return s.refunder.Refund(ctx, key, n)
	}
	return nil
}

// pause gives key no slot of this instance for d, and passes the pause
// on to the inner bucket if it pauses, so that the rest of the fleet
// stops too. d is clamped to [MaxPause].
func (s *Smooth) pause(ctx context.Context, key string, d time.Duration) error {
	d = min(d, MaxPause)
	if d > 0 {
		until := s.now() + int64(d)
		if key == "" {
			for {
				old := s.root.Load()
				if old >= until || s.root.CompareAndSwap(old, until) {
					break
				}
			}
		} else {
			sh := s.shard(key)
			sh.mu.Lock()
			if tat, ok := sh.tats[key]; !ok || tat < until {
				sh.tats[key] = until
			}
			sh.mu.Unlock()
		}
	}
	if s.pauser != nil {
		return s.pauser.Pause(ctx, key, d)
	}
	return nil
}
