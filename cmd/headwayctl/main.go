// Command headwayctl inspects and steers a headway bucket kept in Redis
// while the fleet that shares it runs: it shows a budget's state, changes
// its limit live (every instance applies it within one interval, without a
// restart), clears that change, and pauses the budget for the whole fleet.
//
//	headwayctl -redis 127.0.0.1:6379 show -bucket tokenbucket -key provider-x
//	headwayctl set-limit -bucket tokenbucket -key provider-x -limit 300
//	headwayctl set-limit -bucket fixedwindow -key get-product -interval 1s -tenant acme -limit 20
//	headwayctl clear-limit -bucket tokenbucket -key provider-x
//	headwayctl pause -bucket gcra -key billing -interval 1s -for 2s
//
// -bucket, -key, -prefix and -interval must name the bucket as the fleet
// builds it: the kind (tokenbucket, fixedwindow, gcra), the constructor's
// key, the WithPrefix option, and for fixedwindow and gcra the interval
// (a fixed window's keys carry it). -tenant names a per-call key's budget;
// without it, the constructor key's own. A live limit is per budget: one
// set without -tenant does not change the tenants'.
//
// Exit status: 0 done; 1 Redis failed; 2 bad usage (an unknown command, a
// missing or bad flag, a limit out of range). The password, if any, is read
// from the REDISCLI_AUTH environment variable, as redis-cli does.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/throttle"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit statuses.
const (
	exitOK    = 0
	exitRedis = 1
	exitUsage = 2
)

// usageError is a mistake in the command line: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

const usage = `headwayctl inspects and steers a headway bucket kept in Redis.

Usage:
  headwayctl [-redis addr] [-cluster] [-prefix p] [-timeout d] <command> [flags]

Commands:
  show         print a budget's state: limit (live or default), the permits
               counting (token bucket) or the running window's, left, when
               they stop counting or the window ends, pause left, live
               instances
  set-limit    change a budget's limit live (-limit N); every instance
               applies it within one interval
  clear-limit  remove a live limit: the fleet's constructor limit applies again
  pause        hold a budget for the whole fleet (-for d)

Run 'headwayctl <command> -h' for a command's flags.

Global flags:
`

// target names one budget of one bucket: what every command takes.
type target struct {
	kind     string
	key      string
	tenant   string
	interval time.Duration
	def      int64
}

// live is what headwayctl needs from a bucket: the live limit, the
// state, the fleet-wide pause and the adaptive rate's store, which every
// Redis bucket of package bucket has.
type live interface {
	SetLimit(ctx context.Context, key string, limit int64) error
	ClearLimit(ctx context.Context, key string) error
	State(ctx context.Context, key string) (bucket.State, error)
	throttle.Pauser
	throttle.AdaptiveStore
}

// run is the whole command; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := runErr(ctx, args, stdout, stderr)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, new(usageError)), errors.Is(err, throttle.ErrInvalid):
		fmt.Fprintln(stderr, "headwayctl:", err)
		return exitUsage
	}
	fmt.Fprintln(stderr, "headwayctl:", err)
	return exitRedis
}

