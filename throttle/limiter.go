package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jonboulle/clockwork"
)

// Forever, passed as maxWait, waits for a permit until the context ends.
// It is the right wait for asynchronous pipelines (a Kafka consumer) that
// must process every record and have no caller waiting on the other end.
const Forever time.Duration = math.MaxInt64

// retryFloor is how long a Limiter waits before asking again when a bucket
// refused without saying for how long.
const retryFloor = time.Millisecond

// Limiter hands out permits from a [Bucket] and does the waiting.
//
// Most callers want [Limiter.Acquire]: it returns nil when the caller may
// go ahead, [ErrTimeout] when no permit comes within maxWait, or the
// context's error when the context ends first. A Limiter never polls its
// bucket: when the bucket has nothing to give it names the time something
// may be given (a refill, a window's end, a reservation), and the Limiter
// sleeps until then on its clock. If that time is beyond the caller's wait,
// Acquire fails at once instead of sleeping in vain.
//
// Per-key limits (a tenant, an endpoint) use [Limiter.Key]: one Limiter
// and one bucket serve every key, each key with its own budget.
//
// A Limiter is safe for concurrent use. Its zero value is not usable: build
// one with [New].
type Limiter struct {
	bucket Bucket
	cfg    config
	gates  gates
	fail   failover
	adapt  *adapter // the adaptive rate (report.go)
}

// New returns a Limiter that draws permits from b. Options: [WithClock],
// [WithLogger], [WithObserver], [WithFailurePolicy], [WithStoreTimeout].
//
// New does not fail: a nil b, or an unknown [FailurePolicy], gives a
// Limiter whose every call returns an error matching [ErrInvalid] that
// names the mistake, so that it surfaces where the Limiter is used, with a
// message, instead of as a nil-pointer panic or a silent default.
func New(b Bucket, opts ...LimiterOption) *Limiter {
	cfg := newConfig(opts)
	l := &Limiter{bucket: b, cfg: cfg, gates: gates{clock: cfg.clock}}
	l.fail.init(cfg)
	l.adapt = newAdapter(l)
	return l
}

// Bucket returns the bucket l draws from.
func (l *Limiter) Bucket() Bucket { return l.bucket }

// Clock returns the clock l sleeps on ([WithClock]), so that code waiting
// alongside l (an HTTP client honouring a provider's pause) measures time
// the same way.
func (l *Limiter) Clock() clockwork.Clock { return l.cfg.clock }

// Acquire takes one permit, waiting for it at most maxWait:
//
//   - maxWait == 0: take a permit only if one is free now.
//   - maxWait > 0: wait at most that long.
//   - maxWait == [Forever]: wait until ctx ends.
//
// The earlier of maxWait and ctx's deadline bounds the wait. It returns nil
// when the permit is the caller's; an error matching [ErrTimeout] when none
// comes in time (also matching context.DeadlineExceeded if ctx's deadline
// was the bound); ctx's error, wrapped, when ctx ends first; an error
// matching [ErrInvalid] for a negative maxWait; or the bucket's error.
// When the bucket's store fails (a [*BackendError], or no answer within
// [WithStoreTimeout]), the Limiter's [FailurePolicy] decides instead.
//
// Acquire returns by the end of the wait even when the store hangs: each
// bucket call gets a context with that deadline. A call with maxWait 0
// may take up to the store timeout ([WithStoreTimeout], 100 ms).
//
// When ctx carries permits of the same budget that the caller acquired
// already ([Keyed.ContextWithPermit]), Acquire uses one of them and
// returns nil at once.
func (l *Limiter) Acquire(ctx context.Context, maxWait time.Duration) error {
	return l.acquire(ctx, "", 1, maxWait)
}

// AcquireN is [Limiter.Acquire] for n permits at once, for calls that cost
// more than one (a batch API, a weighted endpoint). The n permits are
// granted together or not at all. n must be at least 1; an n that the
// bucket can never grant at once returns an error matching
// [ErrExceedsLimit] without waiting.
func (l *Limiter) AcquireN(ctx context.Context, n int64, maxWait time.Duration) error {
	return l.acquire(ctx, "", n, maxWait)
}

// Key returns a view of l that draws from the budget of key (a tenant, an
// endpoint, "tenant/endpoint") in the same bucket. It costs nothing: call
// it per request rather than caching one per key. Key("") is l itself.
func (l *Limiter) Key(key string) Keyed { return Keyed{l: l, key: key} }

