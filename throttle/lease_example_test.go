package throttle_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/throttle"
)

// roundTrips counts the calls that reach a bucket.
type roundTrips struct {
	throttle.Bucket
	n atomic.Int64
}

func (r *roundTrips) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	r.n.Add(1)
	return r.Bucket.Take(ctx, key, n, maxWait)
}

// With leasing, each instance's Limiter takes permits from the fleet's
// shared bucket in batches sized by demand and hands them out from memory.
// Here an in-memory bucket stands in for the shared Redis bucket, and a
// wrapper counts the round trips it would cost.
func ExampleWithLeasing() {
	shared, err := throttle.NewLocal(1000, time.Second) // e.g. bucket.NewTokenBucket(rdb, "api", 1000, time.Second)
	if err != nil {
		panic(err)
	}
	counted := &roundTrips{Bucket: shared}
	lim := throttle.New(counted, throttle.WithLeasing(throttle.Leasing{TTL: time.Second}))
	for range 200 {
		if err := lim.Acquire(context.Background(), time.Second); err != nil {
			panic(err)
		}
	}
	fmt.Println("permits: 200")
	fmt.Println("fewer than 20 round trips:", counted.n.Load() < 20)
	// Output:
	// permits: 200
	// fewer than 20 round trips: true
}
