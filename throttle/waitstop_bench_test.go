package throttle

import (
	"context"
	"testing"
	"time"
)

// ownDone is a context of its own type with its own Done channel, as the
// consumer's handler call context is: context.WithCancel under it cannot
// hook into a parent cancelCtx.
type ownDone struct {
	context.Context
	done chan struct{}
}

func (c ownDone) Done() <-chan struct{} { return c.done }

// BenchmarkLimiterAcquireUnderAWaitStop measures Limiter.Acquire of a
// permit granted at once under a context carrying a wait stop
// (ContextWithWaitStop), as a handler's client under the consumer asks:
// what the stop costs a caller that never waits.
func BenchmarkLimiterAcquireUnderAWaitStop(b *testing.B) {
	stop, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
	}{
		{"none", context.Background()},
		{"stop", ContextWithWaitStop(context.Background(), stop)},
		{"stop-own-done", ContextWithWaitStop(ownDone{Context: context.Background(), done: make(chan struct{})}, stop)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			local, err := NewLocal(1<<40, time.Hour)
			if err != nil {
				b.Fatal(err)
			}
			l := New(local)
			defer l.Close()
			lim := l.Key("")
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := lim.Acquire(tc.ctx, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
