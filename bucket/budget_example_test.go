package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// An LLM API limits requests and tokens per minute, and a call's tokens
// are known only after it: acquire an estimate, then settle the real use.
func ExampleNewBudget() {
	// A throwaway Redis for the example; in production, your own client.
	srv, err := redisenv.Start()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()

	b, err := bucket.NewBudget(srv.Client(), "llm-provider", []bucket.Dimension{
		{Name: "requests", Limit: 500, Interval: time.Minute},
		{Name: "tokens", Limit: 30_000, Interval: time.Minute},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	lim := throttle.New(b)
	defer lim.Close()
	ctx := context.Background()

	call := func(estimate, used int64) {
		est := throttle.Cost{"requests": 1, "tokens": estimate}
		// Both dimensions must admit the estimate, or nothing is taken.
		g, err := lim.AcquireCost(ctx, est, 0)
		if errors.Is(err, throttle.ErrTimeout) {
			fmt.Printf("estimated %d tokens: not before the next refill\n", estimate)
			return
		} else if err != nil {
			fmt.Println(err)
			return
		}
		// ... call the provider; its answer says how many tokens it used ...
		if err := g.Settle(ctx, throttle.Cost{"requests": 1, "tokens": used}); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("estimated %d tokens, used %d\n", estimate, used)
	}
	call(20_000, 4_000)  // over-estimated: 16,000 given back
	call(20_000, 25_000) // room again thanks to the give-back; 5,000 more charged
	call(2_000, 2_000)   // 29,000 used this minute: refused until the refill

	// Output:
	// estimated 20000 tokens, used 4000
	// estimated 20000 tokens, used 25000
	// estimated 2000 tokens: not before the next refill
}
