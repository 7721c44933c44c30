package throttle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
)

// Leased is a [Bucket] that takes permits from another bucket in batches
// (leases) and hands them out from memory, so that most decisions cost no
// round trip to the shared store. It is the local layer of a fleet: each
// instance wraps the fleet's shared bucket (usually one from package
// github.com/headway-go/headway/bucket) in a Leased of its own.
//
// # How a permit is served
//
// A Take is served from the key's lease when the lease holds enough
// unexpired permits: one compare-and-swap, no lock, no call (key "" skips
// even the key lookup). When the lease runs dry, one caller per key refills
// it with a single inner.Take(ctx, key, batch, 0) that also covers its own
// permits; the other callers of that key wait for that refill, then try the
// new lease. When the inner bucket refuses, Take refuses with the inner
// Decision's Delay, and until that time has passed every Take of the key
// gets the same answer from memory, so a waiting fleet never polls the
// store. Weighted takes (n > 1) use what is left in the lease and fetch
// the rest.
//
// # Batch size follows demand
//
// Each refill measures the key's demand: the permits used from the
// previous lease over the time since that lease was taken. The next batch
// is what that demand uses in the horizon ([WithLeaseHorizon], default
// 50 ms), at most four times the previous batch (so a new or newly busy
// key starts with just its own permits and grows while it drains leases
// quickly), at most a share of the inner Decision.Limit ([WithLeaseShare],
// default 1/10; 16 permits if the inner bucket reports no limit), and, for
// a lease that ends with a period, at most what that demand can use before
// the period ends. A background sweep, once per horizon, hands back (if
// the inner bucket is a [Refunder]) the permits a lease holds beyond twice
// what the demand it just measured uses in a horizon; a key with no demand
// at all hands back everything and is then forgotten.
//
// That is the demand-based sharing of the fleet, without a coordinator:
// an instance draws from the shared bucket in proportion to its own demand
// and holds no more than a horizon's worth of it, an idle instance holds
// next to nothing, and the shared bucket serves whoever asks. So an
// unevenly loaded fleet still uses the whole limit; what can go unused is
// only what leases hold when their period ends, at most one batch (share
// of the limit) per busy instance and much less when demand is steady,
// since batches taken near a period's end are sized to what is left of it.
//
// # When leased permits expire, per bucket
//
// A lease is valid until the earlier of t0 + Decision.Reset of the grant
// and t0 + [WithLeaseTTL], where t0 is the instance's clock reading just
// before the refill was sent. The inner bucket decided after t0, so t0 +
// Reset is never later than the moment the inner bucket's period ends.
// What that keeps of the inner bucket's guarantee, counting each permit at
// the moment Leased hands it out:
//
//   - Token bucket, fixed window, counter with resetter (Decision.Reset is
//     the time until the period ends): every permit is handed out within
//     the period it was taken in. The guarantee is the inner bucket's,
//     exactly: at most limit per period. No TTL is needed.
//   - GCRA and [Local] (Decision.Reset is the time until the bucket is
//     full again): a permit held for h and handed out later shifts its
//     grant by up to h, so "≤ burst + rate·t in any span t" becomes
//     "≤ burst + rate·(t+h)". Set WithLeaseTTL(h) to bound h, and charge it
//     once, in configuration: give the inner bucket a burst of the
//     provider's burst minus rate·h. Without a TTL, h is bounded by Reset
//     only, up to a whole interval.
//   - Sliding log (at most limit in any window of length W): with
//     WithLeaseTTL(h), at most limit in any window of length W−h. To keep W
//     at the provider, configure the inner sliding log with a window of W+h.
//   - A bucket that reports no Reset, with no TTL set: nothing is leased;
//     every Take is one inner call (safe, not fast).
//
// Clocks: lease lifetimes are measured on this instance's clock from t0,
// never compared with another host's, so clock offsets between hosts do not
// matter.
//
// Leftovers go back through [Refunder] only while the lease is valid and
// not in the last tenth of its life, so that a refund reaches the inner
// bucket before the period it belongs to ends; the Refunder contract asks
// the bucket to drop a refund that arrives later. Permits of an expired
// lease are never used nor refunded. An inner bucket that is not a
// Refunder (package bucket's TokenBucket: a token given back could not be
// told apart from one of the next period) keeps what it leased: leftovers
// expire with their period, which is why batches are sized to what is left
// of it.
//
// # Decisions
//
// A permit served from the lease reports the inner bucket's Limit, the
// permits left in this instance's lease as Remaining (a lower bound of
// what the fleet has left) and the time until the lease expires as Reset.
// The inner bucket is always asked with maxWait 0: a bucket that reserves
// anyway is treated as refusing for that long (its reservation is refunded
// if it can be).
//
// A Leased is safe for concurrent use. Build it with [NewLeased]; it runs
// one background goroutine until [Leased.Close], which also hands back the
// leases. After Close every Take is passed straight to the inner bucket.
type Leased struct {
	inner    Bucket
	refunder Refunder // nil when inner cannot take permits back
	pauser   Pauser   // nil when inner cannot pause
	clock    clockwork.Clock
	epoch    time.Time
	logger   *slog.Logger
	horizon  int64 // ns
	ttl      int64 // ns; 0: bounded by Decision.Reset only
	share    float64
	// storeTimeout bounds the inner bucket's calls for callers that do
	// not wait (WithStoreTimeout; default DefaultStoreTimeout).
	storeTimeout time.Duration

	root leaseKey
	keys sync.Map // string → *leaseKey

	closed    atomic.Bool
	stop      chan struct{} // closed by Close to stop the sweeper
	done      chan struct{} // closed by the sweeper when it returns
	closeOnce sync.Once
	closeErr  error
	onSweep   func() // test hook, called after each background sweep
	onWait    func() // test hook, called as a caller starts waiting on a refill
}

