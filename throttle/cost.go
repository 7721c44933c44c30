package throttle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
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
// as package bucket's Budget. [Limiter.AcquireCost] uses it.
type CostBucket interface {
	// TakeCost takes c from key's dimensions, all or nothing; like
	// [Bucket.Take], it never sleeps and names in Decision.Delay when
	// asking again can succeed. A grant's Decision.Settle corrects it
	// after the call. It returns an error wrapping [ErrInvalid] for a
	// dimension it does not keep or a negative amount, and one wrapping
	// [ErrExceedsLimit] for an amount it can never grant at once.
	TakeCost(ctx context.Context, key string, c Cost, maxWait time.Duration) (Decision, error)
}

// AcquireCost takes the cost c from the Limiter's budget, all dimensions
// together or none, waiting for it at most maxWait as [Limiter.Acquire]
// does: it sleeps, on the Limiter's clock, exactly until the time the
// bucket names (the cost's place, or the end of a pause), never polling,
// and returns an error matching [ErrTimeout] at once when that time is
// beyond the wait. Give an estimate when the real cost is known only after
// the call, and correct it with the grant's [CostGrant.Settle].
//
// The bucket should be a [CostBucket] (package bucket's Budget), found
// with [BucketAs]. Any other bucket keeps one dimension: c must then name
// exactly one with an amount above 0, and AcquireCost is
// [Limiter.AcquireN] of that amount.
//
// AcquireCost is simpler than Acquire: callers of a key do not queue
// behind a refusal, it uses no lease and no adaptive pace, ignores the
// permits a context holds, and reports nothing to the [Observer] but its
// degraded decisions. When the store fails, FailOpen grants and
// FailClosed refuses; FailLocal refuses too (a budget of several
// dimensions has no local share), with an error that says so. Each call
// asks the store itself. A store call that the caller's wait cuts short
// is the wait running out ([ErrTimeout]), not a store failure.
//
// Bad input (an empty Cost, a negative amount, a name the bucket does not
// keep) returns an error matching [ErrInvalid] that names it; a per-call
// key the bucket cannot store, one matching [ErrInvalidKey].
func (l *Limiter) AcquireCost(ctx context.Context, c Cost, maxWait time.Duration) (*CostGrant, error) {
	return l.acquireCost(ctx, "", c, maxWait)
}

// AcquireCost is [Limiter.AcquireCost] for k's key.
func (k Keyed) AcquireCost(ctx context.Context, c Cost, maxWait time.Duration) (*CostGrant, error) {
	if k.l == nil {
		return nil, fmt.Errorf("throttle: zero Keyed: %w: build it with Limiter.Key", ErrInvalid)
	}
	return k.l.acquireCost(ctx, k.key, c, maxWait)
}

// CostGrant is a cost [Limiter.AcquireCost] granted: settle it with
// [CostGrant.Settle] once the call's real cost is known. It remembers the
// key, the cost taken and, for a [CostBucket], the period it was taken
// from. It is safe for concurrent use.
type CostGrant struct {
	l       *Limiter
	key     string
	cost    Cost
	settle  func(ctx context.Context, delta Cost) error // the bucket's Decision.Settle; nil: none
	policy  bool                                        // granted by the failure policy (or a plain bucket's held permits): nothing was charged
	settled atomic.Bool
}

