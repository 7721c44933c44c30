package bucket

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// BenchmarkTake measures each bucket on a single node with a limit no
// benchmark reaches, so every Take is a grant: ns/op is ns per grant, and
// cmds/grant counts the Redis commands sent per grant (a go-redis hook;
// one script run is one command, one round trip). 16 goroutines on 2
// CPUs share the client's pool.
func BenchmarkTake(b *testing.B) {
	srv := redisenv.New(b)
	rdb := srv.Client()
	hook := &countingHook{}
	rdb.AddHook(hook)
	ctx := context.Background()
	const limit, iv = 1 << 30, time.Hour
	for _, name := range []string{"TokenBucket", "GCRA", "FixedWindow", "SlidingLog", "Tiers", "Counter"} {
		b.Run(name, func(b *testing.B) {
			bk := allBuckets(b, rdb, "bench-"+name, limit, iv)[name]
			if c, ok := bk.(*Counter); ok {
				if err := scriptCounterReset.Run(ctx, rdb, []string{c.ks.root + ":ctr"}, iv.Milliseconds()).Err(); err != nil {
					b.Fatal(err)
				}
			}
			if name == "SlidingLog" {
				// Keep the log small: a 1 s window, limit far above
				// what a second of benchmarking grants.
				var err error
				if bk, err = NewSlidingLog(rdb, "bench-"+name, []Tier{{limit, time.Second}}); err != nil {
					b.Fatal(err)
				}
			}
			var denied atomic.Int64
			hook.n.Store(0)
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					d, err := bk.Take(ctx, "", 1, 0)
					if err != nil {
						b.Error(err)
						return
					}
					if !d.Granted {
						denied.Add(1)
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(hook.n.Load())/float64(b.N), "cmds/grant")
			if n := denied.Load(); n > 0 {
				b.Errorf("%d of %d denied; the benchmark measures grants", n, b.N)
			}
		})
	}
}

// BenchmarkLimiterTokenBucket is the steady state users see: a Limiter on
// a TokenBucket with room.
func BenchmarkLimiterTokenBucket(b *testing.B) {
	srv := redisenv.New(b)
	rdb := srv.Client()
	hook := &countingHook{}
	rdb.AddHook(hook)
	bk, err := NewTokenBucket(rdb, "bench-limiter", 1<<40, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	lim := throttle.New(bk)
	ctx := context.Background()
	hook.n.Store(0)
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := lim.Acquire(ctx, time.Second); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(hook.n.Load())/float64(b.N), "cmds/grant")
}