// leaseKey is the lease and the demand of one key.
type leaseKey struct {
	// cur is the current lease; nil before the first refill.
	cur atomic.Pointer[leaseBatch]
	// dryUntil: before this time (ns since epoch) the inner bucket said
	// no; Take refuses from memory until then.
	dryUntil atomic.Int64

	mu        sync.Mutex  // guards what follows
	inflight  *leaseFill  // the refill in progress, if any
	rate      float64     // measured demand, permits per ns
	measured  *leaseBatch // the lease rate was measured on
	limit     int64       // inner Decision.Limit last seen; 0 unknown
	noLease   bool        // the inner bucket gives no Reset and no TTL is set
	tooBig    int64       // smallest batch the inner bucket refused as too big; 0 none
	dead      bool        // forgotten by the sweeper; look the key up again
	swept     *leaseBatch // the lease the last sweep saw
	sweptLeft int64       // and what it held then
	sweptAt   int64
	idle      int // sweeps in a row that found nothing held
}

// leaseBatch is one lease. Only left changes after it is published.
type leaseBatch struct {
	left     atomic.Int64
	size     int64 // permits fetched, the refiller's own included
	start    int64 // t0, ns since epoch
	expires  int64 // ns since epoch
	limit    int64 // inner Decision.Limit
	periodic bool  // expires with the inner bucket's period (Reset)
	returned int64 // permits refunded by the sweeper; guarded by leaseKey.mu
}

// leaseFill is a refill in progress, for the callers that wait on it.
type leaseFill struct {
	done chan struct{}
	err  error
}

const (
	defaultLeaseHorizon = 50 * time.Millisecond
	defaultLeaseShare   = 0.1
	// leaseCapUnknown caps batches when the inner bucket reports no limit.
	leaseCapUnknown = 16
	// leaseGrowth bounds how much a batch may grow from one refill to the next.
	leaseGrowth = 4
	// leaseRefundTimeout bounds a refund made by the sweeper or Close.
	leaseRefundTimeout = time.Second
)

// leaseOption is a [LeasedOption] that only [NewLeased] reads.
type leaseOption func(*leaseConfig)

func (leaseOption) apply(*config) {}
func (leaseOption) leasedOption() {}

type leaseConfig struct {
	horizon   time.Duration
	ttl       time.Duration
	share     float64
	noSweeper bool
	onSweep   func()
	onWait    func()
}

// WithLeaseHorizon sets how far ahead a [Leased] bucket leases: each batch
// is about the permits the key's measured demand uses in d. Default: 50 ms.
// Longer means fewer round trips and more permits held per instance
// (more left unused when a period ends); shorter the reverse. The
// background sweep also runs once per d. d must be positive.
func WithLeaseHorizon(d time.Duration) LeasedOption {
	return leaseOption(func(c *leaseConfig) { c.horizon = d })
}

