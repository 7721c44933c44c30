package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/provider"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
	"github.com/redis/go-redis/v9"
)

// One member of the fleet: a child process of its own, as a deployed
// worker would be. It sees only what such a worker sees: the Redis
// address, the bucket's key and parameters, and the provider's URL.

// childEnv carries a child's configuration (JSON, a childConfig): the
// parent re-executes its own binary with it set, and main (or a test's
// TestMain) runs the child instead of the command when it is present.
const childEnv = "HEADWAY_ARRIVALS_CHILD"

// childConfig is what a child needs to build its part of the fleet.
type childConfig struct {
	Process  int           `json:"process"`
	Redis    string        `json:"redis"`
	Key      string        `json:"key"`
	Bucket   string        `json:"bucket"`
	Limit    int64         `json:"limit"`
	Interval time.Duration `json:"interval"`
	Margin   time.Duration `json:"margin,omitempty"` // 0: the bucket's default
	Lease    bool          `json:"lease"`
	Workers  int           `json:"workers"`
	Waits    string        `json:"waits"`
	URL      string        `json:"url"`
	// Trace wraps the bucket in a tracedBucket.
	Trace bool `json:"trace,omitempty"`
}

// childResult is what a child tells its parent at the end, on the last
// line of its standard output: how its calls ended, as the callers saw
// them (the provider counts the arrivals).
type childResult struct {
	Process int `json:"process"`
	// Calls is every call a worker began and that ended before the stop.
	Calls int64 `json:"calls"`
	// OK and Status429 were answered by the provider; Refused ended with
	// throttle.ErrTimeout (no permit within the call's wait: nothing
	// sent); Deadline ended with the call's deadline otherwise (perhaps
	// after it was sent); Errors failed otherwise.
	OK        int64 `json:"ok"`
	Status429 int64 `json:"status_429"`
	Refused   int64 `json:"refused"`
	Deadline  int64 `json:"deadline"`
	Errors    int64 `json:"errors"`
	// RefusedBy is Refused per wait class.
	RefusedBy map[string]int64 `json:"refused_by"`
	// StoreErrors is the bucket calls that failed (the Limiter's store
	// timeout, Redis unreachable); Degraded the permits the Limiter's
	// failure policy granted meanwhile, without the shared bucket (its
	// Observer's counts).
	StoreErrors int64  `json:"store_errors"`
	Degraded    int64  `json:"degraded"`
	FirstError  string `json:"first_error,omitempty"`
	// Stuck is the workers that had not returned within stopBound of the
	// stop.
	Stuck int `json:"stuck,omitempty"`
}

// childReady is the line a child prints once its connections are open:
// the parent starts the round when every child has printed it.
const childReady = "ready"

// stopBound is how long a child waits for its workers after the stop;
// their calls' contexts end at the stop, so they return at once unless
// something is wrong, which the result then shows (Stuck).
const stopBound = 3 * time.Second

