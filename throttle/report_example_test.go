package throttle_test

import (
	"context"
	"fmt"
	"time"

	"github.com/headway-go/headway/throttle"
)

// A provider refused a call with 429 and no Retry-After: the fleet that
// shares the bucket lowers its adaptive rate and paces its grants. The
// rate shows in `headwayctl show` and in package otelmetrics' gauge.
func ExampleLimiter_Report() {
	ctx := context.Background()
	b, err := throttle.NewLocal(50, time.Second)
	if err != nil {
		panic(err)
	}
	lim := throttle.New(b)

	if err := lim.Report(ctx, throttle.Answer{Refused: true}); err != nil {
		fmt.Println("report:", err) // the store that keeps the rate failed
	}
	// A limit the provider advertises below the configured one lowers
	// the ceiling: 1200 per minute is 20 per second.
	if err := lim.Report(ctx, throttle.Answer{Limit: 1200, Window: time.Minute}); err != nil {
		fmt.Println("report:", err)
	}
}
