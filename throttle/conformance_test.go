package throttle_test

import (
	"testing"
	"time"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/buckettest"
	"github.com/jonboulle/clockwork"
)

// TestLocalConformance runs the conformance suite on Local: by default
// (burst = limit), evenly spaced (burst 1), and with a burst above the
// limit.
func TestLocalConformance(t *testing.T) {
	const limit, interval = 10, time.Second
	for _, tc := range []struct {
		name  string
		burst int64
	}{{"default", 0}, {"burst 1", 1}, {"burst above limit", 3 * limit}} {
		t.Run(tc.name, func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			buckettest.Run(t, buckettest.Spec{
				New: func(t *testing.T) throttle.Bucket {
					opts := []throttle.LocalOption{throttle.WithClock(clock)}
					if tc.burst != 0 {
						opts = append(opts, throttle.WithLocalBurst(tc.burst))
					}
					b, err := throttle.NewLocal(limit, interval, opts...)
					if err != nil {
						t.Fatal(err)
					}
					return b
				},
				Limit:     limit,
				Interval:  interval,
				Burst:     tc.burst,
				Guarantee: buckettest.Rate,
				Clock:     clock,
			})
		})
	}
}
