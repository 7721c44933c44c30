// Command arrivals measures what a provider sees of a headway fleet: the
// arrival time of every request, counted at the provider, from outside the
// fleet. The provider counts arrivals, so a limit holds only if it holds
// at send time; this is the measure of that, whatever the Limiter, the
// bucket or the Transport believe they granted.
//
//	go run ./internal/cmd/arrivals -limit 5 -interval 250ms -processes 3 -waits mixed -rounds 3
//
// A parent process starts a real redis-server on a free loopback port
// (internal/redisenv; it says so on stderr when only the in-process
// stand-in is available) and, for each round, a fresh counting provider
// on 127.0.0.1 (internal/provider) and a fresh bucket key. It then starts
// -processes child processes (its own binary, re-executed), each built
// only from headway's public API as a deployed worker would be: its own
// go-redis client, its own bucket on the shared key (-bucket: tokenbucket,
// the default, or gcra, slidinglog, fixedwindow; -margin sets the
// arrival margin of the first and third), its own throttle.Limiter
// (-lease: throttle.WithLeasing), an httpclient.Transport on that Limiter,
// and -workers goroutines calling the provider through an http.Client on
// it in a closed loop (demand above the limit; 0 workers: half as many
// again as the limit, over the processes, at least 8 each). Each child
// opens its connections first; the round starts when all are ready and
// lasts -duration (default 10s). The parent then closes the children's
// standard input; a child stops its workers, prints its counts and exits,
// and one that has not exited within 8 s is killed (and said so).
//
// Waits (-waits): each call's context bounds its wait for a permit (the
// Transport's own maxWait is its default, throttle.Forever). mixed: each
// call draws one of three classes, a deadline uniformly in 50–200 ms
// (short), one in 1–3 s (long), or none; none, short, long: every call
// of that class. A call that ends with throttle.ErrTimeout was refused by
// the limiter, nothing sent; it is counted, and the worker goes on.
//
// -stop i:every:for (e.g. 0:1s:30ms; repeatable) stops child i (SIGSTOP)
// for `for`, every `every`, and continues it (SIGCONT): a stalled process
// (a GC pause, a VM descheduled) that may hold permits meanwhile.
//
// By default the provider accepts everything and counts.
// -provider-limit n makes it refuse (429, with Retry-After) above n per
// interval, the way -provider-policy says (sliding, periods, aligned), and
// the Transport reacts as it would to a real provider.
//
// Figures of a round, from the arrival times, sorted:
//
//   - most: the most arrivals in any half-open span of one interval, exact
//     (two pointers), and as a multiple of the limit; where it starts, and
//     who sent its arrivals (per process p0, p1, ... and wait class); the
//     same from one interval after the first arrival on (the fleet's start
//     left out), and by the requests' send times (each call notes when its
//     Transport sent it: far fewer by send than by arrival means the
//     requests bunched on the way, a loaded machine or a stalled
//     provider, not at the Limiters);
//   - over: the fewest arrivals to set aside for the rest to hold the limit
//     in every span of one interval (what a provider enforcing a sliding
//     window would refuse), by sender, their median wait (the call's start
//     to its send) and median way (its send to its arrival);
//   - used: the arrivals from one interval after the first to the end of
//     the round over what the limit allows in that span;
//   - fewest: the fewest arrivals in a whole interval laid end to end from
//     the first arrival, the first one left out (dips);
//   - arrivals; the children's calls: answered, refused by the limiter
//     (ErrTimeout, per class), cut by their deadline otherwise, errors,
//     429s; the bucket calls that failed and the permits the Limiters'
//     failure policy granted meanwhile; the way's p99 and maximum; the
//     machine's load average.
//
// -trace wraps each child's bucket (keeping what it offers the Limiter,
// through Unwrap) to note when it granted each call's permit and what the
// grant said (the period's end, the permits left); -dump file writes
// every arrival of every round, one JSON object a line, with those times:
// the way to see, arrival by arrival, which mechanism let a span hold
// more than the limit.
//
// -rounds R runs the same configuration R times and prints each round and
// then each figure's median and range.
//
// -scenario matrix runs the table of the send-time bound: 5 per 250ms,
// 50 per 1s and 500 per 1s, each with mixed waits and with none, on 1
// process and on 3;
// the same with leasing; and 3 processes one of which is stopped for 30ms
// every second. It prints one table (medians and ranges over -rounds).
// -only re selects its rows by name; -duration, -rounds, -workers and
// -bucket apply to every row.
//
//	go run ./internal/cmd/arrivals -scenario matrix -rounds 3
//	go run ./internal/cmd/arrivals -scenario matrix -only '^500/1s' -duration 5s
//
// With -json the standard output is one JSON object (rounds, summaries),
// and the progress goes to stderr. The exit status is 1 when some round
// had more arrivals than the limit in some span of one interval (the limit
// broken where it counts) or a round failed, 0 otherwise, 2 on a usage
// error.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/internal/provider"
	"github.com/headway-go/headway/internal/redisenv"
)

