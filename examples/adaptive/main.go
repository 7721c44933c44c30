// Command adaptive measures how a headway fleet adapts to a provider that
// refuses with 429 and no retry hint: a leaky bucket, a sliding window,
// fixed windows, or a limit that halves in the middle of the run and then
// recovers. Several instances, each with its own Redis client, bucket,
// Limiter and Transport (as separate processes would have), run several
// workers that call the provider as fast as their permits allow. The
// provider counts what it accepted and refused in each interval, by
// arrival time: the figures come from outside the fleet.
//
//	go run ./examples/adaptive -provider all -limit 50 -duration 20s -rounds 3
//	go run ./examples/adaptive -provider leaky -adaptive=false   # the fleet without adaptation
//
// Providers: leaky (rate -limit per -interval, burst -burst), sliding (at
// most -limit in any span of one interval), fixed (at most -limit per
// aligned window), halving (a sliding window whose limit halves at a third
// of the run and recovers at two thirds), or all of them in turn.
//
// For each run it prints the accepted and refused calls per interval, and
// a summary: when the fleet converged (the first interval from which every
// later one had at most -max-refused of its calls refused and accepted at
// least -min-use of the limit in force), and, from then on, the share
// refused and the accepted calls per interval as a share of the limit.
// With -rounds > 1, the summary gives each figure's median and range.
//
// -adaptive=false hides the bucket's limit and adaptive store from the
// Limiter, so the fleet reacts to 429 as headway did before it learned to
// adapt (only to an explicit retry time): the "before" of the README's
// table. Exit codes, as in every example tool (internal/cli): 0 success,
// 1 a run did not converge, 2 a usage or setup error. SIGINT or SIGTERM
// stops the run and prints the summary of the intervals run so far.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/internal/redisenv"
)

