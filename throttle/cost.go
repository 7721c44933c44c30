package throttle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Cost is what one call spends of each dimension of a budget, by name
// ("requests", "tokens"). Amounts are never negative; a dimension a Cost
// does not name (or names with 0) is neither checked nor charged.
type Cost map[string]int64

// String lists the amounts by name, in name order: "requests=1 tokens=800".
func (c Cost) String() string {
	var sb strings.Builder
	for i, name := range slices.Sorted(maps.Keys(c)) {
		if i > 0 {
			sb.WriteByte(' ')
		}
		fmt.Fprintf(&sb, "%s=%d", name, c[name])
	}
	return sb.String()
}

// CostBucket is implemented by buckets that keep several dimensions per
// key (requests and tokens per minute, say) and take them together, such
// as package bucket's Budget. [Limiter.AcquireCost] and [Limiter.Settle]
// use it.
type CostBucket interface {
	// TakeCost takes c from key's dimensions, all or nothing; like
	// [Bucket.Take], it never sleeps and names in Decision.Delay when
	// asking again can succeed. It returns an error wrapping [ErrInvalid]
	// for a dimension it does not keep or a negative amount, and one
	// wrapping [ErrExceedsLimit] for an amount it can never grant at once.
	TakeCost(ctx context.Context, key string, c Cost, maxWait time.Duration) (Decision, error)
	// Settle changes key's dimensions by delta after a call: a negative
	// amount gives back what was not used (best effort, as
	// [Refunder.Refund]), a positive amount charges at once, without
	// waiting and even beyond what is left: a debt that the next refills
	// pay first.
	Settle(ctx context.Context, key string, delta Cost) error
}

// AcquireCost takes the cost c from the Limiter's budget, all dimensions
// together or none, waiting for it at most maxWait as [Limiter.Acquire]
// does: it sleeps, on the Limiter's clock, exactly until the time the
// bucket names (a refill, the end of a debt or of a pause), never polling,
// and returns an error matching [ErrTimeout] at once when that time is
// beyond the wait. Give an estimate when the real cost is known only after
// the call, and correct it with [Limiter.Settle].
//
// The bucket should be a [CostBucket] (package bucket's Budget), found as
// the Limiter finds the other optional interfaces (along Unwrap: a wrapper
// such as [Smooth] is passed by). Any other bucket keeps one dimension: c
// must then name exactly one with an amount above 0, and AcquireCost is
// [Limiter.AcquireN] of that amount.
//
// AcquireCost is simpler than Acquire: callers of a key do not queue
// behind a refusal, it uses no lease and no adaptive pace, ignores the
// permits a context holds, and reports nothing to the [Observer] but its
// degraded decisions. When the
// store fails, FailOpen grants and FailClosed refuses; FailLocal refuses
// too (a budget of several dimensions has no local share), with an error
// that says so. Each call asks the store itself.
//
// Bad input (an empty Cost, a negative amount, a name the bucket does not
// keep) returns an error matching [ErrInvalid] that names it.
func (l *Limiter) AcquireCost(ctx context.Context, c Cost, maxWait time.Duration) error {
	return l.acquireCost(ctx, "", c, maxWait)
}

// Settle corrects a cost acquired with [Limiter.AcquireCost] once the
// call's real cost is known: it charges actual−estimated of each
// dimension actual names, at once and without waiting (a dimension actual
// does not name is left as estimated). A dimension the call used less
// of than estimated is given back (best effort: a bucket may keep what
// belongs to a period that has ended), so that an over-estimate does not
// idle the budget; one it used more of is charged even beyond what is
// left, a debt that delays the next grants until the refills have paid it.
//
// With a bucket that is not a [CostBucket] (one dimension), a give-back
// goes through the bucket's [Refunder] (nothing happens without one), and
// a charge is taken at once if the bucket has it: a plain bucket cannot
// hold a debt, so a charge it cannot grant now returns an error matching
// [ErrTimeout] and is not taken.
//
// A grant made by the failure policy (FailOpen while the store failed)
// charged nothing: do not give it back. A charge above a dimension's
// limit is refused by bucket.Budget as an error in the caller's units.
//
// Settle waits for the store at most the store timeout
// ([WithStoreTimeout]) or ctx's deadline, and returns the store's error
// (a [*BackendError]); it applies no failure policy and does not retry.
func (l *Limiter) Settle(ctx context.Context, estimated, actual Cost) error {
	return l.settleCost(ctx, "", estimated, actual)
}

