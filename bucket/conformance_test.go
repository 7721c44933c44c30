package bucket

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/buckettest"
	"github.com/redis/go-redis/v9"
)

// conformanceKeys numbers the buckets the conformance tests build, so
// that each starts on a budget nobody has touched.
var conformanceKeys atomic.Int64

// conformanceSpecs returns a Spec for each bucket of the package, built
// on two clients from client: the two values of a pair talk to Redis as
// two instances would. Intervals are short: the suite's real-time checks
// wait a few of them.
func conformanceSpecs(client func() redis.UniversalClient) map[string]buckettest.Spec {
	const ms100, ms200, ms300 = 100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond
	shared, other := client(), client()
	// spec fills in what every bucket of the package shares, from build,
	// which makes one value under a bucket key on a client.
	spec := func(build func(rdb redis.UniversalClient, key string) (throttle.Bucket, error)) buckettest.Spec {
		mk := func(t *testing.T, rdb redis.UniversalClient, key string) throttle.Bucket {
			t.Helper()
			b, err := build(rdb, key)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		return buckettest.Spec{
			New: func(t *testing.T) throttle.Bucket {
				return mk(t, shared, fmt.Sprintf("conf-%d", conformanceKeys.Add(1)))
			},
			NewPair: func(t *testing.T) (throttle.Bucket, throttle.Bucket) {
				key := fmt.Sprintf("conf-%d", conformanceKeys.Add(1))
				return mk(t, shared, key), mk(t, other, key)
			},
			MaxKeyLen: MaxKeyLen,
			Remote:    true,
		}
	}
	tiers := []throttle.Tier{{Limit: 10, Period: ms100}, {Limit: 20, Period: ms300}}
	also := func(kind buckettest.Kind) []buckettest.Guarantee {
		return []buckettest.Guarantee{{Kind: kind, Limit: tiers[1].Limit, Period: tiers[1].Period}}
	}

	tb := spec(func(rdb redis.UniversalClient, key string) (throttle.Bucket, error) {
		return NewTokenBucket(rdb, key, 10, ms200)
	})
	// Besides at most the limit per period, at most the limit in any
	// span of one interval (the straddle of two periods included).
	tb.Limit, tb.Interval, tb.Guarantee = 10, ms200, buckettest.PerPeriod
	tb.Also = []buckettest.Guarantee{{Kind: buckettest.SlidingWindow, Limit: 10, Period: ms200}}

	fw := spec(func(rdb redis.UniversalClient, key string) (throttle.Bucket, error) {
		return NewFixedWindow(rdb, key, 10, ms100)
	})
	fw.Limit, fw.Interval, fw.Guarantee = 10, ms100, buckettest.AlignedWindow

	ctr := spec(func(rdb redis.UniversalClient, key string) (throttle.Bucket, error) {
		return NewCounter(rdb, key, 10, ms200)
	})
	ctr.Limit, ctr.Interval, ctr.Guarantee = 10, ms200, buckettest.PerReset
	ctr.PrepareKey = runResetter

	sl := spec(func(rdb redis.UniversalClient, key string) (throttle.Bucket, error) {
		return NewSlidingLog(rdb, key, tiers)
	})
	sl.Limit, sl.Interval, sl.Guarantee, sl.Also = 10, ms100, buckettest.SlidingWindow, also(buckettest.SlidingWindow)

	gcra := spec(func(rdb redis.UniversalClient, key string) (throttle.Bucket, error) {
		return NewGCRA(rdb, key, 10, ms100, WithBurst(4))
	})
	gcra.Limit, gcra.Interval, gcra.Burst, gcra.Guarantee = 10, ms100, 4, buckettest.Rate

	// A burst above the limit: Remaining must still not exceed Limit.
	gcraBurst := spec(func(rdb redis.UniversalClient, key string) (throttle.Bucket, error) {
		return NewGCRA(rdb, key, 10, ms100, WithBurst(15))
	})
	gcraBurst.Limit, gcraBurst.Interval, gcraBurst.Burst, gcraBurst.Guarantee = 10, ms100, 15, buckettest.Rate

	ti := spec(func(rdb redis.UniversalClient, key string) (throttle.Bucket, error) {
		return NewTiers(rdb, key, tiers)
	})
	ti.Limit, ti.Interval, ti.Guarantee, ti.Also = 10, ms100, buckettest.AlignedWindow, also(buckettest.AlignedWindow)

	// A Budget through its plain Bucket face: Take charges its
	// "requests"; the tokens are a second dimension no Take names. As a
	// TokenBucket's, its places are at most the limit in any span of one
	// interval (and its margin).
	bud := spec(func(rdb redis.UniversalClient, key string) (throttle.Bucket, error) {
		return NewBudget(rdb, key, []Dimension{{Name: "requests", Limit: 10, Interval: ms200}, {Name: "tokens", Limit: 1000, Interval: ms200}})
	})
	bud.Limit, bud.Interval, bud.Guarantee, bud.CostDimension = 10, ms200, buckettest.PerPeriod, "requests"
	bud.Also = []buckettest.Guarantee{{Kind: buckettest.SlidingWindow, Limit: 10, Period: ms200}}

	return map[string]buckettest.Spec{
		"Budget": bud, "TokenBucket": tb, "FixedWindow": fw, "Counter": ctr, "SlidingLog": sl, "GCRA": gcra, "GCRA burst above limit": gcraBurst, "Tiers": ti,
	}
}

// runResetter is a Counter's Spec.PrepareKey: it resets key's counter
// once (a Counter grants nothing before its first reset), and runs a
// Resetter for it until the test ends.
func runResetter(t *testing.T, b throttle.Bucket, key string) {
	t.Helper()
	c := b.(*Counter)
	tag, err := c.ks.tag(c.name, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := scriptCounterReset.Run(context.Background(), c.rdb, []string{tag + ":ctr"}, c.periodMs).Err(); err != nil {
		t.Fatalf("first reset of key %q: %v", key, err)
	}
	r, err := c.NewResetter(key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// TestConformance runs the conformance suite of package
// throttle/buckettest on every bucket, on one Redis server.
func TestConformance(t *testing.T) {
	t.Parallel()
	srv := redisenv.New(t)
	for name, spec := range conformanceSpecs(func() redis.UniversalClient { return srv.Client() }) {
		t.Run(name, func(t *testing.T) { buckettest.Run(t, spec) })
	}
}

// TestConformanceCluster runs the conformance suite on a TokenBucket and
// a Budget over a three-master Redis Cluster: every key of a budget in
// one slot, tenants spread over the masters, tricky keys routed by their
// own hash tag.
func TestConformanceCluster(t *testing.T) {
	t.Parallel()
	cl := redisenv.NewCluster(t)
	specs := conformanceSpecs(func() redis.UniversalClient { return cl.Client() })
	for _, name := range []string{"TokenBucket", "Budget"} {
		t.Run(name, func(t *testing.T) { buckettest.Run(t, specs[name]) })
	}
}