func runErr(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	g := flag.NewFlagSet("headwayctl", flag.ContinueOnError)
	g.SetOutput(io.Discard) // errors are reported in one line by run; -h prints the usage
	addr := g.String("redis", "127.0.0.1:6379", "Redis address; with -cluster, a comma-separated list of seed nodes")
	cluster := g.Bool("cluster", false, "connect to a Redis Cluster")
	prefix := g.String("prefix", "headway", "key prefix the fleet uses (bucket.WithPrefix)")
	timeout := g.Duration("timeout", 5*time.Second, "give up on Redis after this long")
	g.Usage = func() {} // flag calls it on errors too; those are one line
	printUsage := func() {
		fmt.Fprint(stdout, usage)
		g.SetOutput(stdout)
		g.PrintDefaults()
		g.SetOutput(io.Discard)
	}
	if err := g.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage()
			return err
		}
		return usageError{err.Error()}
	}
	if *timeout <= 0 {
		return usagef("-timeout = %v: must be positive", *timeout)
	}
	if g.NArg() == 0 {
		return usagef("no command given (show, set-limit, clear-limit, pause); see headwayctl -h")
	}
	cmd, rest := g.Arg(0), g.Args()[1:]

	f := flag.NewFlagSet("headwayctl "+cmd, flag.ContinueOnError)
	f.SetOutput(io.Discard)
	var t target
	f.StringVar(&t.kind, "bucket", "tokenbucket", "bucket kind: tokenbucket, fixedwindow or gcra")
	f.StringVar(&t.key, "key", "", "the bucket's key, as passed to its constructor (required)")
	f.StringVar(&t.tenant, "tenant", "", "a per-call key (tenant, endpoint); empty for the constructor key's own budget")
	f.DurationVar(&t.interval, "interval", 0, "the bucket's interval (required for fixedwindow and gcra; for tokenbucket, shown only)")
	f.Int64Var(&t.def, "default", 0, "the limit the fleet's constructor uses, if known (shown only)")
	var (
		limit   int64
		pauseD  time.Duration
		asJSON  bool
		needArg string
	)
	switch cmd {
	case "show":
		f.BoolVar(&asJSON, "json", false, "print the state as JSON")
	case "set-limit":
		f.Int64Var(&limit, "limit", 0, fmt.Sprintf("the new limit per interval, 1 to %d (required)", bucket.MaxLimit))
		needArg = "limit"
	case "clear-limit":
	case "pause":
		f.DurationVar(&pauseD, "for", 0, "how long to pause (required; rounded up to the millisecond)")
		needArg = "for"
	case "help", "-h", "--help":
		printUsage()
		return nil
	default:
		return usagef("unknown command %q (show, set-limit, clear-limit, pause)", cmd)
	}
	f.Usage = func() {}
	printCmdUsage := func() {
		fmt.Fprintf(stdout, "Usage: headwayctl [global flags] %s [flags]\n\nFlags:\n", cmd)
		f.SetOutput(stdout)
		f.PrintDefaults()
		f.SetOutput(io.Discard)
	}
	if err := f.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printCmdUsage()
			return err
		}
		return usageError{err.Error()}
	}
	if f.NArg() > 0 {
		return usagef("%s: unexpected argument %q", cmd, f.Arg(0))
	}
	set := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if needArg != "" && !set[needArg] {
		return usagef("%s: -%s is required", cmd, needArg)
	}
	if cmd == "pause" && pauseD <= 0 {
		return usagef("pause: -for = %v: must be positive", pauseD)
	}

	rdb := dial(*addr, *cluster)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	b, err := open(rdb, *prefix, t)
	if err != nil {
		return err
	}
	switch cmd {
	case "show":
		st, err := b.State(ctx, t.tenant)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(stdout, t, st)
		}
		printState(stdout, t, st)
		return printAdaptive(ctx, stdout, b, t) // adaptive.go
	case "set-limit":
		if err := b.SetLimit(ctx, t.tenant, limit); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: limit set to %d; %s\n", describe(t), limit, applies(t.kind))
	case "clear-limit":
		if err := b.ClearLimit(ctx, t.tenant); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: live limit cleared, the constructor's limit applies; %s\n", describe(t), applies(t.kind))
	case "pause":
		if err := b.Pause(ctx, t.tenant, pauseD); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: paused for %v for the whole fleet (a longer pause already running is kept)\n", describe(t), pauseD)
	}
	return nil
}

// dial builds the client; the password comes from REDISCLI_AUTH.
func dial(addr string, cluster bool) redis.UniversalClient {
	pw := os.Getenv("REDISCLI_AUTH")
	if cluster {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addr, ","), Password: pw})
	}
	return redis.NewClient(&redis.Options{Addr: addr, Password: pw})
}

// open builds a bucket that names the same keys as the fleet's. Its limit
// is the -default given, or a placeholder: headwayctl never takes permits.
func open(rdb redis.UniversalClient, prefix string, t target) (live, error) {
	if t.key == "" {
		return nil, usagef("-key is required: the bucket's key, as passed to its constructor")
	}
	if t.def < 0 {
		return nil, usagef("-default = %d: must be positive", t.def)
	}
	def := max(t.def, 1)
	iv := t.interval
	switch t.kind {
	case "tokenbucket":
		if iv == 0 {
			iv = time.Second // not part of any key; shown only
		}
		return bucket.NewTokenBucket(rdb, t.key, def, iv, bucket.WithPrefix(prefix))
	case "fixedwindow", "gcra":
		if iv <= 0 {
			return nil, usagef("-interval is required for %s: the fleet's interval (a %s's keys and rate depend on it)", t.kind, t.kind)
		}
		if t.kind == "gcra" {
			return bucket.NewGCRA(rdb, t.key, def, iv, bucket.WithPrefix(prefix))
		}
		return bucket.NewFixedWindow(rdb, t.key, def, iv, bucket.WithPrefix(prefix))
	}
	return nil, usagef("-bucket = %q: must be tokenbucket, fixedwindow or gcra", t.kind)
}

func describe(t target) string {
	s := t.kind + " " + t.key
	if t.tenant != "" {
		s += " tenant " + t.tenant
	}
	return s
}

