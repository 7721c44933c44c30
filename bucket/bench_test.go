package bucket

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
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
				if bk, err = NewSlidingLog(rdb, "bench-"+name, []throttle.Tier{{Limit: limit, Period: time.Second}}); err != nil {
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

// BenchmarkLimiterAcquire compares the buckets under load: 64 goroutines
// (32 per CPU on 2 CPUs) acquiring through a Limiter with a limit never
// reached, each bucket with concurrent takes coalesced (the default) and
// without (each Take its own round trip). grants/s and cmds/grant are per
// granted Acquire. Run: go test -run X -bench LimiterAcquire ./bucket/
func BenchmarkLimiterAcquire(b *testing.B) {
	srv := redisenv.New(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 72, ContextTimeoutEnabled: true})
	defer rdb.Close()
	hook := &countingHook{}
	rdb.AddHook(hook)
	const limit, iv = 1 << 30, time.Hour
	for _, name := range []string{"TokenBucket", "GCRA", "SlidingLog", "FixedWindow", "Tiers", "Counter"} {
		for _, mode := range []string{"coalesced", "single"} {
			b.Run(name+"/"+mode, func(b *testing.B) {
				key := "acq-" + name + "-" + mode
				bk := allBuckets(b, rdb, key, limit, iv)[name]
				switch x := bk.(type) {
				case *Counter:
					if err := scriptCounterReset.Run(context.Background(), rdb, []string{x.ks.root + ":ctr"}, iv.Milliseconds()).Err(); err != nil {
						b.Fatal(err)
					}
				case *SlidingLog:
					var err error
					if bk, err = NewSlidingLog(rdb, key, []throttle.Tier{{Limit: limit, Period: time.Second}}); err != nil {
						b.Fatal(err)
					}
				}
				if mode == "single" {
					commonOf(bk).co = nil
				}
				lim := throttle.New(bk)
				ctx := context.Background()
				hook.n.Store(0)
				b.SetParallelism(32)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := lim.Acquire(ctx, time.Second); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "grants/s")
				b.ReportMetric(float64(hook.n.Load())/float64(b.N), "cmds/grant")
			})
		}
	}
}

// BenchmarkFirstTake is sparse multi-tenant traffic: every Acquire is the
// first of a new tenant (its period is over, or never began), so for a
// TokenBucket every take is a refill. 64 goroutines through one Limiter's
// Key views. first-takes/s is the rate; bytes/tenant the growth of Redis's
// used_memory per tenant. The load is 100,000 tenants:
//
//	go test -run X -bench FirstTake -benchtime 100000x ./bucket/
func BenchmarkFirstTake(b *testing.B) {
	srv := redisenv.New(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 72, ContextTimeoutEnabled: true})
	defer rdb.Close()
	ctx := context.Background()
	for _, name := range []string{"TokenBucket", "GCRA", "FixedWindow"} {
		b.Run(name, func(b *testing.B) {
			if err := rdb.FlushAll(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			bk := allBuckets(b, rdb, "tenants-"+name, 10, time.Minute)[name]
			lim := throttle.New(bk)
			if err := lim.Key("warm").Acquire(ctx, 0); err != nil { // loads the script
				b.Fatal(err)
			}
			before := usedMemory(b, rdb)
			var next atomic.Int64
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var buf [20]byte
				for pb.Next() {
					key := strconv.AppendInt(buf[:0], next.Add(1), 36)
					if err := lim.Key(string(key)).Acquire(ctx, time.Second); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "first-takes/s")
			if b.N >= 1000 {
				b.ReportMetric(float64(usedMemory(b, rdb)-before)/float64(b.N), "bytes/tenant")
			}
		})
	}
}

// usedMemory is Redis's used_memory.
func usedMemory(b *testing.B, rdb *redis.Client) int64 {
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for l := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("no used_memory in INFO memory")
	return 0
}

// commonOf is the common part of one of package bucket's buckets.
func commonOf(bk throttle.Bucket) *common {
	switch x := bk.(type) {
	case *TokenBucket:
		return &x.common
	case *GCRA:
		return &x.common
	case *SlidingLog:
		return &x.common
	case *FixedWindow:
		return &x.windows.common
	case *Tiers:
		return &x.windows.common
	case *Counter:
		return &x.common
	}
	panic(fmt.Sprintf("no common in %T", bk))
}
