// Command soak runs a Limiter over a Redis bucket with many keys and many
// goroutines for a while and checks that nothing grows: the process's live
// heap and goroutines, and Redis's memory and key count (every key a bucket
// writes expires).
//
//	go run ./examples/soak                       # 60 s, 1,000 keys, 100 workers, token bucket
//	go run ./examples/soak -bucket gcra -duration 5m
//	go run ./examples/soak -redis 127.0.0.1:6379 # an existing Redis (its other keys count too)
//
// Without -redis it starts a throwaway redis-server (internal/redisenv).
// Every -sample it prints the live heap (after a GC), the goroutines,
// Redis's used_memory and DBSIZE. At the end it compares the mean of the
// last third of the samples with the mean of the first third and exits 1 if
// any figure grew beyond its threshold:
//
//	heap and used_memory: +25 % and +2 MiB
//	DBSIZE:               +25 % and +100 keys
//	goroutines:           +10 + workers/4 (helpers of in-flight refills)
//
// It also exits 1 if the goroutines are not back to their level before the
// load (±2) within 2 s after it, or if any Acquire failed with an error (a
// timeout is not an error).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
)

func main() {
	cfg := defaultConfig()
	flag.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long the load runs")
	flag.IntVar(&cfg.Keys, "keys", cfg.Keys, "distinct limiter keys (tenants)")
	flag.IntVar(&cfg.Workers, "workers", cfg.Workers, "goroutines calling Acquire")
	flag.StringVar(&cfg.Bucket, "bucket", cfg.Bucket, "bucket: "+bucketNames())
	flag.StringVar(&cfg.Redis, "redis", "", "Redis address; empty starts a redis-server")
	flag.Int64Var(&cfg.Limit, "limit", cfg.Limit, "permits per key per -period")
	flag.DurationVar(&cfg.Period, "period", cfg.Period, "the bucket's interval (keys expire about this long after their last use)")
	flag.DurationVar(&cfg.MaxWait, "maxwait", cfg.MaxWait, "each Acquire's maxWait")
	flag.DurationVar(&cfg.Sample, "sample", cfg.Sample, "time between samples")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := run(ctx, cfg, os.Stdout)
	if err != nil {
		slog.Error("soak", "err", err)
		os.Exit(2)
	}
	if bad := rep.Failures(); len(bad) > 0 {
		for _, b := range bad {
			fmt.Fprintln(os.Stdout, "FAIL:", b)
		}
		os.Exit(1)
	}
	fmt.Fprintln(os.Stdout, "PASS: flat")
}

// printf writes to w, ignoring errors (it is a report to a terminal).
func printf(w io.Writer, format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }
