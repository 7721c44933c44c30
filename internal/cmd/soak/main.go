// Command soak runs a Limiter over a Redis bucket with many keys and many
// goroutines for a while and checks that nothing grows: the process's live
// heap and goroutines, and Redis's memory and key count (every key a bucket
// writes expires).
//
//	go run ./internal/cmd/soak                       # 60 s, 1,000 keys, 100 workers, token bucket
//	go run ./internal/cmd/soak -bucket gcra -duration 5m
//	go run ./internal/cmd/soak -redis 127.0.0.1:6379 # an existing Redis (its other keys count too)
//	go run ./internal/cmd/soak -churn 1000000 -adaptive -outage-at 30s -outage-for 5s # tenants come and go
//
// Without -redis it starts a throwaway redis-server (internal/redisenv).
// Every -sample it prints the live heap (after a GC), the goroutines (and
// of them the library's own), Redis's used_memory and DBSIZE. At the end it compares the mean of the
// last third of the samples with the mean of the first third and exits 1 if
// any figure grew beyond its threshold:
//
//	heap and used_memory: +25 % and +2 MiB (with -churn: the heap's last
//	                      third against its middle one, after the ramp;
//	                      Redis's figures follow the churn's rate, unchecked)
//	DBSIZE:               +25 % and +100 keys
//	goroutines:           +18 + workers, not counting the library's own
//	                      (go-redis dials a connection on a goroutine)
//
// It also exits 1 if the library ran more goroutines of its own at a sample
// than its documented caps (8 background tasks and 64 give-backs per
// Limiter), if the goroutines are not back to their level before the load
// (±2) within 2 s after it, or if any Acquire failed with an error (a
// timeout is not an error).
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/headway-go/headway/internal/cli"
)

func main() {
	os.Exit(command(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// command is main, returning the exit code (see internal/cli): 1 when
// something grew (heap, goroutines, Redis keys or memory) or an Acquire
// failed.
func command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := cli.New("soak", "soak runs a steady load on many limiter keys for -duration, sampling heap,\ngoroutines and Redis keys and memory, and fails if any of them grows.")
	fs := cmd.Flags
	cfg := defaultConfig()
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long the load runs")
	fs.IntVar(&cfg.Keys, "keys", cfg.Keys, "distinct limiter keys (tenants)")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "goroutines calling Acquire")
	fs.StringVar(&cfg.Bucket, "bucket", cfg.Bucket, "bucket: "+bucketNames())
	fs.StringVar(&cfg.Redis, "redis", "", "Redis address; empty starts a redis-server")
	fs.Int64Var(&cfg.Limit, "limit", cfg.Limit, "permits per key per -period")
	fs.DurationVar(&cfg.Period, "period", cfg.Period, "the bucket's interval (keys expire about this long after their last use)")
	fs.DurationVar(&cfg.MaxWait, "maxwait", cfg.MaxWait, "each Acquire's maxWait")
	fs.DurationVar(&cfg.Sample, "sample", cfg.Sample, "time between samples")
	fs.IntVar(&cfg.Churn, "churn", 0, "distinct keys over the run, each used for 2 Acquires in turn (0: -keys, chosen at random)")
	fs.BoolVar(&cfg.Adaptive, "adaptive", false, "report a refusal without a retry hint after one grant in 100: keys adapt")
	fs.DurationVar(&cfg.OutageAt, "outage-at", 0, "pause the soak's redis-server (SIGSTOP) this long into the load")
	fs.DurationVar(&cfg.OutageFor, "outage-for", 0, "for this long (0: no outage)")
	return cmd.Run(ctx, args, stdout, stderr, func() error { return cfg.check() }, func(ctx context.Context) error {
		rep, err := run(ctx, cfg, stdout)
		if err != nil {
			return err
		}
		if bad := rep.Failures(); len(bad) > 0 {
			for _, b := range bad {
				fmt.Fprintln(stdout, "FAIL:", b)
			}
			return cli.Failedf("the soak failed: %d figures grew or failed", len(bad))
		}
		fmt.Fprintln(stdout, "PASS: flat")
		return nil
	})
}

// printf writes to w, ignoring errors (it is a report to a terminal).
func printf(w io.Writer, format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
