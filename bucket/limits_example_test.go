package bucket_test

import (
	"context"
	"fmt"
	"time"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/redisenv"
)

// An operator raises a limit while the fleet runs (headwayctl set-limit
// does the same from a shell). A token bucket's running period keeps its
// limit; every instance refills with the new one at the next period.
func ExampleTokenBucket_SetLimit() {
	srv, err := redisenv.Start()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	ctx := context.Background()

	// Built the same way by every instance of the fleet: 100 per minute.
	b, err := bucket.NewTokenBucket(srv.Client(), "example-live", 100, time.Minute)
	if err != nil {
		fmt.Println(err)
		return
	}
	d, _ := b.Take(ctx, "", 1, 0)
	fmt.Println("granted:", d.Granted, "limit:", d.Limit, "remaining:", d.Remaining)

	if err := b.SetLimit(ctx, "", 300); err != nil {
		fmt.Println(err)
		return
	}
	st, err := b.State(ctx, "")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("configured: %d (live: %v, default %d)\n", st.Limit, st.Live, st.Default)
	fmt.Printf("now: limit %d, %d counting, %d left\n", st.Current, st.Used, st.Remaining)
	fmt.Println("instances:", st.Instances)

	if err := b.SetLimit(ctx, "", 0); err != nil {
		fmt.Println(err)
	}
	// Output:
	// granted: true limit: 100 remaining: 99
	// configured: 300 (live: true, default 100)
	// now: limit 300, 1 counting, 299 left
	// instances: 1
	// bucket: TokenBucket.SetLimit: limit = 0: invalid argument: must be at least 1
}
