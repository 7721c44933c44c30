// Package waitstop carries the wait stops of throttle.ContextWithWaitStop
// down a context, and gives every wait of this module (a permit's, a
// slot's, a provider's pause) the context to wait under.
package waitstop

import (
	"context"
	"fmt"
)

// With returns a copy of ctx that carries stop, as
// throttle.ContextWithWaitStop documents. stop must not be nil.
func With(ctx, stop context.Context) context.Context {
	outer, _ := ctx.Value(key{}).(*stopped)
	return context.WithValue(ctx, key{}, &stopped{stop: stop, outer: outer})
}

// Context returns the context to wait under for a permit, a slot or a
// pause asked for under ctx: ctx itself when no stop was given to it
// (throttle.ContextWithWaitStop), else a context that also ends when a stop does.
// Call cancel once the wait is over. Clients that wait on their own, as
// the Transport of throttle/httpclient waits out a provider's pause, use
// it so that a stop ends their waits too.
func Context(ctx context.Context) (wctx context.Context, cancel context.CancelFunc) {
	ws, _ := ctx.Value(key{}).(*stopped)
	if ws == nil {
		return ctx, func() {}
	}
	wctx, cancelCause := context.WithCancelCause(ctx)
	var unhook []func() bool
	for ; ws != nil; ws = ws.outer {
		stop := ws.stop
		end := func() {
			cancelCause(fmt.Errorf("permit waits stopped: %w", stopCause(stop)))
		}
		if stop.Err() != nil {
			end()
			break
		}
		unhook = append(unhook, context.AfterFunc(stop, end))
	}
	return wctx, func() {
		for _, u := range unhook {
			u()
		}
		cancelCause(nil)
	}
}

// stopCause is why stop ended: its Cause method's answer when it has
// one (a stop of a type of its own), else context.Cause's.
func stopCause(stop context.Context) error {
	if c, ok := stop.(interface{ Cause() error }); ok {
		if err := c.Cause(); err != nil {
			return err
		}
	}
	return context.Cause(stop)
}

type key struct{}

// stopped is a stop passed down a context; outer is the enclosing
// context's.
type stopped struct {
	stop  context.Context
	outer *stopped
}
