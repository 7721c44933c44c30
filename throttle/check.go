package throttle

import (
	"context"
	"fmt"
	"time"
)

// checkTimeout bounds [Limiter.Check] when its context has no deadline.
const checkTimeout = 2 * time.Second

// Check asks the bucket's store whether it answers, cheaply (the Redis
// buckets: one round trip). Call it at start, before serving, and in a
// readiness probe: it is the early signal that the store is unreachable,
// where the first Acquire would only fail by the policy. It returns nil for a bucket with no store to check (one that
// has no Check method, such as [Local]). When the store fails, the error
// wraps its [*BackendError] and says what the [FailurePolicy] does until
// it answers, for example:
//
//	throttle: bucket store check failed; until it answers, FailLocal refuses: this instance has not reached the store since it started, so it does not know its share: ...
//
// A ctx without a deadline gets 2 s (or the store timeout
// of [WithStoreTimeout] if that is longer): a check at start or from a
// probe is one call, where a healthy store on a busy machine may take
// longer than the store timeout that bounds every Acquire, and a check
// that fails there would stop an app that could have run.
// A check that succeeds ends an outage the Limiter saw, as a shared
// decision does, and lets a Redis bucket count this instance among the
// live ones: FailLocal then knows its share should the store fail later.
func (l *Limiter) Check(ctx context.Context) error {
	if l.bad != nil {
		return l.bad
	}
	c := l.caps.checker
	if c == nil {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, max(checkTimeout, l.cfg.storeTimeout))
		defer cancel()
	}
	if err := c.Check(ctx); err != nil {
		return fmt.Errorf("throttle: bucket store check failed; until it answers, %s: %w", l.policyNote(), err)
	}
	if l.outage.end() {
		l.cfg.logger.Info("throttle: bucket store answers again; shared limit resumed", "policy", l.cfg.policy.String())
	}
	return nil
}
