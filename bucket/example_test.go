package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
)

func ExampleNewTokenBucket() {
	// A throwaway Redis for the example; in production, your own client:
	// rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"}).
	srv, err := redisenv.Start()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	rdb := srv.Client()

	// Two calls per minute, shared by every instance that uses this key.
	b, err := bucket.NewTokenBucket(rdb, "example-provider", 2, time.Minute)
	if err != nil {
		fmt.Println(err)
		return
	}
	lim := throttle.New(b)
	ctx := context.Background()
	for i := 1; i <= 3; i++ {
		err := lim.Acquire(ctx, 0) // take a permit only if one is free now
		switch {
		case err == nil:
			fmt.Printf("call %d: go ahead\n", i)
		case errors.Is(err, throttle.ErrTimeout):
			fmt.Printf("call %d: no permit until the next period\n", i)
		default:
			fmt.Println(err)
		}
	}

	// What a provider-side handler would put in X-RateLimit headers.
	d, _ := b.Take(ctx, "tenant-a", 1, 0)
	fmt.Printf("tenant-a: granted=%v limit=%d remaining=%d\n", d.Granted, d.Limit, d.Remaining)

	// Output:
	// call 1: go ahead
	// call 2: go ahead
	// call 3: no permit until the next period
	// tenant-a: granted=true limit=2 remaining=1
}

// Check the store once at start (and in a readiness probe): with Redis
// unreachable, the error names the failure policy in force and why it
// refuses, before any Acquire. Once a check has passed, FailLocal knows
// this instance's share, so an outage later grants the share instead.
func Example_checkAtStart() {
	srv, err := redisenv.Start()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	ctx := context.Background()

	up, _ := bucket.NewTokenBucket(srv.Client(), "example-check", 100, time.Second)
	lim := throttle.New(up)
	defer lim.Close()
	fmt.Println("redis up:", lim.Check(ctx))

	// A client of an address where no Redis listens.
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer down.Close()
	b, _ := bucket.NewTokenBucket(down, "example-check", 100, time.Second)
	lim2 := throttle.New(b)
	defer lim2.Close()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := lim2.Check(cctx); err != nil {
		var be *throttle.BackendError
		msg, _, _ := strings.Cut(err.Error(), ": throttle: bucket store check")
		fmt.Println("redis down:", errors.As(err, &be))
		fmt.Println(msg)
	}
	// Output:
	// redis up: <nil>
	// redis down: true
	// throttle: bucket store check failed; until it answers, FailLocal refuses: this instance has not reached the store since it started, so it does not know its share
}

func ExampleNewTiers() {
	srv, err := redisenv.Start()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()

	// Seed 000's tiers: 10 calls per second, and no more than 50 per 10 s.
	b, err := bucket.NewTiers(srv.Client(), "get-product", []throttle.Tier{
		{Limit: 10, Period: time.Second},
		{Limit: 50, Period: 10 * time.Second},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	d, err := b.Take(context.Background(), "org-42", 1, 0)
	fmt.Println(d.Granted, d.Limit, d.Remaining, err)
	// Output: true 10 9 <nil>
}

func ExampleNewConcurrency() {
	srv, err := redisenv.Start()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()

	// At most two calls in flight to the provider, across every instance
	// that shares this Redis and key. A holder that dies gives its slot
	// back within the lease.
	slots, err := bucket.NewConcurrency(srv.Client(), "example-provider", 2, bucket.WithLease(5*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer slots.Close()
	ctx := context.Background()

	first, _ := slots.Hold(ctx, "", 0)
	second, _ := slots.Hold(ctx, "", 0)
	_, err = slots.Hold(ctx, "", 0) // only a slot free now
	fmt.Println("third call:", errors.Is(err, throttle.ErrTimeout))

	// A waiting caller gets the slot as soon as one is given back.
	got := make(chan error, 1)
	go func() {
		release, err := slots.Hold(ctx, "", 10*time.Second)
		if err == nil {
			release()
		}
		got <- err
	}()
	first()
	fmt.Println("waiter:", <-got)
	second()

	// Output:
	// third call: true
	// waiter: <nil>
}
