package throttle

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
)

// Local is an in-memory bucket for one process: a generic cell rate
// algorithm (GCRA), which behaves as a token bucket of capacity burst
// refilled continuously at limit per interval.
//
// Guarantee: in any span of time t, a Local grants at most
// burst + limit·t/interval permits per key. With the default burst (= limit)
// that is at most 2·limit in any interval and at most limit·(1 + t/interval)
// over a longer span t; use WithBurst(1) for evenly spaced permits.
//
// Local reserves: asked with a maxWait, it books the next free slot up to
// maxWait ahead and the Limiter sleeps exactly until it, so waiters are
// served in order and nobody polls.
//
// Use it to limit a single process, or for the "partial limit" of a fleet
// whose instances share the load evenly: each of k instances gets
// NewLocal(total/k, interval). For one limit shared by instances whose load
// is uneven, use a Redis bucket from package bucket.
//
// Keys (tenants, endpoints) each get their own budget. Keys whose budget is
// full again are forgotten, so memory follows the number of keys active
// within the last interval. Local is safe for heavy concurrent use: the
// decision for key "" is a lock-free compare-and-swap, and other keys are
// spread over 32 locked shards.
type Local struct {
	emission  int64 // ns per permit
	tolerance int64 // burst · emission
	burst     int64
	limit     int64
	clock     clockwork.Clock
	epoch     time.Time

	root   atomic.Int64 // theoretical arrival time for key "", ns since epoch
	seed   maphash.Seed
	shards [localShards]localShard
}

const localShards = 32

type localShard struct {
	mu        sync.Mutex
	tats      map[string]int64 // key → tat, ns since epoch
	sweepSize int              // sweep when len(tats) reaches this
}

// NewLocal returns an in-memory bucket granting limit permits per interval
// per key, with a burst of limit unless WithBurst says otherwise. Options:
// [WithClock], [WithBurst].
//
// limit must be at least 1 and at most one per nanosecond of interval;
// interval must be positive.
func NewLocal(limit int64, interval time.Duration, opts ...Option) (*Local, error) {
	cfg := newConfig(opts)
	if limit < 1 {
		return nil, Invalid("throttle: NewLocal", "limit", limit, "must be at least 1")
	}
	if interval <= 0 {
		return nil, Invalid("throttle: NewLocal", "interval", interval, "must be positive")
	}
	if limit > interval.Nanoseconds() {
		return nil, Invalid("throttle: NewLocal", "limit", limit, "must be at most one per nanosecond of interval "+interval.String())
	}
	burst := limit
	if cfg.burst != 0 {
		burst = cfg.burst
	}
	if burst < 1 {
		return nil, Invalid("throttle: NewLocal", "burst", burst, "must be at least 1")
	}
	emission := ceilDiv(interval.Nanoseconds(), limit)
	if burst > (1<<62)/emission {
		return nil, Invalid("throttle: NewLocal", "burst", burst, "too large for the interval: burst × interval/limit overflows")
	}
	b := &Local{
		emission:  emission,
		tolerance: burst * emission,
		burst:     burst,
		limit:     limit,
		clock:     cfg.clock,
		epoch:     cfg.clock.Now(),
		seed:      maphash.MakeSeed(),
	}
	for i := range b.shards {
		b.shards[i].tats = make(map[string]int64)
		b.shards[i].sweepSize = 64
	}
	return b, nil
}

// WithBurst sets how many permits a [Local] bucket may grant at once after
// a quiet spell. Default: the limit. 1 spaces permits evenly, interval/limit
// apart. Ignored by a Limiter.
func WithBurst(n int64) Option {
	return optionFunc(func(c *config) { c.burst = n })
}

// ceilDiv is a/b rounded up, for a ≥ 0 and b > 0, without overflowing
// near math.MaxInt64 (FuzzLocalLimits: NewLocal(MaxInt64, MaxInt64)).
func ceilDiv(a, b int64) int64 {
	if a == 0 {
		return 0
	}
	return (a-1)/b + 1
}

// Take implements [Bucket].
func (b *Local) Take(_ context.Context, key string, n int64, maxWait time.Duration) (Decision, error) {
	if n < 1 {
		return Decision{}, Invalid("throttle: Local", "n", n, "must be at least 1")
	}
	if n > b.burst {
		return Decision{}, fmt.Errorf("throttle: Local: %d permits asked at once, at most %d can ever be granted: %w", n, b.burst, ErrExceedsLimit)
	}
	if maxWait < 0 {
		maxWait = 0
	}
	now := b.clock.Now().Sub(b.epoch).Nanoseconds()
	if key == "" {
		for {
			old := b.root.Load()
			d, next := b.decide(old, now, n, maxWait)
			if !d.Granted || b.root.CompareAndSwap(old, next) {
				return d, nil
			}
		}
	}
	s := b.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.tats[key]
	if !ok {
		s.sweep(now)
	}
	d, next := b.decide(old, now, n, maxWait)
	if d.Granted {
		s.tats[key] = next
	}
	return d, nil
}

// decide runs GCRA on a theoretical arrival time (tat): the time at which
// the budget would be full again. It returns the decision and, when
// granted, the new tat.
func (b *Local) decide(tat, now, n int64, maxWait time.Duration) (Decision, int64) {
	t := max(tat, now)
	next := t + n*b.emission
	wait := next - b.tolerance - now
	if wait > 0 && (maxWait == 0 || time.Duration(wait) > maxWait) {
		return Decision{
			Delay:     time.Duration(wait),
			Limit:     b.limit,
			Remaining: max(0, (now+b.tolerance-t)/b.emission),
			Reset:     time.Duration(t - now),
		}, tat
	}
	return Decision{
		Granted:   true,
		Delay:     time.Duration(max(wait, 0)),
		Limit:     b.limit,
		Remaining: max(0, (now+b.tolerance-next)/b.emission),
		Reset:     time.Duration(next - now),
	}, next
}

// Refund implements [Refunder]: it gives back n permits to key, never
// making the budget fuller than full.
func (b *Local) Refund(_ context.Context, key string, n int64) error {
	if n < 1 {
		return nil
	}
	now := b.clock.Now().Sub(b.epoch).Nanoseconds()
	dec := n * b.emission
	if key == "" {
		for {
			old := b.root.Load()
			if old <= now || b.root.CompareAndSwap(old, max(old-dec, now)) {
				return nil
			}
		}
	}
	s := b.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.tats[key]; ok && old > now {
		s.tats[key] = max(old-dec, now)
	}
	return nil
}

func (b *Local) shard(key string) *localShard {
	return &b.shards[maphash.String(b.seed, key)%localShards]
}

// sweep forgets the keys whose budget is full again (tat ≤ now, the same
// as absent) once the shard has grown, so idle keys do not pile up. The
// caller holds s.mu.
func (s *localShard) sweep(now int64) {
	if len(s.tats) < s.sweepSize {
		return
	}
	for k, tat := range s.tats {
		if tat <= now {
			delete(s.tats, k)
		}
	}
	s.sweepSize = max(64, 2*len(s.tats))
}

// keys returns how many keys the bucket remembers; for tests.
func (b *Local) keys() int {
	total := 0
	for i := range b.shards {
		b.shards[i].mu.Lock()
		total += len(b.shards[i].tats)
		b.shards[i].mu.Unlock()
	}
	return total
}
