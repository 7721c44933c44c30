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
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/throttle"
)

func main() {
	os.Exit(command(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// command is main, returning the exit code (see internal/cli).
func command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := cli.New("quickstart", "quickstart serves requests arriving at -rate per second through a limiter of\n-limit per -interval, turning away those whose permit takes longer than -maxwait.")
	fs := cmd.Flags
	rate := fs.Int("rate", 25, "requests arriving per second")
	limit := fs.Int64("limit", 10, "permits per interval")
	interval := fs.Duration("interval", time.Second, "length of the interval")
	workers := fs.Int("workers", 20, "goroutines serving requests")
	maxWait := fs.Duration("maxwait", 300*time.Millisecond, "longest wait for one permit")
	duration := fs.Duration("duration", 3*time.Second, "how long requests arrive")
	validate := func() error {
		switch {
		case *rate < 1 || *rate > 1_000_000:
			return fmt.Errorf("-rate %d: must be from 1 to 1000000", *rate)
		case *workers < 1:
			return fmt.Errorf("-workers %d: must be at least 1", *workers)
		case *duration <= 0:
			return fmt.Errorf("-duration %v: must be positive", *duration)
		case *maxWait < 0:
			return fmt.Errorf("-maxwait %v: must be 0 or positive", *maxWait)
		}
		_, err := throttle.NewLocal(*limit, *interval) // the limiter's own check of -limit and -interval
		return err
	}
	return cmd.Run(ctx, args, stdout, stderr, validate, func(ctx context.Context) error {
		return run(ctx, stdout, *rate, *limit, *interval, *workers, *maxWait, *duration)
	})
}

func run(ctx context.Context, out io.Writer, rate int, limit int64, interval time.Duration, workers int, maxWait, duration time.Duration) error {
	b, err := throttle.NewLocal(limit, interval, throttle.WithLocalBurst(1))
	if err != nil {
		return err
	}
	lim := throttle.New(b)
	fmt.Fprintf(out, "%d requests/s for %v, at most %d per %v let through\n", rate, duration, limit, interval)

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
			case <-ctx.Done(): // SIGINT or SIGTERM: stop arriving, report what was served
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
	fmt.Fprintf(out, "%d requests served in %v (%.1f/s, limit %d per %v); %d turned away after waiting up to %v\n",
		served.Load(), elapsed.Round(time.Millisecond), float64(served.Load())/elapsed.Seconds(),
		limit, interval, turnedAway.Load(), maxWait)
	return nil
}