func main() {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(childMain(spec, os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(command(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// bucketKinds are the buckets -bucket may name.
var bucketKinds = []string{"tokenbucket", "gcra", "slidinglog", "fixedwindow"}

// waitKinds are the values of -waits.
var waitKinds = []string{"mixed", "none", "short", "long"}

// policies are the provider's ways of enforcing -provider-limit.
var policies = map[string]provider.Policy{
	"sliding": provider.Sliding,
	"periods": provider.Periods,
	"aligned": provider.Aligned,
}

// stops is the repeatable -stop flag.
type stops []stopSpec

func (s *stops) String() string {
	if s == nil {
		return ""
	}
	var out []string
	for _, v := range *s {
		out = append(out, v.String())
	}
	return strings.Join(out, ",")
}

func (s *stops) Set(v string) error {
	spec, err := parseStop(v)
	if err != nil {
		return err
	}
	*s = append(*s, spec)
	return nil
}

// command is main, returning the exit code (see internal/cli).
func command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := cli.New("arrivals", "arrivals runs a fleet of -processes child processes, each with its own Limiter and\nhttpclient.Transport on one shared bucket, against a provider that records every\narrival, and prints the most arrivals in any span of one interval, the limit used\nand the refusals, per round and as medians over -rounds.")
	fs := cmd.Flags
	var (
		sc       scenario
		stopList stops
		rounds   int
		scen     string
		only     string
		dump     string
		asJSON   bool
	)
	fs.StringVar(&sc.Bucket, "bucket", "tokenbucket", "bucket each process builds on the shared key: "+strings.Join(bucketKinds, ", "))
	fs.Int64Var(&sc.Limit, "limit", 50, "permits per interval, for the whole fleet")
	fs.DurationVar(&sc.Interval, "interval", time.Second, "the limit's interval")
	fs.IntVar(&sc.Processes, "processes", 1, "child processes, each with its own Redis client, bucket, Limiter and Transport")
	fs.IntVar(&sc.Workers, "workers", 0, "goroutines per process calling in a closed loop (0: 1.5 × limit ÷ processes, at least 8)")
	fs.StringVar(&sc.Waits, "waits", "mixed", "each call's wait: mixed (a third each: a deadline in 50–200ms, one in 1–3s, none), none, short, long")
	fs.DurationVar(&sc.Margin, "margin", 0, "the bucket's arrival margin (bucket.WithArrivalMargin; tokenbucket and slidinglog); 0: its default")
	fs.BoolVar(&sc.Lease, "lease", false, "each Limiter leases permits (throttle.WithLeasing with defaults)")
	fs.Var(&stopList, "stop", "process:every:for, e.g. 0:1s:30ms: stop that child (SIGSTOP) for `for` every `every` (repeatable)")
	fs.DurationVar(&sc.Duration, "duration", 10*time.Second, "how long each round (each scenario's) runs")
	fs.IntVar(&rounds, "rounds", 1, "rounds per configuration; figures are then given as median [range]")
	fs.Int64Var(&sc.ProviderLimit, "provider-limit", 0, "make the provider refuse (429) above this many per interval (0: accept everything and count)")
	fs.StringVar(&sc.ProviderPolicy, "provider-policy", "sliding", "with -provider-limit, how the provider counts: sliding, periods, aligned")
	fs.DurationVar(&sc.Latency, "latency", 0, "how long the provider takes to answer an accepted call")
	fs.StringVar(&scen, "scenario", "", "run a preset table instead of one configuration: matrix")
	fs.StringVar(&only, "only", "", "with -scenario: run only the rows whose name matches this regular expression")
	fs.BoolVar(&sc.Trace, "trace", false, "wrap each process's bucket to note when it granted each call's permit and what the grant said (for -dump); Unwrap keeps what the bucket offers the Limiter")
	fs.StringVar(&dump, "dump", "", "write every arrival of every round to this file, one JSON object a line, for a closer look")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object on standard output (progress on stderr)")

	var runs []scenario
	validate := func() error {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if rounds < 1 {
			return fmt.Errorf("rounds = %d: must be at least 1", rounds)
		}
		sc.Stops = stopList
		switch scen {
		case "":
			if only != "" {
				return fmt.Errorf("only = %q: needs -scenario", only)
			}
			sc.Name = sc.describe()
			runs = []scenario{sc}
		case "matrix":
			for _, name := range []string{"limit", "interval", "processes", "waits", "lease", "stop"} {
				if set[name] {
					return fmt.Errorf("-%s: not with -scenario, whose rows set it", name)
				}
			}
			re, err := regexp.Compile(only)
			if err != nil {
				return fmt.Errorf("only = %q: %w", only, err)
			}
			for _, row := range matrix(sc) {
				if re.MatchString(row.Name) {
					runs = append(runs, row)
				}
			}
			if len(runs) == 0 {
				return fmt.Errorf("only = %q: matches no row of -scenario %s", only, scen)
			}
		default:
			return fmt.Errorf("scenario = %q: the only preset is matrix", scen)
		}
		for i := range runs {
			if err := runs[i].check(); err != nil {
				return err
			}
		}
		return nil
	}
	return cmd.Run(ctx, args, stdout, stderr, validate, func(ctx context.Context) error {
		var dumpTo io.Writer
		if dump != "" {
			f, err := os.Create(dump)
			if err != nil {
				return cli.Usagef("dump: %w", err)
			}
			defer f.Close()
			bw := bufio.NewWriter(f)
			defer bw.Flush()
			dumpTo = bw
		}
		return run(ctx, runs, rounds, asJSON, dumpTo, stdout, stderr)
	})
}

// check validates s and fills in its defaults.
func (s *scenario) check() error {
	switch {
	case !slices.Contains(bucketKinds, s.Bucket):
		return fmt.Errorf("bucket = %q: must be one of %s", s.Bucket, strings.Join(bucketKinds, ", "))
	case s.Limit < 1 || s.Limit > 1_000_000:
		return fmt.Errorf("limit = %d: must be from 1 to 1,000,000", s.Limit)
	case s.Interval < time.Millisecond:
		return fmt.Errorf("interval = %v: must be at least 1ms", s.Interval)
	case s.Processes < 1 || s.Processes > 64:
		return fmt.Errorf("processes = %d: must be from 1 to 64", s.Processes)
	case s.Workers < 0 || s.Workers > 10_000:
		return fmt.Errorf("workers = %d: must be from 0 (auto) to 10,000", s.Workers)
	case !slices.Contains(waitKinds, s.Waits):
		return fmt.Errorf("waits = %q: must be one of %s", s.Waits, strings.Join(waitKinds, ", "))
	case s.Duration < 2*s.Interval:
		return fmt.Errorf("duration = %v: must be at least two intervals (%v), the first of which is not counted in used", s.Duration, 2*s.Interval)
	case s.ProviderLimit < 0:
		return fmt.Errorf("provider-limit = %d: must be 0 (accept everything) or positive", s.ProviderLimit)
	case !knownPolicy(s.ProviderPolicy):
		return fmt.Errorf("provider-policy = %q: must be sliding, periods or aligned", s.ProviderPolicy)
	case s.Latency < 0:
		return fmt.Errorf("latency = %v: must not be negative", s.Latency)
	case s.Margin < 0 || s.Margin >= s.Interval:
		return fmt.Errorf("margin = %v: must be 0 (the bucket's default) or positive and below the interval", s.Margin)
	case s.Margin > 0 && s.Bucket != "tokenbucket" && s.Bucket != "slidinglog":
		return fmt.Errorf("margin = %v: only the tokenbucket and slidinglog buckets take one, not %s", s.Margin, s.Bucket)
	}
	for _, st := range s.Stops {
		if st.Process >= s.Processes {
			return fmt.Errorf("stop = %v: there is no process %d of %d (they count from 0)", st, st.Process, s.Processes)
		}
	}
	if s.Workers == 0 {
		s.Workers = autoWorkers(s.Limit, s.Processes)
	}
	return nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

func knownPolicy(p string) bool {
	_, ok := policies[p]
	return ok
}

// describe names a configuration, as the rows of the table do.
func (s scenario) describe() string {
	name := fmt.Sprintf("%d/%v %s %dp", s.Limit, s.Interval, s.Waits, s.Processes)
	if s.Lease {
		name += " lease"
	}
	if s.Margin > 0 {
		name += " margin " + s.Margin.String()
	}
	for _, st := range s.Stops {
		name += " stop " + st.String()
	}
	return name
}

// matrix is the table of the send-time bound (three limits, mixed waits
// and none, 1 process and 3), the same with leasing, and 3 processes one of which is
// stopped for 30 ms every second; base gives the bucket, the workers, the
// duration and the provider.
func matrix(base scenario) []scenario {
	limits := []struct {
		limit    int64
		interval time.Duration
	}{{5, 250 * time.Millisecond}, {50, time.Second}, {500, time.Second}}
	var out []scenario
	add := func(lease bool, procs []int, stop bool) {
		for _, l := range limits {
			for _, w := range []string{"mixed", "none"} {
				for _, p := range procs {
					s := base
					s.Limit, s.Interval, s.Waits, s.Processes, s.Lease, s.Stops = l.limit, l.interval, w, p, lease, nil
					if stop {
						s.Stops = []stopSpec{{Process: 0, Every: time.Second, For: 30 * time.Millisecond}}
					}
					s.Name = s.describe()
					out = append(out, s)
				}
			}
		}
	}
	add(false, []int{1, 3}, false)
	add(true, []int{1, 3}, false)
	add(false, []int{3}, true)
	return out
}

// outcome is one configuration's rounds and their summary.
type outcome struct {
	Scenario scenario      `json:"scenario"`
	Rounds   []roundResult `json:"rounds"`
	Summary  summary       `json:"summary"`
}

// dumped is one arrival in -dump's file. Times are Unix nanoseconds (0:
// unknown); TMs is the arrival's time from the round's first, in ms.
type dumped struct {
	Scenario  string  `json:"scenario"`
	Round     int     `json:"round"`
	TMs       float64 `json:"t_ms"`
	At        int64   `json:"at"`
	Process   int     `json:"process"`
	Class     string  `json:"class"`
	Began     int64   `json:"began"`
	Sent      int64   `json:"sent"`
	Decided   int64   `json:"decided,omitempty"`
	Delay     int64   `json:"delay,omitempty"`
	Reset     int64   `json:"reset,omitempty"`
	Remaining int64   `json:"remaining"`
}

func dumpRound(w io.Writer, name string, r roundResult) error {
	arr := slices.Clone(r.arrivals)
	sortArrivals(arr)
	enc := json.NewEncoder(w)
	ns := func(t time.Time) int64 {
		if t.IsZero() {
			return 0
		}
		return t.UnixNano()
	}
	for _, a := range arr {
		d := dumped{Scenario: name, Round: r.Round, TMs: float64(a.At.Sub(arr[0].At)) / float64(time.Millisecond),
			At: ns(a.At), Process: a.Process, Class: a.Class, Began: ns(a.Began), Sent: ns(a.Sent), Decided: ns(a.Decided),
			Delay: int64(a.Delay), Reset: int64(a.Reset), Remaining: a.Remaining}
		if err := enc.Encode(d); err != nil {
			return err
		}
	}
	return nil
}

// errBroken reports that some round had more than the limit in a span of
// one interval.
type errBroken struct{ rounds, of int }

func (e errBroken) Error() string {
	return fmt.Sprintf("the limit was broken at the provider in %d of %d rounds", e.rounds, e.of)
}

func run(ctx context.Context, runs []scenario, rounds int, asJSON bool, dump io.Writer, stdout, stderr io.Writer) error {
	srv, err := redisenv.Start()
	if err != nil {
		return cli.Usagef("%w", err)
	}
	defer srv.Close()
	if srv.Real() {
		fmt.Fprintf(stderr, "arrivals: started %s on %s for this run\n", srv.Kind(), srv.Addr())
	} else {
		fmt.Fprintf(stderr, "arrivals: WARNING: redis-server is not installed; running against the %s on %s, NOT a real Redis\n", srv.Kind(), srv.Addr())
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this program to start its children: %w", err)
	}
	progress := stdout
	if asJSON {
		progress = stderr
	}
	var (
		outs                  []outcome
		broken, total, loaded int
		failure               error
	)
scenarios:
	for _, sc := range runs {
		o := outcome{Scenario: sc}
		fmt.Fprintf(progress, "%s: %s, %s × %d workers, %v per round\n", sc.Name, sc.Bucket, plural(sc.Processes, "process", "processes"), sc.Workers, sc.Duration)
		for r := 1; r <= rounds; r++ {
			if ctx.Err() != nil {
				break
			}
			res, err := runRound(ctx, sc, srv.Addr(), exe, r, stderr)
			if err == errStopped {
				break
			}
			if err != nil {
				failure = fmt.Errorf("%s, round %d: %w", sc.Name, r, err)
				outs = append(outs, o)
				break scenarios
			}
			fmt.Fprintf(progress, "  %s\n", res.line(sc.Limit))
			if dump != nil {
				if err := dumpRound(dump, sc.Name, res); err != nil {
					return fmt.Errorf("dump: %w", err)
				}
			}
			o.Rounds = append(o.Rounds, res)
			total++
			if res.Load > float64(runtime.NumCPU()) {
				loaded++
			}
			if res.Most > int(sc.Limit) {
				broken++
			}
		}
		if len(o.Rounds) == 0 {
			break
		}
		o.Summary = summarize(o.Rounds, sc.Limit)
		if !asJSON && rounds > 1 && len(runs) == 1 {
			o.Summary.print(stdout)
		}
		outs = append(outs, o)
	}
	if asJSON {
		b, err := json.Marshal(struct {
			Outcomes []outcome `json:"outcomes"`
			Broken   int       `json:"rounds_broken"`
			Rounds   int       `json:"rounds"`
		}{outs, broken, total})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\n", b)
	} else if len(runs) > 1 {
		table(stdout, outs)
	}
	if loaded > 0 {
		fmt.Fprintf(stderr, "arrivals: %d of %d rounds ended with a load average above the machine's %d CPUs: late timers and descheduled processes (requests sent late, bunched) count in their figures\n", loaded, total, runtime.NumCPU())
	}
	switch {
	case failure != nil:
		return failure
	case broken > 0:
		return cli.Failedf("%w", errBroken{broken, total})
	}
	return nil
}