// WithLeaseTTL bounds how long leased permits stay valid: at most d after
// the refill that took them, even when the inner bucket's period lasts
// longer. Default: 0, no bound but the inner Decision.Reset, which is right
// for token buckets, fixed windows and counters. Set it for GCRA, [Local]
// and sliding-log inner buckets; see [Leased] for what it keeps of their
// guarantee. d must not be negative.
func WithLeaseTTL(d time.Duration) LeasedOption {
	return leaseOption(func(c *leaseConfig) { c.ttl = d })
}

// WithLeaseShare caps a [Leased] bucket's batch at fraction f of the inner
// bucket's limit (Decision.Limit). Default: 0.1. A fleet of k busy
// instances leaves at most about k·f·limit unused at a period's end;
// lower f for large fleets, raise it for few instances with a small limit.
// f must be in (0, 1].
func WithLeaseShare(f float64) LeasedOption {
	return leaseOption(func(c *leaseConfig) { c.share = f })
}

// withoutLeaseSweeper keeps NewLeased from starting its background sweep,
// so that tests can call sweep at chosen times.
func withoutLeaseSweeper() LeasedOption {
	return leaseOption(func(c *leaseConfig) { c.noSweeper = true })
}

// withLeaseWaitHook makes a caller call f as it starts waiting on another
// caller's refill.
func withLeaseWaitHook(f func()) LeasedOption {
	return leaseOption(func(c *leaseConfig) { c.onWait = f })
}

// withLeaseSweepHook makes the background sweep call f after each pass.
func withLeaseSweepHook(f func()) LeasedOption {
	return leaseOption(func(c *leaseConfig) { c.onSweep = f })
}

// NewLeased returns a [Leased] bucket that leases permits from inner.
// Options: [WithClock], [WithLogger], [WithStoreTimeout], [WithLeaseHorizon], [WithLeaseTTL],
// [WithLeaseShare].
//
// It starts one background goroutine (the sweep that hands back unneeded
// permits); call [Leased.Close] when done with it.
func NewLeased(inner Bucket, opts ...LeasedOption) (*Leased, error) {
	if inner == nil {
		return nil, invalid("throttle: NewLeased", "inner", nil, "must be a Bucket, such as one from package bucket")
	}
	base := newConfig(opts)
	lc := leaseConfig{horizon: defaultLeaseHorizon, share: defaultLeaseShare}
	for _, o := range opts {
		if lo, ok := o.(leaseOption); ok && lo != nil {
			lo(&lc)
		}
	}
	if lc.horizon <= 0 {
		return nil, invalid("throttle: NewLeased", "horizon", lc.horizon, "must be positive")
	}
	if lc.ttl < 0 {
		return nil, invalid("throttle: NewLeased", "ttl", lc.ttl, "must be 0 (bounded by the inner bucket's Reset) or positive")
	}
	if !(lc.share > 0 && lc.share <= 1) {
		return nil, invalid("throttle: NewLeased", "share", lc.share, "must be in (0, 1]")
	}
	l := &Leased{
		inner:  inner,
		clock:  base.clock,
		epoch:  base.clock.Now(),
		logger: base.logger,

		storeTimeout: base.storeTimeout,
		horizon:      lc.horizon.Nanoseconds(),
		ttl:          lc.ttl.Nanoseconds(),
		share:        lc.share,
		onSweep:      lc.onSweep,
		onWait:       lc.onWait,
	}
	l.refunder, _ = inner.(Refunder)
	l.pauser, _ = inner.(Pauser)
	if !lc.noSweeper {
		l.stop = make(chan struct{})
		l.done = make(chan struct{})
		ticker := l.clock.NewTicker(lc.horizon)
		go l.sweeper(ticker)
	}
	return l, nil
}

func (l *Leased) now() int64 { return int64(l.clock.Since(l.epoch)) }

func (l *Leased) key(key string) *leaseKey {
	if key == "" {
		return &l.root
	}
	if v, ok := l.keys.Load(key); ok {
		return v.(*leaseKey)
	}
	v, _ := l.keys.LoadOrStore(key, new(leaseKey))
	return v.(*leaseKey)
}