// childMain runs a child from its configuration (the value of childEnv)
// and returns its exit code. stdin carries the parent's orders: a line
// "go" starts the workers, and its end (the parent closes it, or dies)
// stops them.
func childMain(spec string, stdin io.Reader, stdout, stderr io.Writer) int {
	// Terminal signals are the parent's to handle; the parent stops a
	// child by closing its standard input.
	signal.Ignore(os.Interrupt)
	slog.SetDefault(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	var c childConfig
	if err := json.Unmarshal([]byte(spec), &c); err != nil {
		fmt.Fprintf(stderr, "bad %s: %v\n", childEnv, err)
		return 2
	}
	res, err := runChild(c, stdin, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return 1
	}
	b, _ := json.Marshal(res)
	fmt.Fprintf(stdout, "%s\n", b)
	return 0
}

// newBucket builds a bucket of kind on rdb, as a user would; a margin
// above 0 is the bucket's WithArrivalMargin (tokenbucket and slidinglog,
// which check says).
func newBucket(rdb redis.UniversalClient, kind, key string, limit int64, interval, margin time.Duration) (throttle.Bucket, error) {
	switch kind {
	case "tokenbucket":
		if margin > 0 {
			return bucket.NewTokenBucket(rdb, key, limit, interval, bucket.WithArrivalMargin(margin))
		}
		return bucket.NewTokenBucket(rdb, key, limit, interval)
	case "gcra":
		return bucket.NewGCRA(rdb, key, limit, interval)
	case "slidinglog":
		tiers := []throttle.Tier{{Limit: limit, Period: interval}}
		if margin > 0 {
			return bucket.NewSlidingLog(rdb, key, tiers, bucket.WithArrivalMargin(margin))
		}
		return bucket.NewSlidingLog(rdb, key, tiers)
	case "fixedwindow":
		return bucket.NewFixedWindow(rdb, key, limit, interval)
	}
	return nil, fmt.Errorf("bucket %q: unknown", kind)
}

// maxPool caps a child's Redis connections: its workers wait at the
// Limiter far more than they talk to Redis.
const maxPool = 256

func runChild(c childConfig, stdin io.Reader, stdout io.Writer) (childResult, error) {
	rdb := redis.NewClient(&redis.Options{Addr: c.Redis, PoolSize: min(c.Workers+4, maxPool)})
	defer rdb.Close()
	b, err := newBucket(rdb, c.Bucket, c.Key, c.Limit, c.Interval, c.Margin)
	if err != nil {
		return childResult{}, err
	}
	if c.Trace {
		b = tracedBucket{b}
	}
	t := &childTally{refusedBy: map[string]*atomic.Int64{}}
	for _, cl := range classes {
		t.refusedBy[cl] = new(atomic.Int64)
	}
	opts := []throttle.LimiterOption{throttle.WithObserver(observer{t})}
	if c.Lease {
		opts = append(opts, throttle.WithLeasing(throttle.Leasing{}))
	}
	lim := throttle.New(b, opts...)
	defer lim.Close()
	// One connection per worker, kept open: a dial in the middle of the
	// run would delay a call and move its arrival.
	base := &http.Transport{MaxIdleConns: c.Workers, MaxIdleConnsPerHost: c.Workers}
	defer base.CloseIdleConnections()
	// The Transport's own maxWait is its default (throttle.Forever): each
	// call's context deadline, or none, bounds its wait. Under it, stamp
	// notes when each request leaves.
	ht, err := httpclient.NewTransport(lim, httpclient.WithBase(stamp{base}))
	if err != nil {
		return childResult{}, err
	}
	client := &http.Client{Transport: ht}

	warm(rdb, base, c)
	in := bufio.NewReader(stdin)
	fmt.Fprintln(stdout, childReady)
	if line, err := in.ReadString('\n'); err != nil || line != "go\n" {
		return childResult{Process: c.Process, RefusedBy: map[string]int64{}}, nil // stopped before the start
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		_, _ = io.Copy(io.Discard, in) // until the parent closes stdin
		stop()
	}()

	var (
		wg      sync.WaitGroup
		running atomic.Int64
		seq     atomic.Int64
	)
	seed := uint64(time.Now().UnixNano())
	for w := range c.Workers {
		running.Add(1)
		wg.Go(func() {
			defer running.Add(-1)
			work(ctx, c, client, rand.New(rand.NewPCG(seed, uint64(w))), &seq, t)
		})
	}
	<-ctx.Done()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	res := childResult{Process: c.Process}
	select {
	case <-done:
	case <-time.After(stopBound):
		res.Stuck = int(running.Load())
	}
	t.fill(&res)
	return res, nil
}

// warm opens the connections the workers will use, to Redis and to the
// provider (on its health path, which it does not count), before the
// round starts, as a long-running worker has them.
func warm(rdb *redis.Client, base *http.Transport, c childConfig) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hc := &http.Client{Transport: base}
	var wg sync.WaitGroup
	for i := range c.Workers {
		if i < min(c.Workers, maxPool) {
			wg.Go(func() { _ = rdb.Ping(ctx).Err() })
		}
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+provider.HealthPath, nil)
			if err != nil {
				return
			}
			if resp, err := hc.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
}

