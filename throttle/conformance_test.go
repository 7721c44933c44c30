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

// TestSmoothConformance runs the conformance suite on Smooth over a Local
// of the same rate: the Local's guarantee holds, and Smooth's own for
// takes of one permit (at most 1.5 + limit·t/interval in any span t,
// checked as a burst of 2).
func TestSmoothConformance(t *testing.T) {
	const limit, interval = 10, time.Second
	clock := clockwork.NewFakeClock()
	buckettest.Run(t, buckettest.Spec{
		New: func(t *testing.T) throttle.Bucket {
			inner, err := throttle.NewLocal(limit, interval, throttle.WithClock(clock))
			if err != nil {
				t.Fatal(err)
			}
			b, err := throttle.NewSmooth(inner, limit, interval, throttle.WithClock(clock))
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		Limit:     limit,
		Interval:  interval,
		Guarantee: buckettest.Rate,
		Also:      []buckettest.Guarantee{{Kind: buckettest.Rate, Limit: limit, Period: interval, Burst: 2, OnePermit: true}},
		Clock:     clock,
	})
}