// take takes n permits from the lease if it holds that many, returning
// what is left.
func (b *leaseBatch) take(n int64) (int64, bool) {
	for {
		left := b.left.Load()
		if left < n {
			return left, false
		}
		if b.left.CompareAndSwap(left, left-n) {
			return left - n, true
		}
	}
}

// refundable reports whether the lease's permits may still be handed back:
// before the last tenth of its life, so that the refund reaches the inner
// bucket within the period the permits belong to.
func (b *leaseBatch) refundable(now int64) bool {
	return (b.expires-now)*10 >= b.expires-b.start && now < b.expires
}

func (b *leaseBatch) granted(left, now int64) Decision {
	return Decision{Granted: true, Limit: b.limit, Remaining: left, Reset: time.Duration(max(b.expires-now, 0))}
}

func (l *Leased) boundsStoreCalls() {}

// Fallback implements [Fallbacker] for a Limiter's failure policy: the
// inner bucket's figures, or none (the policy then fails closed) when the
// inner bucket is not a Fallbacker.
func (l *Leased) Fallback() (limit int64, interval time.Duration, instances int64) {
	if fb, ok := l.inner.(Fallbacker); ok {
		return fb.Fallback()
	}
	return 0, 0, 0
}

// Take implements [Bucket]. maxWait is not used (the inner bucket is asked
// with 0) except after Close, when the call goes straight to the inner
// bucket.
func (l *Leased) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (Decision, error) {
	if n < 1 {
		return Decision{}, invalid("throttle: Leased", "n", n, "must be at least 1")
	}
	k := &l.root
	if key != "" {
		k = l.key(key)
	}
	now := l.now()
	if until := k.dryUntil.Load(); now < until {
		return k.dry(until, now), nil
	}
	if b := k.cur.Load(); b != nil && now < b.expires {
		if left, ok := b.take(n); ok {
			return b.granted(left, now), nil
		}
	}
	return l.refill(ctx, k, key, n, maxWait)
}

// dry is the refusal Take gives from memory while the inner bucket is dry.
func (k *leaseKey) dry(until, now int64) Decision {
	d := Decision{Delay: time.Duration(until - now), Remaining: 0}
	if b := k.cur.Load(); b != nil {
		d.Limit = b.limit
	}
	return d
}

// dryUntilAtLeast moves dryUntil to until unless it is later already.
func (k *leaseKey) dryUntilAtLeast(until int64) {
	for {
		old := k.dryUntil.Load()
		if old >= until || k.dryUntil.CompareAndSwap(old, until) {
			return
		}
	}
}

