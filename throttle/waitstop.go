package throttle

import (
	"context"
	"fmt"

	"github.com/headway-go/headway/internal/waitstop"
)

// ContextWithWaitStop returns a copy of ctx under which waits for
// permits also end once stop is done, while ctx itself, and the work done
// under it, go on. The waits are those of Acquire, AcquireN and
// AcquireCost, of a concurrency slot ([NewLocalSlots] and the Concurrency of
// package bucket), and of a provider's pause in the Transport of package
// throttle/httpclient; a wait ended so returns an error matching
// context.Canceled that also names stop's cause ([context.Cause], or the
// answer of a Cause() error method, for a stop of a type of its own). Once
// stop is done, a new wait under the returned context ends at once.
//
// The consumer of package consumer gives each handler call such a
// context, stopped when the record's partition is revoked or the consumer
// stops while the call runs (not after it has returned): a handler whose
// client is still waiting for a permit then returns at once with that
// error, and the record goes to the partition's next owner, while calls
// already made finish in their own time. Such an error is final for the
// work under ctx: every later wait under it ends at once, so a handler
// should return it rather than try again. The stop is a value of ctx:
// contexts derived from it keep it, context.WithoutCancel's included.
//
// A nil stop returns ctx.
func ContextWithWaitStop(ctx, stop context.Context) context.Context {
	if stop == nil {
		return ctx
	}
	return waitstop.With(ctx, stop)
}

// waitErr is the error of a wait that ctx ended: ctx's error, and its
// cause when that says more (a stop's, a user's WithCancelCause).
func waitErr(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("throttle: waiting for a permit: %w (%w)", err, cause)
	}
	return fmt.Errorf("throttle: waiting for a permit: %w", err)
}