// Keyed is a [Limiter] bound to one key of its bucket. Build it with
// [Limiter.Key]. The zero Keyed is not usable.
type Keyed struct {
	l   *Limiter
	key string
}

// Acquire is [Limiter.Acquire] for k's key.
func (k Keyed) Acquire(ctx context.Context, maxWait time.Duration) error {
	return k.AcquireN(ctx, 1, maxWait)
}

// AcquireN is [Limiter.AcquireN] for k's key.
func (k Keyed) AcquireN(ctx context.Context, n int64, maxWait time.Duration) error {
	if k.l == nil {
		return fmt.Errorf("throttle: zero Keyed: %w: build it with Limiter.Key", ErrInvalid)
	}
	return k.l.acquire(ctx, k.key, n, maxWait)
}

// Key returns the key k draws from.
func (k Keyed) Key() string { return k.key }

// Limiter returns the Limiter k belongs to.
func (k Keyed) Limiter() *Limiter { return k.l }

func (l *Limiter) acquire(ctx context.Context, key string, n int64, maxWait time.Duration) error {
	o := l.cfg.observer
	if o == nil {
		return l.wait(ctx, key, n, maxWait)
	}
	start := l.cfg.clock.Now()
	err := l.wait(ctx, key, n, maxWait)
	o.Acquired(key, n, l.cfg.clock.Since(start), err)
	return err
}

// take asks the bucket once, reporting the call to the observer.
func (l *Limiter) take(ctx context.Context, key string, n int64, left time.Duration) (Decision, error) {
	o := l.cfg.observer
	if o == nil {
		return l.bucket.Take(ctx, key, n, left)
	}
	start := l.cfg.clock.Now()
	d, err := l.bucket.Take(ctx, key, n, left)
	o.BucketCall(key, d, l.cfg.clock.Since(start), err)
	return d, err
}

// wait is Acquire's work: it validates, asks the bucket, and waits.
func (l *Limiter) wait(ctx context.Context, key string, n int64, maxWait time.Duration) error {
	if l.bucket == nil {
		return invalid("throttle", "Bucket", nil, "throttle.New needs a non-nil Bucket, such as throttle.NewLocal or one from package bucket")
	}
	if p := l.cfg.policy; p < FailLocal || p > FailOpen {
		return invalid("throttle", "WithFailurePolicy", p, "must be throttle.FailLocal, FailClosed or FailOpen")
	}
	if n < 1 {
		return invalid("throttle", "n", n, "must be at least 1")
	}
	if maxWait < 0 {
		return invalid("throttle", "maxWait", maxWait, "must be 0 (no wait), positive, or throttle.Forever")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("throttle: acquire %d permit(s): %w", n, err)
	}
	if l.useHeld(ctx, key, n) {
		return nil // the caller holds them already (ContextWithPermit)
	}

	clock := l.cfg.clock
	// budget is the whole wait allowed, measured on the limiter's clock
	// from start. ctxBound records that ctx's deadline, not maxWait, set it.
	budget, ctxBound := maxWait, false
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left < budget {
			budget, ctxBound = max(left, 0), true
		}
	}
	// The clock is read only for a wait that can run out: a call that may
	// not wait, or may wait forever, measures nothing.
	var start time.Time
	measured := budget > 0 && budget != Forever
	if measured {
		start = clock.Now()
	}
	tb := timeoutBound{n: n, maxWait: maxWait, ctxBound: ctxBound}
	retry := false
	for first := true; ; first = false {
		left := budget
		if measured && !first {
			left = max(budget-clock.Since(start), 0)
		}
		// Ask the bucket directly while it grants freely; after a refusal,
		// queue at the key's gate until the time the bucket named.
		g := l.gates.get(key)
		gated := g != nil && !g.open(clock)
		if gated {
			if err := g.enter(ctx, retry, left, tb); err != nil {
				return err
			}
			if measured {
				left = max(budget-clock.Since(start), 0)
			}
		}
		// While the provider's answers have lowered the adaptive rate,
		// each ask waits for an evenly spaced slot first (report.go);
		// free otherwise.
		if paced, err := l.adapt.pace(ctx, key, n, left, tb); err != nil {
			if gated {
				g.leave(false, 0)
			}
			return err
		} else if paced && measured {
			left = max(budget-clock.Since(start), 0)
		}
		d, degraded, err := l.decide(ctx, key, n, left, budget == 0)
		if measured {
			// The bucket call took time too: sleep only within what is
			// left of the wait now.
			left = max(budget-clock.Since(start), 0)
		}
		refused := err == nil && !d.Granted
		wait := d.Delay
		if refused && wait <= 0 {
			wait = retryFloor
		}
		// A refusal closes the key's gate for everyone only when it says
		// something about one permit from the shared bucket: not a
		// degraded one (the bucket may answer at the next call), nor one
		// for n > 1 (a single permit may come sooner).
		shared := !degraded && n == 1
		if gated {
			g.leave(refused && shared, wait)
		} else if refused && shared {
			l.gates.make(key).closeFor(wait)
		}
		if refused && !shared {
			// No herd to protect the store from here: sleep out the
			// delay privately, then ask (or probe) again.
			if wait > left {
				return tb.err(wait)
			}
			if err := l.sleep(ctx, wait); err != nil {
				return err
			}
			retry = true
			continue
		}
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrExceedsLimit) {
				if errors.Is(ctxErr, context.DeadlineExceeded) {
					// The deadline ran out while the bucket was asked
					// (its error may wrap the deadline or not): a wait
					// that ran out, as the doc says, ErrTimeout.
					return expiredWhileAsking(n, "the bucket", err)
				}
				if !errors.Is(err, ctxErr) {
					return fmt.Errorf("throttle: acquire %d permit(s): %w (bucket: %v)", n, ctxErr, err)
				}
			}
			return err
		}
		if d.Granted {
			if d.Delay <= 0 {
				return nil
			}
			// A reservation: the permits are ours from Delay on, unless
			// the bucket call itself ate into the wait so far that they
			// now come too late.
			if d.Delay > left {
				l.refund(ctx, key, n, d)
				return tb.err(d.Delay)
			}
			if err := l.sleep(ctx, d.Delay); err != nil {
				l.refund(ctx, key, n, d)
				return err
			}
			return nil
		}
		if wait > left {
			return tb.err(wait)
		}
		retry = true
	}
}

