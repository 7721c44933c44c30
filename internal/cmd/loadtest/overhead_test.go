package main

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/guarantee"
	"github.com/headway-go/headway/throttle"
)

// free is a bucket that grants everything at once, without a store: what
// is left of a grant's cost is the Limiter's and the harness's.
type free struct{}

func (free) Take(context.Context, string, int64, time.Duration) (throttle.Decision, error) {
	return throttle.Decision{Granted: true, Limit: math.MaxInt64, Remaining: -1}, nil
}

// BenchmarkHarnessOverhead measures what the loadtest's own bookkeeping
// costs per grant (clock reads, the grant-time recorder, the latency
// slices, the shared counters): 64 goroutines on a bucket that costs
// nothing, once through the loadtest's worker loop and once through a bare
// Acquire loop. The difference is the harness's overhead per grant; any
// grants/s the loadtest reports is bounded by 1 / (that + the limiter's
// own cost).
//
//	go test -run X -bench HarnessOverhead ./internal/cmd/loadtest/
func BenchmarkHarnessOverhead(b *testing.B) {
	const goroutines = 64
	for _, mode := range []string{"bare", "worker"} {
		b.Run(mode, func(b *testing.B) {
			lim := throttle.New(timedBucket{free{}})
			per := max(b.N/goroutines, 1)
			// One recorder and one tally for all, as in a run.
			c := loadConfig{MaxWait: time.Second, MaxGrants: per * goroutines}
			in := &instance{lim: lim}
			rec, t := &guarantee.Recorder{}, &tally{}
			run, stop := context.WithCancel(context.Background())
			defer stop()
			var wg sync.WaitGroup
			b.ResetTimer()
			for range goroutines {
				wg.Go(func() {
					if mode == "bare" {
						ctx := context.Background()
						for range per {
							if err := lim.Acquire(ctx, time.Second); err != nil {
								b.Error(err)
								return
							}
						}
						return
					}
					worker(run, stop, c, in, nil, rec, t)
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(per*goroutines)/b.Elapsed().Seconds(), "grants/s")
		})
	}
}