func main() {
	os.Exit(command(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// command is main, returning the exit code (see internal/cli): 1 when a
// run did not converge.
func command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := cli.New("adaptive", "adaptive measures how a fleet with headway's adaptive rate follows a provider\nthat refuses with 429 and no retry hint, counted at the provider.")
	fs := cmd.Flags
	var (
		c      config
		which  string
		rounds int
		quiet  bool
	)
	fs.StringVar(&which, "provider", "all", "provider policy: leaky, sliding, fixed, halving, or all")
	fs.StringVar(&c.Bucket, "bucket", "tokenbucket", "the fleet's bucket: "+strings.Join(fleetBuckets, ", "))
	fs.Int64Var(&c.Limit, "limit", 50, "the provider's limit per interval, and the fleet's configured limit")
	fs.DurationVar(&c.Interval, "interval", time.Second, "the limit's interval")
	fs.Int64Var(&c.Burst, "burst", 5, "the leaky-bucket provider's burst")
	fs.Int64Var(&c.ClientBurst, "client-burst", 0, "gcra: the fleet's burst (0: the limit)")
	fs.IntVar(&c.Instances, "instances", 4, "independent instances, each with its own Redis client, bucket, Limiter and Transport")
	fs.IntVar(&c.Workers, "workers", 8, "workers per instance, each calling as fast as its permits allow")
	fs.DurationVar(&c.Duration, "duration", 20*time.Second, "how long each run lasts")
	fs.BoolVar(&c.Adaptive, "adaptive", true, "let the fleet adapt (false: react only to explicit retry times)")
	fs.Float64Var(&c.MaxRefused, "max-refused", 0.02, "convergence: at most this share of an interval's calls refused")
	fs.Float64Var(&c.MinUse, "min-use", 0.9, "convergence: at least this share of the limit accepted per interval")
	fs.IntVar(&rounds, "rounds", 1, "runs per provider; the summary gives medians and ranges")
	fs.StringVar(&c.Redis, "redis", "", "Redis address (default: start a redis-server on a free port, or the in-process stand-in)")
	fs.BoolVar(&quiet, "quiet", false, "print only the summaries, not each interval")
	validate := func() error { return check(c, which, rounds) }
	return cmd.Run(ctx, args, stdout, stderr, validate, func(ctx context.Context) error {
		err := run(ctx, c, which, rounds, !quiet, stdout, stderr)
		if errors.Is(err, errNotConverged) {
			return cli.Failedf("%w", err)
		}
		return err
	})
}

// fleetBuckets are the buckets -bucket names.
var fleetBuckets = []string{"tokenbucket", "slidinglog", "gcra", "fixedwindow"}

// check refuses bad flag values before anything starts.
func check(c config, which string, rounds int) error {
	switch {
	case which != "all" && !slices.Contains(providers, which):
		return fmt.Errorf("-provider %q: want %s or all", which, strings.Join(providers, ", "))
	case !slices.Contains(fleetBuckets, c.Bucket):
		return fmt.Errorf("-bucket %q: want %s", c.Bucket, strings.Join(fleetBuckets, ", "))
	case rounds < 1:
		return fmt.Errorf("-rounds %d: want at least 1", rounds)
	case c.Limit < 1:
		return fmt.Errorf("-limit %d: want at least 1", c.Limit)
	case c.Interval < time.Millisecond:
		return fmt.Errorf("-interval %v: want at least 1ms", c.Interval)
	case c.Burst < 1:
		return fmt.Errorf("-burst %d: want at least 1", c.Burst)
	case c.ClientBurst < 0:
		return fmt.Errorf("-client-burst %d: want 0 (the limit) or more", c.ClientBurst)
	case c.Instances < 1 || c.Instances > 64:
		return fmt.Errorf("-instances %d: want 1 to 64", c.Instances)
	case c.Workers < 1 || c.Workers > 1024:
		return fmt.Errorf("-workers %d: want 1 to 1024", c.Workers)
	case c.Duration < c.Interval:
		return fmt.Errorf("-duration %v: want at least one -interval (%v)", c.Duration, c.Interval)
	case c.MaxRefused < 0 || c.MaxRefused > 1:
		return fmt.Errorf("-max-refused %v: want a share between 0 and 1", c.MaxRefused)
	case c.MinUse < 0 || c.MinUse > 1:
		return fmt.Errorf("-min-use %v: want a share between 0 and 1", c.MinUse)
	}
	return nil
}

var errNotConverged = errors.New("a run did not converge")

var providers = []string{"leaky", "sliding", "fixed", "halving"}

func run(ctx context.Context, c config, which string, rounds int, verbose bool, stdout, stderr io.Writer) error {
	list := []string{which}
	if which == "all" {
		list = providers
	} else if !slices.Contains(providers, which) {
		return fmt.Errorf("-provider %q: want %s or all", which, strings.Join(providers, ", "))
	}
	if rounds < 1 {
		return fmt.Errorf("-rounds %d: want at least 1", rounds)
	}
	if c.Redis == "" {
		srv, err := redisenv.Start()
		if err != nil {
			return cli.Usagef("%w", err)
		}
		defer srv.Close()
		c.Redis = srv.Addr()
		fmt.Fprintf(stderr, "adaptive: started %s on %s for this run\n", srv.Kind(), srv.Addr())
	}
	converged := true
	for _, p := range list {
		c.Provider = p
		var results []result
		for round := range rounds {
			c.Key = fmt.Sprintf("adaptive-%s-%d-%d", p, round, time.Now().UnixNano())
			fmt.Fprintf(stderr, "adaptive: running the %s provider, round %d of %d (%v)\n", p, round+1, rounds, c.Duration)
			r, err := runFleet(ctx, c)
			if err != nil {
				return err
			}
			if r.Stopped {
				fmt.Fprintf(stderr, "adaptive: stopped by a signal in round %d of the %s provider; the figures cover the %d whole intervals before it\n", round+1, p, len(r.Tallies))
			}
			if verbose {
				printRun(stdout, c, round, r)
			}
			results = append(results, r)
			converged = converged && r.ConvergedAt >= 0
			if r.Stopped {
				break
			}
		}
		printSummary(stdout, c, results)
		if ctx.Err() != nil {
			return nil // stopped: the summary so far is printed
		}
	}
	if !converged {
		return errNotConverged
	}
	return nil
}

func printRun(w io.Writer, c config, round int, r result) {
	fmt.Fprintf(w, "\n%s provider, %s fleet (adaptive %v), round %d: accepted/refused per %v\n", c.Provider, c.Bucket, c.Adaptive, round+1, c.Interval)
	for i, t := range r.Tallies {
		fmt.Fprintf(w, "  %3d  limit %4d  accepted %5d  refused %5d  adaptive rate %7.1f\n", i, r.Limits[i], t.Accepted, t.Refused, r.Rates[i])
	}
}

// num prints a figure with three significant digits, and counts of a
// thousand and more whole (1000, not 1e+03).
func num(v float64) string {
	if v >= 1000 || v <= -1000 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

func printSummary(w io.Writer, c config, rs []result) {
	med := func(f func(result) float64) string {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		m := v[len(v)/2]
		if len(v)%2 == 0 {
			m = (v[len(v)/2-1] + v[len(v)/2]) / 2
		}
		if len(v) == 1 {
			return num(m)
		}
		return fmt.Sprintf("%s [%s–%s]", num(m), num(v[0]), num(v[len(v)-1]))
	}
	fmt.Fprintf(w, "%-8s %-11s adaptive=%-5v %d × %d, limit %d per %v, %v, %d round(s):\n", c.Provider, c.Bucket, c.Adaptive, c.Instances, c.Workers, c.Limit, c.Interval, c.Duration, len(rs))
	fmt.Fprintf(w, "  accepted %s, refused %s (%s %%)\n",
		med(func(r result) float64 { return float64(r.Accepted) }),
		med(func(r result) float64 { return float64(r.Refused) }),
		med(func(r result) float64 { return 100 * r.RefusedShare }))
	fmt.Fprintf(w, "  converged at interval %s (-1: never); after it: refused %s %%, accepted %s %% of the limit per interval, worst interval %s %% refused\n",
		med(func(r result) float64 { return float64(r.ConvergedAt) }),
		med(func(r result) float64 { return 100 * r.RefusedAfter }),
		med(func(r result) float64 { return 100 * r.UseAfter }),
		med(func(r result) float64 { return 100 * r.WorstAfter }))
	if c.Provider == "halving" {
		fmt.Fprintf(w, "  followed the halving within %s interval(s), the recovery within %s\n",
			med(func(r result) float64 { return float64(r.FollowDown) }),
			med(func(r result) float64 { return float64(r.FollowUp) }))
	}
}