// refund gives back an abandoned reservation d, if the bucket can take it.
func (l *Limiter) refund(ctx context.Context, key string, n int64, d Decision) {
	if b, ok := l.bucket.(*Local); ok {
		b.refundReservation(key, n, d.ticket)
		return
	}
	r, ok := l.bucket.(Refunder)
	if !ok {
		return
	}
	// ctx is done; give the reservation back on a short context of its own.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if err := r.Refund(rctx, key, n); err != nil {
		l.cfg.logger.Warn("throttle: refund of an abandoned reservation failed", "key", key, "n", n, "err", err)
	}
}

// sleep waits d on the limiter's clock, or until ctx ends.
func (l *Limiter) sleep(ctx context.Context, d time.Duration) error {
	t := l.cfg.clock.NewTimer(d)
	select {
	case <-t.Chan():
		return nil
	case <-ctx.Done():
		t.Stop()
		return waitErr(ctx)
	}
}

func waitErr(ctx context.Context) error {
	return fmt.Errorf("throttle: waiting for a permit: %w", ctx.Err())
}

// timeoutBound is what an ErrTimeout of one Acquire says: how many
// permits, the maxWait, and whether ctx's deadline was the bound.
type timeoutBound struct {
	n        int64
	maxWait  time.Duration
	ctxBound bool
}

// err is the ErrTimeout for a permit that comes only after next.
func (b timeoutBound) err(next time.Duration) error {
	return timeout(b.n, b.maxWait, next, b.ctxBound)
}

// expiredWhileAsking is the ErrTimeout of a call whose context's deadline
// passed while what (the bucket, the adaptive pace) was being asked; err
// is what that call returned.
func expiredWhileAsking(n int64, what string, err error) error {
	return fmt.Errorf("%w: the context's deadline passed while %s was asked for %d permit(s) (%w; %s: %v)", ErrTimeout, what, n, context.DeadlineExceeded, what, err)
}

func timeout(n int64, maxWait, next time.Duration, ctxBound bool) error {
	if ctxBound {
		return fmt.Errorf("%w: %d permit(s) not free for %v, beyond the context's deadline (%w)", ErrTimeout, n, next, context.DeadlineExceeded)
	}
	if maxWait == 0 {
		return fmt.Errorf("%w: %d permit(s) not free now (next in %v) and maxWait is 0", ErrTimeout, n, next)
	}
	return fmt.Errorf("%w: %d permit(s) not free for %v, beyond maxWait %v", ErrTimeout, n, next, maxWait)
}