// refill is Take's slow path: one caller per key refills the lease, the
// others wait for it and try again.
//
// Each pass bounds its store call, or its wait on another caller's
// refill, by what is left of maxWait, not maxWait itself: a caller that
// waited on a refill that failed, then refills itself, must still return
// within its wait.
func (l *Leased) refill(ctx context.Context, k *leaseKey, key string, n int64, maxWait time.Duration) (Decision, error) {
	start := l.now()
	for first := true; ; first = false {
		left := maxWait
		if !first && maxWait > 0 && maxWait != Forever {
			left = maxWait - time.Duration(l.now()-start)
			if left <= 0 {
				return Decision{}, fmt.Errorf("%w: the wait ran out while the lease of key %q was being refilled", ErrTimeout, key)
			}
		}
		if l.closed.Load() {
			ictx, cancel, _, _ := boundStoreCall(ctx, left, maxWait == 0, l.storeTimeout)
			d, err := l.inner.Take(ictx, key, n, left)
			cancel()
			return d, err
		}
		k.mu.Lock()
		if k.dead {
			k.mu.Unlock()
			k = l.key(key)
			continue
		}
		now := l.now()
		if until := k.dryUntil.Load(); now < until {
			k.mu.Unlock()
			return k.dry(until, now), nil
		}
		prev := k.cur.Load()
		if prev != nil && now < prev.expires {
			if left, ok := prev.take(n); ok {
				k.mu.Unlock()
				return prev.granted(left, now), nil
			}
		}
		if f := k.inflight; f != nil {
			k.mu.Unlock()
			if l.onWait != nil {
				l.onWait()
			}
			// Wait for the refill at most as long as this caller may:
			// the refiller's own store call may be bounded later, or not
			// at all (a Forever caller).
			wctx, cancel, _, _ := boundStoreCall(ctx, left, maxWait == 0, l.storeTimeout)
			select {
			case <-f.done:
				cancel()
			case <-wctx.Done():
				cancel()
				if ctx.Err() != nil {
					return Decision{}, fmt.Errorf("throttle: Leased: waiting for the lease of key %q to be refilled: %w", key, ctx.Err())
				}
				return Decision{}, fmt.Errorf("%w: the lease of key %q was still being refilled when the wait ran out", ErrTimeout, key)
			}
			var be *BackendError
			if f.err != nil && errors.As(f.err, &be) && !isContextError(f.err) {
				return Decision{}, f.err // the store failed: it would for us too
			}
			continue // granted, refused, or an error of the refiller's own (its context, its n): try again
		}

		if k.limit > 0 && n > k.limit {
			k.mu.Unlock()
			return Decision{}, fmt.Errorf("throttle: Leased: %d permits asked at once, the inner bucket's limit is %d: %w", n, k.limit, ErrExceedsLimit)
		}

		// This caller refills. Use what the lease still holds, fetch the rest.
		f := &leaseFill{done: make(chan struct{})}
		k.inflight = f
		l.measure(k, prev, now)
		var held int64
		if prev != nil && now < prev.expires {
			held = prev.left.Swap(0) // < n, or take would have succeeded
		}
		need := n - held
		want := l.want(k, prev, need, now)
		k.mu.Unlock()

		d, again, err := l.fetchAndInstall(ctx, k, key, prev, held, need, want, left)

		k.mu.Lock()
		k.inflight = nil
		f.err = err
		close(f.done)
		k.mu.Unlock()
		if again {
			// The held permits expired with their period while the rest
			// was fetched: take all n from the new lease (or refill again).
			continue
		}
		return d, err
	}
}

// fetchAndInstall takes need+want permits from the inner bucket and
// publishes the new lease. held permits of prev are the caller's too; they
// go back into prev if the inner bucket refuses.
//
// Held permits belong to prev's period and may be handed out only before
// prev expires. When the fetch returns after that (the inner bucket may
// have begun a new period meanwhile), they are dropped, everything fetched
// goes into the new lease, and again is true: the caller must take its n
// permits anew, all from the new period. Otherwise a weighted take across a
// period's end would hand out old permits in a period that also grants its
// full limit (issue 12, defect 1).
func (l *Leased) fetchAndInstall(ctx context.Context, k *leaseKey, key string, prev *leaseBatch, held, need, want int64, maxWait time.Duration) (d Decision, again bool, err error) {
	restore := func() {
		if held > 0 {
			prev.left.Add(held)
		}
	}
	// Bound the inner bucket's round trips by the caller's wait, as a
	// Limiter does for a bucket it calls directly (Leased is selfBounded).
	ictx, cancel, d0, budgetBound := boundStoreCall(ctx, maxWait, maxWait == 0, l.storeTimeout)
	defer cancel()
	ask := need + want
	t0 := l.now()
	d, err = l.inner.Take(ictx, key, ask, 0)
	if want > 0 {
		// A batch too big for what is left (or for the bucket) must not
		// cost the caller its own permits: ask again for what can be had.
		retry := int64(0)
		switch {
		case err != nil && errors.Is(err, ErrExceedsLimit):
			retry = need
			k.mu.Lock()
			if k.tooBig == 0 || ask < k.tooBig {
				k.tooBig = ask // the bucket's burst is below its Limit
			}
			k.mu.Unlock()
		case err == nil && !d.Granted && d.Remaining >= need && d.Remaining < ask:
			retry = d.Remaining
		case err == nil && !d.Granted && d.Remaining < 0:
			retry = need
		}
		if retry > 0 {
			ask = retry
			t0 = l.now()
			d, err = l.inner.Take(ictx, key, ask, 0)
		}
	}
	t1 := l.now()
	if err != nil {
		restore()
		if budgetBound && d0 < l.storeTimeout/4 && ctx.Err() == nil && deadlinePassed(ictx) {
			// The caller's wait cut the refill short of a fair chance: no
			// evidence that the store is down. The wait ran out.
			return Decision{}, false, fmt.Errorf("%w: the inner bucket did not answer in the %v left of the wait: %w", ErrTimeout, d0, err)
		}
		return Decision{}, false, err
	}
	if d.Granted && d.Delay > 0 {
		// A reservation, though none was asked for: treat it as "not yet".
		_ = l.refund(key, ask)
		d.Granted = false
	}
	if !d.Granted {
		restore()
		if d.Delay > 0 {
			k.dryUntilAtLeast(t1 + int64(d.Delay))
		}
		return Decision{Delay: d.Delay, Limit: d.Limit, Remaining: max(d.Remaining, 0), Reset: d.Reset}, false, nil
	}

	life := l.ttl
	periodic := false
	if r := int64(d.Reset); r > 0 && (life == 0 || r < life) {
		life, periodic = r, true
	}
	b := &leaseBatch{
		size:     ask,
		start:    t0,
		expires:  t0 + life,
		limit:    d.Limit,
		periodic: periodic,
	}
	again = held > 0 && t1 >= prev.expires
	if again {
		b.left.Store(ask) // the held permits expired: the caller's n come from here
	} else {
		b.left.Store(ask - need)
	}

	k.mu.Lock()
	k.limit = d.Limit
	k.noLease = life == 0
	extra := int64(0)
	if l.closed.Load() || life == 0 || k.dryUntil.Load() > t1 {
		// Closed or paused meanwhile, or nothing may be leased: the
		// caller keeps its own permits, the rest goes back.
		extra = b.left.Swap(0)
	}
	k.cur.Store(b)
	k.mu.Unlock()
	if extra > 0 {
		_ = l.refund(key, extra) // logged; lost permits only cost throughput
	}
	if again {
		return Decision{}, true, nil
	}
	return b.granted(b.left.Load(), t1), false, nil
}

