package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/headway-go/headway/throttle"
)

// Acquire before each call to the provider. Here an in-memory bucket
// allows 3 calls per second: the first three go at once and the fourth,
// which may not wait, is refused.
func ExampleLimiter_Acquire() {
	b, err := throttle.NewLocal(3, time.Second)
	if err != nil {
		panic(err)
	}
	lim := throttle.New(b)
	for i := 1; i <= 4; i++ {
		err := lim.Acquire(context.Background(), 0)
		switch {
		case err == nil:
			fmt.Println("call", i, "goes ahead")
		case errors.Is(err, throttle.ErrTimeout):
			fmt.Println("call", i, "must wait:", "throttled")
		}
	}
	// Output:
	// call 1 goes ahead
	// call 2 goes ahead
	// call 3 goes ahead
	// call 4 must wait: throttled
}

// Key gives each tenant its own budget in one bucket, with no limiter to
// build or cache per tenant.
func ExampleLimiter_Key() {
	b, _ := throttle.NewLocal(1, time.Minute)
	lim := throttle.New(b)
	ctx := context.Background()
	fmt.Println("acme:", lim.Key("acme").Acquire(ctx, 0) == nil)
	fmt.Println("acme again:", lim.Key("acme").Acquire(ctx, 0) == nil)
	fmt.Println("globex:", lim.Key("globex").Acquire(ctx, 0) == nil)
	// Output:
	// acme: true
	// acme again: false
	// globex: true
}