// AcquireCost is [Limiter.AcquireCost] for k's key.
func (k Keyed) AcquireCost(ctx context.Context, c Cost, maxWait time.Duration) error {
	if k.l == nil {
		return fmt.Errorf("throttle: zero Keyed: %w: build it with Limiter.Key", ErrInvalid)
	}
	return k.l.acquireCost(ctx, k.key, c, maxWait)
}

// Settle is [Limiter.Settle] for k's key.
func (k Keyed) Settle(ctx context.Context, estimated, actual Cost) error {
	if k.l == nil {
		return fmt.Errorf("throttle: zero Keyed: %w: build it with Limiter.Key", ErrInvalid)
	}
	return k.l.settleCost(ctx, k.key, estimated, actual)
}

// checkCost refuses a Cost with an empty name or a negative amount;
// field names the argument ("cost", "estimated", "actual").
func checkCost(field string, c Cost) error {
	for name, v := range c {
		if name == "" {
			return invalid("throttle", field, fmt.Sprintf("%q", c.String()), "every dimension needs a name")
		}
		if v < 0 {
			return invalid("throttle", fmt.Sprintf("%s[%q]", field, name), v, "must be at least 0")
		}
	}
	return nil
}

// single returns the one dimension a Cost names with a non-zero amount
// (after dropping zeros), for a bucket that keeps one.
func single(c Cost) (string, int64, bool) {
	var name string
	var n int64
	count := 0
	for k, v := range c {
		if v != 0 {
			name, n = k, v
			count++
		}
	}
	return name, n, count == 1
}

func (l *Limiter) acquireCost(ctx context.Context, key string, c Cost, maxWait time.Duration) error {
	if l.bad != nil {
		return l.bad
	}
	if err := checkCost("cost", c); err != nil {
		return err
	}
	var total int64
	for _, v := range c {
		total += v
	}
	if total == 0 {
		return invalid("throttle", "cost", fmt.Sprintf("%q", c.String()), "must ask for at least 1 of some dimension")
	}
	if maxWait < 0 {
		return invalid("throttle", "maxWait", maxWait, "must be 0 (no wait), positive, or throttle.Forever")
	}
	cb, ok := capability[CostBucket](l.bucket)
	if !ok {
		_, n, one := single(c)
		if !one {
			return invalid("throttle", "cost", fmt.Sprintf("%q", c.String()), "the bucket keeps one dimension (it is no throttle.CostBucket): name exactly one, or use a bucket of several dimensions such as bucket.NewBudget")
		}
		return l.acquire(ctx, key, n, maxWait)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("throttle: acquire cost %v: %w", c, err)
	}
	ctx, cancel := WaitContext(ctx)
	defer cancel()
	if ctx.Err() != nil {
		return waitErr(ctx) // stopped already
	}
	w := l.newWaiter(ctx, total, maxWait, 0)
	for {
		left := w.left()
		tctx, cancel, d0, _ := boundStoreCall(ctx, left, w.noWait(), l.cfg.storeTimeout)
		d, err := cb.TakeCost(tctx, key, c, left)
		expired := d0 > 0 && !errors.Is(ctx.Err(), context.Canceled) && deadlinePassed(tctx)
		cancel()
		if err != nil {
			if storeFailure(ctx, expired, err) {
				if err := l.degradeCost(key, c, err); err != nil {
					return err
				}
				// FailOpen's grant, never after the wait's end either
				// (the failure may come back after it).
				return w.ended(false)
			}
			if errors.Is(err, ErrInvalid) || errors.Is(err, ErrExceedsLimit) {
				return err
			}
			return w.failed(err)
		}
		left = w.left()
		if d.Granted {
			if d.Delay > left {
				// A reservation beyond the wait left (none is left when
				// the answer came after the wait's end): give it back.
				l.giveBackCost(ctx, cb, key, c)
				return costTimeout(c, maxWait, d.Delay, w.tb.ctxBound)
			}
			if d.Delay > 0 {
				if err := l.sleep(ctx, d.Delay); err != nil {
					l.giveBackCost(ctx, cb, key, c)
					return err
				}
			}
			// Never granted after the wait's end (see waiter.keep): a
			// grant answered after it, or a wait ended as its slot came.
			if err := w.ended(d.Delay > 0); err != nil {
				l.giveBackCost(ctx, cb, key, c)
				return err
			}
			return nil
		}
		delay := d.Delay
		if delay <= 0 {
			delay = retryFloor
		}
		if delay > left {
			return costTimeout(c, maxWait, delay, w.tb.ctxBound)
		}
		if err := l.sleep(ctx, delay); err != nil {
			return err
		}
	}
}