// measure records the key's demand on the lease prev, once per lease: the
// permits used from it over the time since it was taken. The caller holds
// k.mu.
func (l *Leased) measure(k *leaseKey, prev *leaseBatch, now int64) {
	if prev == nil || k.measured == prev {
		return
	}
	k.measured = prev
	used := max(prev.size-max(prev.left.Load(), 0)-prev.returned, 0)
	span := max(now-prev.start, 1)
	k.rate = float64(used) / float64(span)
}

// want is the size of the next batch beyond the caller's own permits.
// The caller holds k.mu.
func (l *Leased) want(k *leaseKey, prev *leaseBatch, need, now int64) int64 {
	if prev == nil || k.noLease {
		return 0 // start small: the first refill fetches only its own
	}
	w := k.rate * float64(l.horizon)
	w = min(w, float64(leaseGrowth*max(prev.size, 1)))
	if prev.periodic && now < prev.expires {
		// The next batch most likely belongs to the same period: take no
		// more than this demand can use before the period ends.
		w = min(w, math.Ceil(k.rate*float64(prev.expires-now)))
	}
	capN := int64(leaseCapUnknown)
	if k.limit > 0 {
		capN = max(int64(l.share*float64(k.limit)), 1)
	}
	if k.tooBig > 0 {
		capN = min(capN, k.tooBig-1-need)
	}
	return max(min(int64(w), capN), 0)
}

// refund hands n permits of key back to the inner bucket, if it takes them.
func (l *Leased) refund(key string, n int64) error {
	if l.refunder == nil || n < 1 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), leaseRefundTimeout)
	defer cancel()
	if err := l.refunder.Refund(ctx, key, n); err != nil {
		l.logger.Warn("throttle: Leased: handing back leased permits failed", "key", key, "n", n, "err", err)
		return fmt.Errorf("throttle: Leased: refund %d permit(s) of key %q: %w", n, key, err)
	}
	return nil
}

func isContextError(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// sweeper runs sweep once per horizon until Close.
func (l *Leased) sweeper(t clockwork.Ticker) {
	defer close(l.done)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.Chan():
			l.sweep(l.now())
			if l.onSweep != nil {
				l.onSweep()
			}
		}
	}
}

type leaseRefund struct {
	key string
	n   int64
}