func applies(kind string) string {
	switch kind {
	case "tokenbucket":
		return "every instance applies it from its next take"
	case "fixedwindow":
		return "every instance applies it from the next window (within one interval)"
	}
	return "every instance applies it at its next take"
}

// printState prints st as a small table. Without -default, the limit the
// fleet's constructor uses is unknown, and only what Redis holds is shown.
func printState(w io.Writer, t target, st bucket.State) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	known := st.Live || t.def > 0
	per := "" // a token bucket's interval is in no key: shown only if given
	if t.interval > 0 {
		per = fmt.Sprintf(" per %v", st.Interval)
	}
	fmt.Fprintf(tw, "bucket\t%s\n", describe(t))
	switch {
	case st.Live && t.def > 0:
		fmt.Fprintf(tw, "limit\t%d%s (set live; default %d)\n", st.Limit, per, t.def)
	case st.Live:
		fmt.Fprintf(tw, "limit\t%d%s (set live)\n", st.Limit, per)
	case t.def > 0:
		fmt.Fprintf(tw, "limit\t%d%s (default; none set live)\n", st.Limit, per)
	default:
		fmt.Fprintf(tw, "limit\tnone set live: the fleet's constructor limit applies\n")
	}
	word := map[string]string{"tokenbucket": "now", "fixedwindow": "window", "gcra": "bucket"}[t.kind]
	switch {
	case st.Running && t.kind == "gcra" && !known:
		fmt.Fprintf(tw, "%s\tfull again in %v (pass -default to see the permits left)\n", word, st.Reset.Round(time.Millisecond))
	case st.Running && t.kind == "gcra":
		fmt.Fprintf(tw, "%s\t%d left now, %d counted against the burst, full again in %v\n", word, st.Remaining, st.Used, st.Reset.Round(time.Millisecond))
	case st.Running && t.kind == "tokenbucket":
		fmt.Fprintf(tw, "%s\tlimit %d, %d counting, %d left; the last stops counting in %v\n", word, st.Current, st.Used, st.Remaining, st.Reset.Round(time.Millisecond))
	case st.Running:
		fmt.Fprintf(tw, "%s\tlimit %d, %d used, %d left; next window in %v\n", word, st.Current, st.Used, st.Remaining, st.Reset.Round(time.Millisecond))
	case t.kind == "tokenbucket":
		fmt.Fprintf(tw, "%s\tno permit counting: the whole limit is free%s\n", word, withLimit(known, st.Current))
	case t.kind == "fixedwindow":
		fmt.Fprintf(tw, "%s\tno grant yet in this one%s; next window in %v\n", word, withLimit(known, st.Current), st.Reset.Round(time.Millisecond))
	default:
		fmt.Fprintf(tw, "%s\tfull\n", word)
	}
	if st.Paused > 0 {
		fmt.Fprintf(tw, "paused\tfor %v more\n", st.Paused.Round(time.Millisecond))
	} else {
		fmt.Fprintf(tw, "paused\tno\n")
	}
	fmt.Fprintf(tw, "instances\t%d live\n", st.Instances)
	tw.Flush()
}

func withLimit(known bool, limit int64) string {
	if !known {
		return ""
	}
	return fmt.Sprintf(" (limit %d)", limit)
}

// printJSON prints st as one JSON object; durations in milliseconds. A
// limit unknown here (no live limit, no -default) is null.
func printJSON(w io.Writer, t target, st bucket.State) error {
	// What is known without the fleet's limit: a running period's or
	// window's own figures (Redis keeps them), never a GCRA's.
	known := st.Live || t.def > 0
	fromRedis := known || st.Running && t.kind != "gcra"
	var limit, current, used, remaining *int64
	if known {
		limit = &st.Limit
	}
	if fromRedis {
		current, used, remaining = &st.Current, &st.Used, &st.Remaining
	}
	out := struct {
		Bucket     string `json:"bucket"`
		Key        string `json:"key"`
		Tenant     string `json:"tenant,omitempty"`
		Limit      *int64 `json:"limit"`
		Live       bool   `json:"live"`
		IntervalMs int64  `json:"interval_ms,omitempty"`
		Running    bool   `json:"running"`
		Current    *int64 `json:"current"`
		Used       *int64 `json:"used"`
		Remaining  *int64 `json:"remaining"`
		ResetMs    int64  `json:"reset_ms"`
		PausedMs   int64  `json:"paused_ms"`
		Instances  int64  `json:"instances"`
	}{t.kind, t.key, t.tenant, limit, st.Live, t.interval.Milliseconds(), st.Running, current,
		used, remaining, st.Reset.Milliseconds(), st.Paused.Milliseconds(), st.Instances}
	enc := json.NewEncoder(w)
	return enc.Encode(out)
}
