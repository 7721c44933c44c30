package throttle_test

import (
	"context"
	"fmt"
	"time"

	"github.com/headway-go/headway/internal/capability"
	"github.com/headway-go/headway/throttle"
)

// A provider refused a call with 429 and no Retry-After: the fleet that
// shares the bucket lowers its adaptive rate and paces its grants.
func ExampleLimiter_Report() {
	ctx := context.Background()
	b, err := throttle.NewLocal(50, time.Second)
	if err != nil {
		panic(err)
	}
	lim := throttle.New(b)

	_ = lim.Report(ctx, throttle.Answer{Refused: true})
	s, _ := capability.KeyedLimiter(lim.Key("")).AdaptiveState(ctx)
	fmt.Printf("paced at %.0f per interval\n", s.Rate)

	// A limit the provider advertises below the configured one lowers
	// the ceiling: 1200 per minute is 20 per second.
	_ = lim.Report(ctx, throttle.Answer{Limit: 1200, Window: time.Minute})
	s, _ = capability.KeyedLimiter(lim.Key("")).AdaptiveState(ctx)
	fmt.Printf("paced at %.0f per interval (advertised ceiling %.0f)\n", s.Rate, s.Ceiling)
	// Output:
	// paced at 45 per interval
	// paced at 20 per interval (advertised ceiling 20)
}
