package throttle

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// roomy is a bucket that grants every Take, with a period of an hour, and
// counts its calls: the shared store of a leased benchmark, never the
// bottleneck.
type roomy struct{ calls atomic.Int64 }

func (r *roomy) Take(context.Context, string, int64, time.Duration) (Decision, error) {
	r.calls.Add(1)
	return Decision{Granted: true, Limit: 1 << 50, Remaining: 1 << 50, Reset: time.Hour}, nil
}

// BenchmarkLimiterLeasedAcquire measures what a caller pays for a permit
// when its instance holds leased tokens: Limiter.Acquire with leasing,
// the lease full, so that the store is (almost) never asked.
// Target: ≤ 100 ns/op under b.RunParallel. inner-calls/op shows how
// rarely the lease is refilled.
func BenchmarkLimiterLeasedAcquire(b *testing.B) {
	for _, key := range []string{"", "tenant"} {
		b.Run("key="+key, func(b *testing.B) {
			inner := &roomy{}
			l := New(inner, WithLeasing(Leasing{Share: 1}))
			defer l.Close()
			lim := l.Key(key)
			ctx := context.Background()
			for range 1000 { // grow the lease: tokens in hand
				if err := lim.Acquire(ctx, 0); err != nil {
					b.Fatal(err)
				}
			}
			inner.calls.Store(0)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := lim.Acquire(ctx, 0); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(inner.calls.Load())/float64(b.N), "inner-calls/op")
		})
	}
}

// BenchmarkLimiterAcquire measures Limiter.Acquire over a Local bucket with
// room to spare: the Limiter's own cost per permit (the key's state, the
// gate, the pace), for key "" and for a tenant's key.
func BenchmarkLimiterAcquire(b *testing.B) {
	for _, key := range []string{"", "tenant"} {
		b.Run("key="+key, func(b *testing.B) {
			local, err := NewLocal(1<<40, time.Hour)
			if err != nil {
				b.Fatal(err)
			}
			l := New(local)
			defer l.Close()
			lim := l.Key(key)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := lim.Acquire(ctx, 0); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