// The classes of a call's wait.
const (
	classShort = "short" // a context deadline uniformly in [50 ms, 200 ms)
	classLong  = "long"  // a context deadline uniformly in [1 s, 3 s)
	classNone  = "none"  // no deadline
)

var classes = []string{classShort, classLong, classNone}

// draw picks the wait class of a call for waits (see the -waits flag).
func draw(waits string, rng *rand.Rand) string {
	switch waits {
	case "short":
		return classShort
	case "long":
		return classLong
	case "none":
		return classNone
	}
	return classes[rng.IntN(len(classes))]
}

// deadline draws the deadline of a call of class, from now; 0 for none.
func deadline(class string, rng *rand.Rand) time.Duration {
	switch class {
	case classShort:
		return 50*time.Millisecond + time.Duration(rng.Int64N(int64(150*time.Millisecond)))
	case classLong:
		return time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
	}
	return 0
}

// childTally holds a child's counts.
type childTally struct {
	calls, ok, s429, refused, deadline, errors atomic.Int64
	storeErrors, degraded                      atomic.Int64
	refusedBy                                  map[string]*atomic.Int64
	firstErr                                   sync.Once
	firstError                                 string
}

func (t *childTally) fill(r *childResult) {
	r.Calls, r.OK, r.Status429 = t.calls.Load(), t.ok.Load(), t.s429.Load()
	r.Refused, r.Deadline, r.Errors = t.refused.Load(), t.deadline.Load(), t.errors.Load()
	r.RefusedBy = map[string]int64{}
	for cl, n := range t.refusedBy {
		if v := n.Load(); v > 0 {
			r.RefusedBy[cl] = v
		}
	}
	r.StoreErrors, r.Degraded = t.storeErrors.Load(), t.degraded.Load()
	r.FirstError = t.firstError
}

// observer counts what the Limiter did without the shared bucket.
type observer struct{ t *childTally }

func (observer) Acquired(string, int64, time.Duration, error) {}

func (o observer) BucketCall(_ string, _ throttle.Decision, _ time.Duration, err error) {
	if err != nil {
		o.t.storeErrors.Add(1)
	}
}

func (o observer) Degraded(_ string, _ string, granted bool, _ error) {
	if granted {
		o.t.degraded.Add(1)
	}
}

func (t *childTally) fail(err error) {
	t.errors.Add(1)
	t.firstErr.Do(func() { t.firstError = err.Error() })
}

// work is one worker: a closed loop of calls to the provider through the
// Transport, each with a wait drawn from c.Waits, until ctx ends. The
// call's query tells the provider who sent it, in which class, and when
// the call began and was sent (trace.go), so that the parent can say
// which callers the arrivals over the limit came from.
func work(ctx context.Context, c childConfig, client *http.Client, rng *rand.Rand, seq *atomic.Int64, t *childTally) {
	for ctx.Err() == nil {
		class := draw(c.Waits, rng)
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if d := deadline(class, rng); d > 0 {
			cctx, cancel = context.WithTimeout(ctx, d)
		}
		q := url.Values{
			"topic":     {class},
			"partition": {strconv.Itoa(c.Process)},
			"offset":    {strconv.FormatInt(seq.Add(1), 10)},
		}
		cctx = withNote(cctx, &callNote{began: time.Now()})
		req, err := http.NewRequestWithContext(cctx, http.MethodGet, c.URL+"/call?"+q.Encode(), nil)
		if err != nil {
			cancel()
			t.fail(err)
			continue
		}
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		cancel()
		if ctx.Err() != nil {
			return // the round ended: this call is no one's
		}
		t.calls.Add(1)
		switch {
		case err == nil && resp.StatusCode == http.StatusTooManyRequests:
			t.s429.Add(1)
		case err == nil && resp.StatusCode/100 == 2:
			t.ok.Add(1)
		case err == nil:
			t.fail(fmt.Errorf("status %s", resp.Status))
		case errors.Is(err, throttle.ErrTimeout):
			t.refused.Add(1)
			t.refusedBy[class].Add(1)
		case errors.Is(err, context.DeadlineExceeded):
			t.deadline.Add(1)
		default:
			t.fail(err)
		}
	}
}