// Settle corrects the grant once the call's real cost is known: it
// charges actual−estimated of each dimension actual names, at once and
// without waiting (a dimension actual does not name is left as
// estimated). Settle a grant once; a second Settle changes nothing and
// returns an error matching [ErrInvalid]. A Settle refused as bad input
// (an error matching [ErrInvalid]) changed nothing and does not count:
// settle again with the corrected cost.
//
// A dimension the call used less of than estimated is given back where
// the grant was counted, while it still counts (bucket.Budget: until an
// interval and the margin after the grant's time), so that an
// over-estimate does not idle the budget. Once it has stopped counting,
// the unused part is given to no later grant (which would then count it
// twice: a call of seconds against a one-minute window often outlasts
// its grant's count). A dimension the call used more of is charged even
// beyond what is left, and later grants wait until it stops counting. A
// charge of more than ten times a dimension's limit is refused by
// bucket.Budget, with an error matching [ErrInvalid], and nothing is
// charged: a real call can cost more than one interval's limit (the
// provider counts it, and so must the budget), but ten limits' worth is a
// caller's mistake (the wrong units).
//
// With a bucket that is not a [CostBucket] (one dimension), a give-back
// goes through the bucket's Refund (nothing happens without one), and
// a charge is taken at once if the bucket has it: a plain bucket cannot
// hold a debt, so a charge it cannot grant now returns an error matching
// [ErrTimeout] and is not taken.
//
// A grant made by the failure policy (FailOpen while the store failed,
// or FailLocal's local share for a bucket of one dimension) charged the
// bucket nothing: its Settle changes nothing and returns nil. So does
// that of a bucket of one dimension served by permits the caller's
// context holds ([ContextWithPermit]), charged by an earlier call.
//
// Settle waits for the store at most the store timeout
// ([WithStoreTimeout]) or ctx's deadline, and returns the store's error
// (a [*BackendError]); it applies no failure policy and does not retry.
func (g *CostGrant) Settle(ctx context.Context, actual Cost) error {
	if g == nil || g.l == nil {
		return fmt.Errorf("throttle: nil CostGrant: %w: settle the grant AcquireCost returned", ErrInvalid)
	}
	if err := checkCost("actual", actual); err != nil {
		return err
	}
	if !g.settled.CompareAndSwap(false, true) {
		return fmt.Errorf("throttle: CostGrant of %v settled twice: %w: settle a grant once", g.cost, ErrInvalid)
	}
	if g.policy {
		return nil
	}
	err := g.l.settleCost(ctx, g, actual)
	if errors.Is(err, ErrInvalid) {
		g.settled.Store(false) // bad input changed nothing: still to settle
	}
	return err
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

func (l *Limiter) acquireCost(ctx context.Context, key string, c Cost, maxWait time.Duration) (*CostGrant, error) {
	if l.bad != nil {
		return nil, l.bad
	}
	if err := checkCost("cost", c); err != nil {
		return nil, err
	}
	g := &CostGrant{l: l, key: key, cost: maps.Clone(c)}
	var total int64
	for _, v := range c {
		total += v
	}
	if total == 0 {
		return nil, invalid("throttle", "cost", fmt.Sprintf("%q", c.String()), "must ask for at least 1 of some dimension")
	}
	if maxWait < 0 {
		return nil, invalid("throttle", "maxWait", maxWait, "must be 0 (no wait), positive, or throttle.Forever")
	}
	cb, ok := BucketAs[CostBucket](l.bucket)
	if !ok {
		_, n, one := single(c)
		if !one {
			return nil, invalid("throttle", "cost", fmt.Sprintf("%q", c.String()), "the bucket keeps one dimension (it is no throttle.CostBucket): name exactly one, or use a bucket of several dimensions such as bucket.NewBudget")
		}
		// acquire leaves from as is on a grant of the failure policy or
		// of held permits: nothing charged, so Settle gives nothing back.
		from := fromPolicy
		if err := l.acquire(ctx, key, n, maxWait, &from); err != nil {
			return nil, err
		}
		g.policy = from == fromPolicy
		return g, nil
	}
	d, src, err := l.wait(ctx, demand{key: key, cost: g.cost, cb: cb}, maxWait)
	if err != nil {
		return nil, err
	}
	g.settle, g.policy = d.Settle, src == fromPolicy
	return g, nil
}

// decideCost is the decision stage of w's wait for a cost: its
// CostBucket's, or, when the store fails, the failure policy's
// (storeFailure).
func (l *Limiter) decideCost(w *waiter) decision {
	var c decision
	cut, err := w.callStore(func(ctx context.Context, ahead time.Duration) error {
		var err error
		c.Decision, err = w.cb.TakeCost(ctx, w.key, w.cost, ahead)
		return err
	})
	c.answered = l.tb.now() // a cost's time and margin count from it, as a permit's do
	if err != nil {
		w.storeFailure(&c, nil, cut, false, err)
	}
	return c
}

func (l *Limiter) settleCost(ctx context.Context, g *CostGrant, actual Cost) error {
	if l.bad != nil {
		return l.bad
	}
	delta := make(Cost, len(actual))
	back := false
	for name, v := range actual {
		if d := v - g.cost[name]; d != 0 {
			delta[name] = d
			back = back || d < 0
		}
	}
	if len(delta) == 0 {
		return nil
	}
	if back {
		// Permits of the key go back to the bucket: its next place may
		// come sooner (place.go).
		st := l.state(g.key)
		defer l.release(st)
		defer st.givingBack()()
	}
	// Bounded as the store calls of a wait of none are.
	w := l.newWaiter(ctx, demand{key: g.key}, 0, 0)
	tctx, cancel, _, _ := w.storeCall(w.left())
	defer cancel()
	if _, ok := BucketAs[CostBucket](l.bucket); ok {
		if g.settle == nil {
			return fmt.Errorf("throttle: settle cost %v: the bucket's grant has no Decision.Settle: %w", delta, ErrInvalid)
		}
		return g.settle(tctx, delta)
	}
	name, n, one := single(delta)
	if !one {
		return invalid("throttle", "actual", fmt.Sprintf("%q", actual.String()), "the bucket keeps one dimension (it is no throttle.CostBucket): settle exactly one, or use a bucket of several dimensions such as bucket.NewBudget")
	}
	if n < 0 {
		if r := l.caps.refunder; r != nil {
			return r.Refund(tctx, g.key, -n)
		}
		return nil
	}
	// maxWait 0: a bucket that can reserve does not, so the charge is
	// taken now or not at all.
	d, err := l.take(tctx, g.key, n, 0)
	switch {
	case err != nil:
		return err
	case !d.Granted:
		return fmt.Errorf("%w: a charge of %d %s is not free now and the bucket cannot hold a debt (a budget of package bucket can)", ErrTimeout, n, name)
	}
	return nil
}
