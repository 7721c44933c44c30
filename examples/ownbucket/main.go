// Command ownbucket shows a bucket of a program's own behind a
// throttle.Limiter and an httpclient.Transport, written against package
// throttle's exported interfaces only (this module cannot import the
// headway module's internal packages): the provider's 429 with
// Retry-After pauses the bucket through its Pause (throttle.Pauser), and
// the Limiter keeps the adaptive rate it learns from that refusal in the
// bucket (throttle.AdaptiveStore), where the program reads it.
//
//	go run .            # from examples/ownbucket
//
// It starts a provider on loopback that refuses the first call with 429
// and Retry-After: 1, then answers every call, and sends -calls calls.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

func main() {
	os.Exit(command(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// command runs the tool with args and returns its exit status: 0, 1 when
// the run failed, 2 for bad usage.
func command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ownbucket", flag.ContinueOnError)
	fs.SetOutput(stderr)
	calls := fs.Int("calls", 5, "calls to send through the Transport")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 || *calls < 1 {
		fmt.Fprintf(stderr, "ownbucket: want -calls of at least 1 and no arguments, got -calls %d and %q\n", *calls, fs.Args())
		return 2
	}
	r, err := run(ctx, *calls)
	if err != nil {
		fmt.Fprintln(stderr, "ownbucket:", err)
		return 1
	}
	fmt.Fprintf(stdout, "answers: %v\npauses of the bucket: %v\nadaptive rate: %.4g per %v (active: %v)\n",
		r.statuses, r.pauses, r.adaptive.Rate, r.interval, r.adaptive.Active())
	return 0
}

// result is what a run saw.
type result struct {
	statuses []int
	pauses   []string
	adaptive throttle.AdaptiveState
	interval time.Duration
}

// run sends calls through a Transport over a memBucket of 10 per second,
// to a provider that refuses the first with Retry-After: 1.
func run(ctx context.Context, calls int) (result, error) {
	var seen atomic.Int64
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if seen.Add(1) == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer provider.Close()

	r := result{interval: time.Second}
	b := newMemBucket(10, r.interval)
	lim := throttle.New(b)
	defer func() { _ = lim.Close() }()
	tr, err := httpclient.NewTransport(lim, httpclient.WithRetries(0), httpclient.WithMaxWait(5*time.Second))
	if err != nil {
		return r, err
	}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for range calls {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, provider.URL, nil)
		if err != nil {
			return r, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return r, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		r.statuses = append(r.statuses, resp.StatusCode)
	}
	client.CloseIdleConnections()
	r.pauses = b.pausesSoFar()
	if r.adaptive, err = lim.Key("").AdaptiveState(ctx); err != nil {
		return r, err
	}
	return r, nil
}
