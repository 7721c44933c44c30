package throttle

import (
	"context"
	"fmt"
)

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
// A ctx without a deadline gets the store timeout ([WithStoreTimeout]).
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
	if _, ok := ctx.Deadline(); !ok && l.cfg.storeTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.cfg.storeTimeout)
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