// sweep hands back what leases hold beyond the demand, and forgets keys
// that have held nothing for two sweeps.
func (l *Leased) sweep(now int64) {
	var refunds []leaseRefund
	visit := func(key string, k *leaseKey) {
		k.mu.Lock()
		defer k.mu.Unlock()
		if k.inflight != nil || k.dead {
			return
		}
		b := k.cur.Load()
		if b == nil || now >= b.expires || b.left.Load() == 0 {
			k.idle++
			if key != "" && k.idle >= 2 && now >= k.dryUntil.Load() {
				if b != nil {
					b.left.Swap(0)
				}
				k.dead = true
				l.keys.CompareAndDelete(key, k)
			}
			return
		}
		k.idle = 0
		left := b.left.Load()
		var used, span int64
		if k.swept == b {
			used, span = k.sweptLeft-left, now-k.sweptAt
		} else {
			used, span = b.size-left-b.returned, now-b.start
		}
		k.swept, k.sweptLeft, k.sweptAt = b, left, now
		if l.refunder == nil || !b.refundable(now) {
			return // nowhere to hand back to, or too late to
		}
		keep := int64(0)
		if used > 0 {
			// Twice what the demand just seen uses in a horizon (or
			// until the lease ends, if sooner): what a refill would fetch.
			ahead := min(b.expires-now, l.horizon)
			keep = int64(math.Ceil(2 * float64(used) * float64(ahead) / float64(max(span, 1))))
		}
		if excess := left - keep; excess > 0 && b.left.CompareAndSwap(left, keep) {
			b.returned += excess
			k.sweptLeft = keep
			refunds = append(refunds, leaseRefund{key, excess})
		}
	}
	visit("", &l.root)
	l.keys.Range(func(key, v any) bool {
		visit(key.(string), v.(*leaseKey))
		return true
	})
	for _, r := range refunds {
		_ = l.refund(r.key, r.n) // logged; the permits expire with the lease anyway
	}
}

// Close stops the background sweep and hands the permits leases still hold
// back to the inner bucket (if it is a [Refunder]). It returns the refunds'
// errors, if any. After Close, Take passes every call straight to the inner
// bucket. Close is safe to call more than once and concurrently with Take.
func (l *Leased) Close() error {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		if l.stop != nil {
			close(l.stop)
			<-l.done
		}
		now := l.now()
		var refunds []leaseRefund
		visit := func(key string, k *leaseKey) {
			k.mu.Lock()
			defer k.mu.Unlock()
			if b := k.cur.Load(); b != nil {
				if left := b.left.Swap(0); left > 0 && b.refundable(now) {
					refunds = append(refunds, leaseRefund{key, left})
				}
			}
		}
		visit("", &l.root)
		l.keys.Range(func(key, v any) bool {
			visit(key.(string), v.(*leaseKey))
			return true
		})
		var errs []error
		for _, r := range refunds {
			if err := l.refund(r.key, r.n); err != nil {
				errs = append(errs, err)
			}
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// Pause implements [Pauser]: this instance stops serving key for d at
// once (its lease for key is dropped), and the pause is passed on to the
// inner bucket if it is a Pauser, so that the rest of the fleet stops too.
// Other instances stop as soon as they next ask the inner bucket, at the
// latest when their leases expire. d is clamped to [MaxPause].
func (l *Leased) Pause(ctx context.Context, key string, d time.Duration) error {
	d = min(d, MaxPause)
	for d > 0 {
		k := &l.root
		if key != "" {
			k = l.key(key)
		}
		k.mu.Lock()
		if k.dead {
			// The sweeper forgot the key meanwhile: pause the one that
			// Take will find.
			k.mu.Unlock()
			continue
		}
		k.dryUntilAtLeast(l.now() + int64(d))
		if b := k.cur.Load(); b != nil {
			b.left.Swap(0)
		}
		k.mu.Unlock()
		break
	}
	if l.pauser != nil {
		return l.pauser.Pause(ctx, key, d)
	}
	return nil
}

// held returns the valid permits key's lease holds now; for tests.
func (l *Leased) held(key string) int64 {
	k := &l.root
	if key != "" {
		v, ok := l.keys.Load(key)
		if !ok {
			return 0
		}
		k = v.(*leaseKey)
	}
	if b := k.cur.Load(); b != nil && l.now() < b.expires {
		return b.left.Load()
	}
	return 0
}