// giveBackCost gives back an abandoned reservation of c (handBack: the
// caller waits for it at most the store timeout).
func (l *Limiter) giveBackCost(ctx context.Context, cb CostBucket, key string, c Cost) {
	back := make(Cost, len(c))
	for name, v := range c {
		back[name] = -v
	}
	l.handBack(ctx, func(rctx context.Context) {
		if err := cb.Settle(rctx, key, back); err != nil {
			l.cfg.logger.Warn("throttle: giving back an abandoned reservation failed", "key", key, "cost", c.String(), "err", err)
		}
	})
}

// degradeCost is AcquireCost's failure policy when the store failed with
// err: FailOpen grants; FailClosed and FailLocal refuse.
func (l *Limiter) degradeCost(key string, c Cost, err error) error {
	policy := l.cfg.policy
	var derr error
	switch policy {
	case FailOpen:
	case FailClosed:
		derr = fmt.Errorf("throttle: acquire cost %v: bucket store failed, and FailClosed refuses every call until it answers: %w", c, err)
	default:
		derr = fmt.Errorf("throttle: acquire cost %v: bucket store failed, and FailLocal refuses costs as FailClosed does (a budget of several dimensions has no local share): %w", c, err)
	}
	if o := l.cfg.observer; o != nil {
		name := policy.String()
		if derr != nil {
			name = FailClosed.String()
		}
		o.Degraded(key, name, derr == nil, err)
	}
	return derr
}

// costTimeout is the ErrTimeout of an AcquireCost whose cost comes only
// after next.
func costTimeout(c Cost, maxWait, next time.Duration, ctxBound bool) error {
	switch {
	case ctxBound:
		return fmt.Errorf("%w: cost %v not free for %v, beyond the context's deadline (%w)", ErrTimeout, c, next, context.DeadlineExceeded)
	case maxWait == 0:
		return fmt.Errorf("%w: cost %v not free now (next in %v) and maxWait is 0", ErrTimeout, c, next)
	}
	return fmt.Errorf("%w: cost %v not free for %v, beyond maxWait %v", ErrTimeout, c, next, maxWait)
}

func (l *Limiter) settleCost(ctx context.Context, key string, estimated, actual Cost) error {
	if l.bad != nil {
		return l.bad
	}
	if err := checkCost("estimated", estimated); err != nil {
		return err
	}
	if err := checkCost("actual", actual); err != nil {
		return err
	}
	delta := make(Cost, len(actual))
	for name, v := range actual {
		if d := v - estimated[name]; d != 0 {
			delta[name] = d
		}
	}
	if len(delta) == 0 {
		return nil
	}
	tctx, cancel, _, _ := boundStoreCall(ctx, 0, true, l.cfg.storeTimeout)
	defer cancel()
	if cb, ok := capability[CostBucket](l.bucket); ok {
		return cb.Settle(tctx, key, delta)
	}
	name, n, one := single(delta)
	if !one {
		return invalid("throttle", "actual", fmt.Sprintf("%q", actual.String()), "the bucket keeps one dimension (it is no throttle.CostBucket): settle exactly one, or use a bucket of several dimensions such as bucket.NewBudget")
	}
	if n < 0 {
		if r := l.caps.refunder; r != nil {
			return r.Refund(tctx, key, -n)
		}
		return nil
	}
	// maxWait 0: a bucket that can reserve does not, so the charge is
	// taken now or not at all.
	d, err := l.take(tctx, key, n, 0)
	switch {
	case err != nil:
		return err
	case !d.Granted:
		return fmt.Errorf("%w: a charge of %d %s is not free now and the bucket cannot hold a debt (a budget of package bucket can)", ErrTimeout, n, name)
	}
	return nil
}
