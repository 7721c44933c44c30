// Command httpclient calls a rate-limited provider from a pool of workers
// through headway's Transport: every call takes a permit first, waits for
// it at most -maxwait, and has a deadline of -timeout; a 429 with
// Retry-After pauses the limit (for every instance sharing it, with
// -redis) and is retried after the pause when the deadline allows.
//
// Calls arrive at -rate per second (default: twice the limit, so that
// some must be turned away) and -workers goroutines make them, for
// -duration. At the end it prints what happened:
//
//	httpclient: sent 26, ok 25, 429s 1 (0 returned to callers), timeouts 24, errors 0 in 5s
//
// sent counts requests that went out (retries too), ok the calls
// answered 2xx, 429s the 429 answers seen (and how many of them reached
// the caller after retries), timeouts the calls that got no permit
// within -maxwait or their deadline and so were never sent.
//
//	go run ./examples/provider &
//	go run ./examples/httpclient -limit 10 -interval 1s -duration 10s
//	go run ./examples/httpclient -redis 127.0.0.1:6379   # run several: they share one limit
//
// Without -redis the limit is an in-process bucket (evenly spaced
// permits); with it, a Redis token bucket (package bucket) keyed by the
// target's host, shared by every process using the same Redis. The target
// must be on loopback unless -remote is given.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

func main() {
	os.Exit(command(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// command is main, returning the exit code (see internal/cli): 1 when
// every call failed.
func command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := cli.New("httpclient", "httpclient calls -target at -rate through a throttle.Transport that keeps\n-limit calls per -interval, shared through Redis with -redis, and prints a summary.")
	read := defineFlags(cmd.Flags)
	var c config
	validate := func() (err error) {
		c, err = read()
		return err
	}
	return cmd.Run(ctx, args, stdout, stderr, validate, func(ctx context.Context) error {
		return runConfig(ctx, c, stdout)
	})
}

type config struct {
	target   *url.URL
	limit    int64
	interval time.Duration
	workers  int
	rate     float64
	maxWait  time.Duration
	timeout  time.Duration
	redis    string
	duration time.Duration
	org      string
}

// parseFlags parses args on a flag set of its own.
func parseFlags(args []string, out io.Writer) (config, error) {
	fs := flag.NewFlagSet("httpclient", flag.ContinueOnError)
	fs.SetOutput(out)
	read := defineFlags(fs)
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	return read()
}

// defineFlags defines the flags on fs and returns the function that reads
// and checks them once fs is parsed.
func defineFlags(fs *flag.FlagSet) func() (config, error) {
	target := fs.String("target", "http://127.0.0.1:8080/product/1", "URL to call")
	remote := fs.Bool("remote", false, "allow a -target that is not on loopback")
	limit := fs.Int64("limit", 5, "calls allowed per -interval")
	interval := fs.Duration("interval", time.Second, "the limit's interval")
	workers := fs.Int("workers", 4, "goroutines making calls")
	rate := fs.Float64("rate", 0, "calls arriving per second; 0: twice the limit")
	maxWait := fs.Duration("maxwait", 500*time.Millisecond, "longest wait for a permit per call")
	timeout := fs.Duration("timeout", 2*time.Second, "deadline of each call, wait and retries included")
	rdb := fs.String("redis", "", "Redis address (host:port) to share the limit with other instances; empty: in process")
	duration := fs.Duration("duration", 5*time.Second, "how long calls arrive")
	org := fs.String("org", "acme", "X-Org-Id header sent (the tenant at examples/provider)")
	return func() (config, error) {
		return readFlags(*target, *remote, config{limit: *limit, interval: *interval, workers: *workers, rate: *rate, maxWait: *maxWait,
			timeout: *timeout, redis: *rdb, duration: *duration, org: *org})
	}
}

// readFlags checks c, filling in c.target from target.
func readFlags(target string, remote bool, c config) (config, error) {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return c, fmt.Errorf("-target %q: want an http or https URL", target)
	}
	c.target = u
	if !remote && !loopback(u.Hostname()) {
		return c, fmt.Errorf("-target %q: not on loopback; pass -remote to call another machine", target)
	}
	switch {
	case c.workers < 1 || c.workers > 10_000:
		return c, fmt.Errorf("-workers %d: must be from 1 to 10000", c.workers)
	case c.duration <= 0 || c.duration > 24*time.Hour:
		return c, fmt.Errorf("-duration %v: must be positive and at most 24h", c.duration)
	case c.timeout <= 0:
		return c, fmt.Errorf("-timeout %v: must be positive", c.timeout)
	case c.maxWait < 0:
		return c, fmt.Errorf("-maxwait %v: must be 0 or positive", c.maxWait)
	case c.rate < 0 || c.rate > 1e6:
		return c, fmt.Errorf("-rate %v: must be from 0 to 1e6", c.rate)
	}
	if c.rate == 0 && c.interval > 0 {
		c.rate = 2 * float64(c.limit) / c.interval.Seconds()
	}
	return c, nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// counts is what the run saw.
type counts struct {
	sent, ok, seen429, returned429, timeouts, errors atomic.Int64
}

// run parses args, calls the target until -duration passes or ctx ends,
// and prints a summary.
func run(ctx context.Context, args []string, out io.Writer) error {
	c, err := parseFlags(args, out)
	if err != nil {
		return err
	}
	return runConfig(ctx, c, out)
}

// runConfig is run with the flags parsed: a setup error matches
// cli.ErrUsage, a run in which every call failed cli.ErrFailed.
func runConfig(ctx context.Context, c config, out io.Writer) error {
	b, closeStore, err := newBucket(ctx, c)
	if err != nil {
		return cli.Usagef("%w", err)
	}
	defer closeStore()
	lim := throttle.New(b)

	var n counts
	// The counting base replaces the Transport's default, so it keeps as
	// many idle connections as that default does (256 per host; 2 would
	// open and close a connection for most calls of a burst).
	pool := http.DefaultTransport.(*http.Transport).Clone()
	pool.MaxIdleConnsPerHost, pool.MaxIdleConns = 256, 1024
	base := &countingTransport{base: pool, n: &n}
	defer base.base.CloseIdleConnections()
	tr, err := httpclient.NewTransport(lim,
		httpclient.WithBase(base),
		httpclient.WithMaxWait(c.maxWait),
		// One budget per provider host: the key the pause applies to.
		httpclient.WithRequestKey(func(r *http.Request) throttle.Keyed { return lim.Key(r.URL.Host) }),
	)
	if err != nil {
		return err
	}
	client := &http.Client{Transport: tr}

	fmt.Fprintf(out, "httpclient: calling %s at %.0f/s for %v, %d per %v allowed\n", c.target, c.rate, c.duration, c.limit, c.interval)
	ctx, cancel := context.WithTimeout(ctx, c.duration)
	defer cancel()
	calls := make(chan struct{})
	go arrive(ctx, c.rate, calls)

	start := time.Now()
	var wg sync.WaitGroup
	for range c.workers {
		wg.Go(func() {
			for range calls {
				call(ctx, client, c, &n)
			}
		})
	}
	wg.Wait()
	fmt.Fprintf(out, "httpclient: sent %d, ok %d, 429s %d (%d returned to callers), timeouts %d, errors %d in %v\n",
		n.sent.Load(), n.ok.Load(), n.seen429.Load(), n.returned429.Load(), n.timeouts.Load(), n.errors.Load(), time.Since(start).Round(10*time.Millisecond))
	if n.sent.Load() > 0 && n.ok.Load() == 0 {
		return cli.Failedf("every call failed: %d sent, none answered 2xx", n.sent.Load())
	}
	return nil
}

// newBucket returns the shared limit: a Redis token bucket, or an
// in-process one with evenly spaced permits.
func newBucket(ctx context.Context, c config) (throttle.Bucket, func(), error) {
	if c.redis == "" {
		b, err := throttle.NewLocal(c.limit, c.interval, throttle.WithLocalBurst(1))
		return b, func() {}, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: c.redis})
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		rdb.Close()
		return nil, nil, fmt.Errorf("-redis %s: %w", c.redis, err)
	}
	b, err := bucket.NewTokenBucket(rdb, "examples-httpclient", c.limit, c.interval)
	if err != nil {
		rdb.Close()
		return nil, nil, err
	}
	return b, func() { rdb.Close() }, nil
}

