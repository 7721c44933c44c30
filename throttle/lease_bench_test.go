package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// plenty is a bucket that grants everything, with a period of an hour.
type plenty struct{}

func (plenty) Take(context.Context, string, int64, time.Duration) (Decision, error) {
	return Decision{Granted: true, Limit: 1 << 50, Remaining: 1 << 50, Reset: time.Hour}, nil
}

// BenchmarkLeasedFastPath measures a take served from a lease that holds
// permits: no lock, no call. Target: ≤ 100 ns/op.
func BenchmarkLeasedFastPath(b *testing.B) {
	for _, key := range []string{"", "tenant"} {
		b.Run("key="+key, func(b *testing.B) {
			l, err := NewLeased(plenty{}, WithLeaseShare(1), withoutLeaseSweeper())
			require.NoError(b, err)
			defer l.Close()
			ctx := context.Background()
			for range 1000 { // grow the lease: tokens in hand
				_, _ = l.Take(ctx, key, 1, 0)
			}
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if d, _ := l.Take(ctx, key, 1, 0); !d.Granted {
						b.Fatal("not granted")
					}
				}
			})
		})
	}
}

// BenchmarkLeasedOverLocal measures grants per second through a Leased
// over an in-memory bucket with room to spare, and the inner calls each
// grant costs.
func BenchmarkLeasedOverLocal(b *testing.B) {
	local, err := NewLocal(1<<40, time.Hour)
	require.NoError(b, err)
	inner := &counting{Bucket: local}
	l, err := NewLeased(inner, WithLeaseTTL(50*time.Millisecond))
	require.NoError(b, err)
	defer l.Close()
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if d, _ := l.Take(ctx, "", 1, 0); !d.Granted {
				b.Fatal("not granted")
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "grants/s")
	b.ReportMetric(float64(inner.calls.Load())/float64(b.N), "inner-calls/grant")
}

// BenchmarkLeasedBaselineLocal is the same load on the Local bucket alone, for
// comparison.
func BenchmarkLeasedBaselineLocal(b *testing.B) {
	local, err := NewLocal(1<<40, time.Hour)
	require.NoError(b, err)
	ctx := context.Background()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, _ = local.Take(ctx, "", 1, 0)
		}
	})
}
