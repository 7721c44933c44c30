package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/headway-go/headway/throttle"
)

// printAdaptive prints the line of `show` about the fleet's adaptive
// rate: the rate the fleet paces its grants at since the provider refused
// calls without a retry hint, or that it is not adapting.
func printAdaptive(ctx context.Context, w io.Writer, b live, t target) error {
	// A swap from a version below 0 only reads.
	s, _, err := b.SwapAdaptive(ctx, t.tenant, throttle.AdaptiveState{Version: -1}, throttle.AdaptiveState{}, time.Millisecond)
	if err != nil {
		return err
	}
	if !s.Active() {
		_, err = fmt.Fprintf(w, "adaptive   off: grants are not paced (no refusal without a retry hint remembered)\n")
		return err
	}
	ago := func(at time.Time) string {
		if at.IsZero() {
			return "never"
		}
		return s.At.Sub(at).Round(time.Millisecond).String() + " ago"
	}
	ceiling := "the configured limit"
	if s.Ceiling > 0 {
		ceiling = fmt.Sprintf("the configured limit or %.4g advertised, the lower", s.Ceiling)
	}
	_, err = fmt.Fprintf(w, "adaptive   %.4g per interval, paced evenly (ceiling %s, last refused at %.4g); decreased %s, increased %s\n",
		s.Rate, ceiling, s.Peak, ago(s.Decreased), ago(s.Increased))
	return err
}