// arrive sends a call to calls rate times per second until ctx ends, then
// closes calls. A call that finds every worker busy waits for one.
func arrive(ctx context.Context, rate float64, calls chan<- struct{}) {
	defer close(calls)
	tick := time.NewTicker(max(time.Duration(float64(time.Second)/rate), time.Microsecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			select {
			case calls <- struct{}{}:
			case <-ctx.Done():
				return
			}
		}
	}
}

// call makes one call with its own deadline and counts how it ended.
func call(ctx context.Context, client *http.Client, c config, n *counts) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.target.String(), nil)
	if err != nil {
		n.errors.Add(1)
		return
	}
	req.Header.Set("X-Org-Id", c.org)
	resp, err := client.Do(req)
	switch {
	case errors.Is(err, throttle.ErrTimeout):
		n.timeouts.Add(1)
	case err != nil:
		n.errors.Add(1)
	default:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusTooManyRequests:
			n.returned429.Add(1)
		case resp.StatusCode/100 == 2:
			n.ok.Add(1)
		default:
			n.errors.Add(1)
		}
	}
}

// countingTransport counts the requests that go out and the 429s that
// come back, under the httpclient.Transport (so retries count).
type countingTransport struct {
	base *http.Transport
	n    *counts
}

func (t *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.n.sent.Add(1)
	resp, err := t.base.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		t.n.seen429.Add(1)
	}
	return resp, err
}
