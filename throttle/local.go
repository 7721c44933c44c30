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
// over a longer span t; use WithLocalBurst(1) for evenly spaced permits.
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
// per key, with a burst of limit unless WithLocalBurst says otherwise.
// Options: [WithClock], [WithLocalBurst].
//
// limit must be at least 1 and at most one per nanosecond of interval;
// interval must be positive.
func NewLocal(limit int64, interval time.Duration, opts ...LocalOption) (*Local, error) {
	cfg := newConfig(opts)
	if limit < 1 {
		return nil, invalid("throttle: NewLocal", "limit", limit, "must be at least 1")
	}
	if interval <= 0 {
		return nil, invalid("throttle: NewLocal", "interval", interval, "must be positive")
	}
	if limit > interval.Nanoseconds() {
		return nil, invalid("throttle: NewLocal", "limit", limit, "must be at most one per nanosecond of interval "+interval.String())
	}
	burst := limit
	if cfg.burst != 0 {
		burst = cfg.burst
	}
	if burst < 1 {
		return nil, invalid("throttle: NewLocal", "burst", burst, "must be at least 1")
	}
	emission := ceilDiv(interval.Nanoseconds(), limit)
	if burst > (1<<62)/emission {
		return nil, invalid("throttle: NewLocal", "burst", burst, "too large for the interval: burst × interval/limit overflows")
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

// WithLocalBurst sets how many permits a [Local] bucket ([NewLocal]) may
// grant at once after a quiet spell. Default: the limit. 1 spaces permits
// evenly, interval/limit apart.
func WithLocalBurst(n int64) LocalOption {
	return localOnly(func(c *config) { c.burst = n })
}

// ceilDiv is a/b rounded up, for a ≥ 0 and b > 0, without overflowing
// near math.MaxInt64 (FuzzLocalLimits: NewLocal(MaxInt64, MaxInt64)).
func ceilDiv(a, b int64) int64 {
	if a == 0 {
		return 0
	}
	return (a-1)/b + 1
}

// Take implements [Bucket]. A ctx that has ended takes nothing and
// returns its error.
func (b *Local) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, fmt.Errorf("throttle: Local: %w", err)
	}
	if n < 1 {
		return Decision{}, invalid("throttle: Local", "n", n, "must be at least 1")
	}
	if n > b.burst {
		return Decision{}, fmt.Errorf("throttle: Local: %d permits asked at once, at most %d can ever be granted: %w", n, b.burst, ErrExceedsLimit)
	}
	if maxWait < 0 {
		maxWait = 0
	}
	now := int64(b.clock.Since(b.epoch))
	if key == "" {
		for {
			old := b.root.Load()
			d, next := b.decide(old, now, n, maxWait)
			if !d.Granted || b.root.CompareAndSwap(old, next) {
				if d.Delay > 0 && d.Granted {
					d = b.reservation(d, key, n, next)
				}
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
		if d.Delay > 0 {
			d = b.reservation(d, key, n, next)
		}
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
			Remaining: min(max(0, (now+b.tolerance-t)/b.emission), b.limit),
			Reset:     time.Duration(t - now),
		}, tat
	}
	d := Decision{
		Granted:   true,
		Delay:     time.Duration(max(wait, 0)),
		Limit:     b.limit,
		Remaining: min(max(0, (now+b.tolerance-next)/b.emission), b.limit),
		Reset:     time.Duration(next - now),
	}
	return d, next
}

// reservation is d, a reservation of n permits of key that set the key's
// tat to next, with the Cancel that gives it back exactly.
func (b *Local) reservation(d Decision, key string, n, next int64) Decision {
	d.Cancel = func(context.Context) error {
		b.cancelReservation(key, n, next)
		return nil
	}
	return d
}

// Fallback is the limit per interval, for one instance (a Local limits
// its own process): see [Fallbacker].
func (b *Local) Fallback() (limit int64, interval time.Duration, instances int64) {
	return b.limit, time.Duration(b.emission * b.limit), 1
}

// Immediate reports true: a Local decides in memory, with no store that
// could fail or hang, so a Limiter calls it without a deadline of its own
// and never applies its FailurePolicy to it. A wrapper that embeds a
// Local and whose own Take waits on something must say false (define
// Immediate itself).
//
// A Local has no Refund: it cannot tell which of the permits it granted
// are returned, and giving back slots that a caller queued behind them
// still holds would put two permits in one slot. A reservation's own
// Decision.Cancel gives it back exactly, when it is still the last one
// booked.
func (*Local) Immediate() bool { return true }

// cancelReservation gives back the n permits of the reservation that set
// key's tat to ticket, if no later grant has been booked since and its
// slot has not begun: the budget is then as if it had never been made.
// Otherwise it does nothing; the slot goes unused.
func (b *Local) cancelReservation(key string, n int64, ticket int64) {
	if ticket == 0 || n < 1 {
		return
	}
	now := int64(b.clock.Since(b.epoch))
	if ticket-b.tolerance <= now {
		return // the slot has begun: the permits count as used
	}
	back := max(ticket-n*b.emission, now)
	if key == "" {
		b.root.CompareAndSwap(ticket, back)
		return
	}
	s := b.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tats[key] == ticket {
		s.tats[key] = back
	}
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
