// Command quickstart shows headway's Acquire on its own, in one process,
// with nothing to install: requests arrive at -rate per second, twenty
// workers serve them, and a limiter lets at most -limit calls per -interval
// through to a pretend provider. A request whose permit does not come
// within -maxwait is turned away, as an HTTP handler with a latency budget
// would.
//
//	go run ./examples/quickstart -rate 25 -limit 10 -interval 1s -duration 3s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/throttle"
)

func main() {
	rate := flag.Int("rate", 25, "requests arriving per second")
	limit := flag.Int64("limit", 10, "permits per interval")
	interval := flag.Duration("interval", time.Second, "length of the interval")
	workers := flag.Int("workers", 20, "goroutines serving requests")
	maxWait := flag.Duration("maxwait", 300*time.Millisecond, "longest wait for one permit")
	duration := flag.Duration("duration", 3*time.Second, "how long requests arrive")
	flag.Parse()

	if err := run(*rate, *limit, *interval, *workers, *maxWait, *duration); err != nil {
		slog.Error("quickstart", "err", err)
		os.Exit(1)
	}
}

func run(rate int, limit int64, interval time.Duration, workers int, maxWait, duration time.Duration) error {
	if rate < 1 || workers < 1 {
		return fmt.Errorf("quickstart: -rate and -workers must be at least 1")
	}
	b, err := throttle.NewLocal(limit, interval, throttle.WithBurst(1))
	if err != nil {
		return err
	}
	lim := throttle.New(b)

	requests := make(chan struct{}, workers)
	go func() {
		defer close(requests)
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		end := time.After(duration)
		for {
			select {
			case <-tick.C:
				requests <- struct{}{}
			case <-end:
				return
			}
		}
	}()

	start := time.Now()
	var served, turnedAway atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range requests {
				err := lim.Acquire(context.Background(), maxWait)
				switch {
				case err == nil:
					served.Add(1) // call the provider here
				case errors.Is(err, throttle.ErrTimeout):
					turnedAway.Add(1) // answer 503, or retry later
				default:
					slog.Error("acquire", "err", err)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	fmt.Printf("%d requests served in %v (%.1f/s, limit %d per %v); %d turned away after waiting up to %v\n",
		served.Load(), elapsed.Round(time.Millisecond), float64(served.Load())/elapsed.Seconds(),
		limit, interval, turnedAway.Load(), maxWait)
	return nil
}
