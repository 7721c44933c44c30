package httpclient_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/guarantee"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
	"github.com/headway-go/headway/throttle/httpserver"
)

// countingServer is a provider on loopback that records, independently of
// any bucket, when each request arrived (on clock) and what it carried.
type countingServer struct {
	*httptest.Server
	clock clockwork.Clock

	mu       sync.Mutex
	arrivals []time.Time
	bodies   []string
	// answer, when set, writes the response to the n-th request (from 1);
	// otherwise the answer is 200 "ok".
	answer func(n int, w http.ResponseWriter, r *http.Request)
}

func newCountingServer(t *testing.T, clock clockwork.Clock, answer func(n int, w http.ResponseWriter, r *http.Request)) *countingServer {
	t.Helper()
	s := &countingServer{clock: clock, answer: answer}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.arrivals = append(s.arrivals, s.clock.Now())
		s.bodies = append(s.bodies, string(body))
		n := len(s.arrivals)
		s.mu.Unlock()
		// The provider dates its answers on its clock, against which its
		// absolute resets are read.
		w.Header().Set("Date", s.clock.Now().UTC().Format(http.TimeFormat))
		if s.answer != nil {
			s.answer(n, w, r)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *countingServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.arrivals)
}

func (s *countingServer) times() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.arrivals...)
}

func (s *countingServer) sentBodies() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.bodies...)
}

// answer429 answers every request 429 with the given Retry-After.
func answer429(retryAfter string) func(int, http.ResponseWriter, *http.Request) {
	return func(_ int, w http.ResponseWriter, _ *http.Request) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		http.Error(w, "slow down", http.StatusTooManyRequests)
	}
}

// drain reads and closes a response body.
func drain(resp *http.Response) string {
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return string(b)
}

// mustTransport builds a Transport or fails the test.
func mustTransport(t *testing.T, lim *throttle.Limiter, opts ...httpclient.Option) *httpclient.Transport {
	t.Helper()
	tr, err := httpclient.NewTransport(lim, opts...)
	if err != nil {
		t.Fatalf("NewTransport: %v", err)
	}
	return tr
}

// windowBucket is an in-memory fixed-window bucket: limit per aligned
// period, on clock.
func windowBucket(t *testing.T, clock clockwork.Clock, limit int64, period time.Duration) throttle.Bucket {
	t.Helper()
	b, err := httpserver.LocalWindows(clock)(httpserver.SLA{ID: "shared", Tiers: []throttle.Tier{{Period: period, Limit: limit}}})
	if err != nil {
		t.Fatalf("LocalWindows: %v", err)
	}
	return b
}

// TestTransportFleetStaysUnderLimit runs 8 clients, each with its own
// Transport and Limiter over one shared fixed-window bucket, on a fake
// clock: in every window the server sees exactly the limit, never more.
func TestTransportFleetStaysUnderLimit(t *testing.T) {
	const (
		limit   = 5
		workers = 8
		windows = 4
		period  = time.Second
	)
	start := time.Unix(1_800_000_000, 0) // aligned to the period
	clk := clockwork.NewFakeClockAt(start)
	b := windowBucket(t, clk, limit, period)
	srv := newCountingServer(t, clk, nil)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range workers {
		client := &http.Client{Transport: mustTransport(t, throttle.New(b, throttle.WithClock(clk)), httpclient.WithBase(srv.Client().Transport))}
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("worker: %v", err)
						return
					}
					continue
				}
				drain(resp)
			}
		})
	}
	for w := range windows {
		// Every worker asleep on the clock: the window's permits are gone.
		bctx, bcancel := context.WithTimeout(ctx, 10*time.Second)
		err := clk.BlockUntilContext(bctx, workers)
		bcancel()
		if err != nil {
			t.Fatalf("window %d: the workers did not all wait for the next window: %v", w, err)
		}
		clk.Advance(period)
	}
	cancel()
	wg.Wait()

	perWindow := map[int64]int{}
	for _, at := range srv.times() {
		perWindow[int64(at.Sub(start)/period)]++
	}
	for w := int64(0); w <= windows; w++ {
		got := perWindow[w]
		if got > limit {
			t.Errorf("window %d: the server saw %d requests, limit %d", w, got, limit)
		}
		if w < windows && got != limit {
			t.Errorf("window %d: the server saw %d requests, want exactly the limit %d (the fleet was waiting)", w, got, limit)
		}
	}
}

// sendClock is a base RoundTripper that notes when the Transport sends
// each request (its permit handed over) before passing it on.
type sendClock struct {
	base  http.RoundTripper
	times *grantTimes
}

func (s sendClock) RoundTrip(r *http.Request) (*http.Response, error) {
	s.times.add(guarantee.Now(), 1) // the clock the bucket decides on
	return s.base.RoundTrip(r)
}

// grantTimes is a list of times, one entry per permit.
type grantTimes struct {
	mu sync.Mutex
	at []time.Time
}

func (g *grantTimes) add(at time.Time, n int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for range n {
		g.at = append(g.at, at)
	}
}

func (g *grantTimes) sorted() []time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := slices.Clone(g.at)
	slices.SortFunc(s, time.Time.Compare)
	return s
}

// mostWithin returns the most of the sorted times that lie within a span
// shorter than span, and where that span begins.
func mostWithin(times []time.Time, span time.Duration) (most int, at time.Time) {
	for i := range times {
		n := 0
		for j := i; j < len(times) && times[j].Sub(times[i]) < span; j++ {
			n++
		}
		if n > most {
			most, at = n, times[i]
		}
	}
	return most, at
}

// TestTransportFleetStaysUnderLimitRedis is the same with a Redis token
// bucket shared by separate clients (each its own Redis connection,
// bucket value, Limiter and Transport), on the real clock: the server's
// own count never exceeds the bucket's guarantee.
func TestTransportFleetStaysUnderLimitRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("real Redis and real time")
	}
	const (
		limit    = 5
		interval = 250 * time.Millisecond
		workers  = 6
		run      = 1500 * time.Millisecond
	)
	rs := redisenv.New(t)
	srv := newCountingServer(t, clockwork.NewRealClock(), nil)

	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()
	var wg sync.WaitGroup
	sends := &grantTimes{}
	for range workers {
		rdb := rs.Client()
		b, err := bucket.NewTokenBucket(rdb, "transport-fleet", limit, interval)
		if err != nil {
			t.Fatalf("NewTokenBucket: %v", err)
		}
		client := &http.Client{Transport: mustTransport(t, throttle.New(b), httpclient.WithBase(sendClock{srv.Client().Transport, sends}))}
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
				resp, err := client.Do(req)
				if err != nil {
					continue // the run's deadline
				}
				drain(resp)
			}
		})
	}
	wg.Wait()

	arr := srv.times()
	if len(arr) < limit {
		t.Fatalf("the server saw %d requests in %v; the fleet did not run", len(arr), run)
	}
	// The token bucket's guarantee: at most limit permits' times in any
	// span of one interval and its margin, whatever the callers' waits
	// (the run's deadline cuts the last ones short); a Limiter hands each
	// permit over within its margin after its time, so the sends are at
	// most limit in any span of one interval, exactly. (Before permits had
	// times, the server saw up to 2·limit.) The arrivals come later still,
	// each by its own delay on the way: allow 20 ms for it on a loaded
	// machine.
	if n, at := mostWithin(sends.sorted(), interval); n > limit {
		t.Fatalf("%d requests sent within %v of %v; the bucket allows at most %d", n, interval, at.Format("15:04:05.000"), limit)
	}
	span := interval - 20*time.Millisecond
	if n, at := mostWithin(arr, span); n > limit {
		t.Fatalf("%d requests reached the server within %v of %v; at most %d", n, span, at.Format("15:04:05.000"), limit)
	}
	total := arr[len(arr)-1].Sub(arr[0])
	if most := limit * (int(total/interval) + 2); len(arr) > most {
		t.Errorf("%d requests reached the server over %v; at most %d fit %d per %v", len(arr), total, most, limit, interval)
	}
	t.Logf("%d requests over %v, %d per %v allowed", len(arr), total, limit, interval)
}

// TestTransportPauseStopsTheFleet: one client gets 429 with Retry-After: 2;
// every client, each with its own Transport, Limiter and Redis connection
// on one Redis token bucket, stops for 2 s: the server sees nothing during
// the pause, then the 429'd request is retried and succeeds. This is the
// package's one real-time test.
func TestTransportPauseStopsTheFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("real Redis and 2 s of real time")
	}
	const (
		workers = 4
		pause   = 2 * time.Second
		trigger = 6 // the request answered 429
	)
	rs := redisenv.New(t)
	var t429 atomic.Int64 // UnixNano of the 429
	srv := newCountingServer(t, clockwork.NewRealClock(), func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == trigger {
			t429.Store(time.Now().UnixNano())
			w.Header().Set("Retry-After", "2")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		fmt.Fprint(w, "ok")
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var ok200, got429 atomic.Int64
	stop := make(chan struct{})
	for range workers {
		b, err := bucket.NewTokenBucket(rs.Client(), "transport-pause", 20, 100*time.Millisecond)
		if err != nil {
			t.Fatalf("NewTokenBucket: %v", err)
		}
		client := &http.Client{Transport: mustTransport(t, throttle.New(b), httpclient.WithBase(srv.Client().Transport))}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				cctx, ccancel := context.WithTimeout(ctx, 5*time.Second) // a per-call deadline
				req, _ := http.NewRequestWithContext(cctx, http.MethodGet, srv.URL, nil)
				resp, err := client.Do(req)
				if err != nil {
					ccancel()
					if ctx.Err() == nil {
						t.Errorf("worker: %v", err)
					}
					return
				}
				if resp.StatusCode == http.StatusOK {
					ok200.Add(1)
				} else {
					got429.Add(1)
				}
				drain(resp)
				ccancel()
			}
		})
	}
	// Run until 600 ms after the pause ends.
	deadline := time.Now().Add(10 * time.Second)
	for t429.Load() == 0 || time.Since(time.Unix(0, t429.Load())) < pause+600*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatalf("no 429 within 10 s (server saw %d requests)", srv.count())
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	at := time.Unix(0, t429.Load())
	// Requests already on the wire when the 429 left may land just after
	// it; nothing may land from 100 ms on until the pause ends (Redis
	// counts it from when the client read the 429, a little after at).
	quietFrom, quietTo := at.Add(100*time.Millisecond), at.Add(pause)
	var during, after []time.Duration
	for _, a := range srv.times() {
		switch {
		case a.After(quietFrom) && a.Before(quietTo):
			during = append(during, a.Sub(at))
		case !a.Before(quietTo):
			after = append(after, a.Sub(at))
		}
	}
	if len(during) > 0 {
		t.Errorf("%d requests reached the server during the fleet-wide pause, the first at %v after the 429", len(during), during[:min(5, len(during))])
	}
	if len(after) == 0 {
		t.Errorf("no request reached the server after the pause ended; the fleet did not resume")
	} else if after[0] > pause+300*time.Millisecond {
		t.Errorf("the first request after the pause came %v after the 429; want soon after %v", after[0], pause)
	}
	if got429.Load() != 0 {
		t.Errorf("%d callers saw the 429; the Transport should have retried the GET after the pause", got429.Load())
	}
	if len(after) > 0 {
		t.Logf("quiet from %v to %v after the 429; first request after it at %v; %d calls ok", 100*time.Millisecond, pause, after[0], ok200.Load())
	}
}

// TestTransportDeadline: when no permit can come in time, RoundTrip fails
// at once with ErrTimeout and sends nothing.
func TestTransportDeadline(t *testing.T) {
	srv := newCountingServer(t, clockwork.NewRealClock(), nil)
	b, err := throttle.NewLocal(1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	lim := throttle.New(b)
	if err := lim.Acquire(context.Background(), 0); err != nil { // the only permit
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		opts     []httpclient.Option
		ctx      func() (context.Context, context.CancelFunc)
		wantErr  error
		alsoWant error
	}{
		{"context deadline", nil, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 50*time.Millisecond)
		}, throttle.ErrTimeout, context.DeadlineExceeded},
		{"request maxWait 0", nil, func() (context.Context, context.CancelFunc) {
			return httpclient.ContextWithMaxWait(context.Background(), 0), func() {}
		}, throttle.ErrTimeout, nil},
		{"request maxWait 1s", nil, func() (context.Context, context.CancelFunc) {
			return httpclient.ContextWithMaxWait(context.Background(), time.Second), func() {}
		}, throttle.ErrTimeout, nil},
		{"client maxWait", []httpclient.Option{httpclient.WithMaxWait(10 * time.Millisecond)}, func() (context.Context, context.CancelFunc) {
			return context.Background(), func() {}
		}, throttle.ErrTimeout, nil},
		{"request maxWait overrides client's", []httpclient.Option{httpclient.WithMaxWait(throttle.Forever)}, func() (context.Context, context.CancelFunc) {
			return httpclient.ContextWithMaxWait(context.Background(), 5*time.Millisecond), func() {}
		}, throttle.ErrTimeout, nil},
		{"negative request maxWait", nil, func() (context.Context, context.CancelFunc) {
			return httpclient.ContextWithMaxWait(context.Background(), -time.Second), func() {}
		}, throttle.ErrInvalid, nil},
		{"cancelled context", nil, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, context.Canceled, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := mustTransport(t, lim, append([]httpclient.Option{httpclient.WithBase(srv.Client().Transport)}, tt.opts...)...)
			ctx, cancel := tt.ctx()
			defer cancel()
			body := &trackedBody{Reader: strings.NewReader("payload")}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPut, srv.URL, body)
			begin := time.Now()
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err == nil {
				drain(resp)
				t.Fatalf("Do: got %s, want an error matching %v", resp.Status, tt.wantErr)
			}
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("Do: %v; want an error matching %v", err, tt.wantErr)
			}
			if tt.alsoWant != nil && !errors.Is(err, tt.alsoWant) {
				t.Errorf("Do: %v; want it to match %v too", err, tt.alsoWant)
			}
			if took := time.Since(begin); took > 500*time.Millisecond {
				t.Errorf("Do took %v; a wait that cannot succeed must fail at once", took)
			}
			if n := srv.count(); n != 0 {
				t.Errorf("the server saw %d requests; nothing may be sent without a permit", n)
			}
			if !body.closed.Load() {
				t.Errorf("the request body was not closed; a RoundTripper closes it even on errors")
			}
		})
	}
}

// trackedBody records whether it was closed.
type trackedBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *trackedBody) Close() error { b.closed.Store(true); return nil }

// closeCounter wraps a RoundTripper and counts the responses it gives and
// the response bodies closed.
type closeCounter struct {
	rt             http.RoundTripper
	bodies, closed atomic.Int32
}

func (c *closeCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(r)
	if resp != nil {
		c.bodies.Add(1)
		resp.Body = &countedBody{ReadCloser: resp.Body, closed: &c.closed}
	}
	return resp, err
}

type countedBody struct {
	io.ReadCloser
	closed *atomic.Int32
	once   sync.Once
}

func (b *countedBody) Close() error {
	b.once.Do(func() { b.closed.Add(1) })
	return b.ReadCloser.Close()
}

// TestTransportRetries: which requests are sent again after a 429 or 503
// with a retry time, how often, and that discarded bodies are closed.
func TestTransportRetries(t *testing.T) {
	type request struct {
		method string
		body   func() io.Reader // nil: no body
		header http.Header
	}
	get := request{method: http.MethodGet}
	tests := []struct {
		name       string
		req        request
		retries    int // -1: the default
		answer     func(int, http.ResponseWriter, *http.Request)
		wantSent   int // requests the server sees
		wantStatus int // status the caller gets
		opts       []httpclient.Option
	}{
		{"GET retried until it passes", get, -1, func(n int, w http.ResponseWriter, r *http.Request) {
			if n == 1 {
				answer429("0")(n, w, r)
				return
			}
			fmt.Fprint(w, "ok")
		}, 2, http.StatusOK, nil},
		{"GET retried at most the default 2 times", get, -1, answer429("0"), 3, http.StatusTooManyRequests, nil},
		{"GET with WithRetries(0) is not retried", get, 0, answer429("0"), 1, http.StatusTooManyRequests, nil},
		{"GET with WithRetries(4)", get, 4, answer429("0"), 5, http.StatusTooManyRequests, nil},
		{"503 with a retry time is retried", get, 1, func(n int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("X-RateLimit-Reset", "0")
			w.Header().Set("X-RateLimit-Remaining", "0")
			http.Error(w, "busy", http.StatusServiceUnavailable)
		}, 2, http.StatusServiceUnavailable, nil},
		{"403 with Retry-After is retried", get, 1, func(n int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "0")
			http.Error(w, "secondary rate limit", http.StatusForbidden)
		}, 2, http.StatusForbidden, nil},
		{"403 with nothing remaining is retried", get, 1, func(n int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("X-RateLimit-Remaining", "0")
			w.Header().Set("X-RateLimit-Reset", "0")
			http.Error(w, "rate limit", http.StatusForbidden)
		}, 2, http.StatusForbidden, nil},
		{"403 without a retry time is returned", get, 1, func(n int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("X-RateLimit-Remaining", "17")
			w.Header().Set("X-RateLimit-Reset", "0")
			http.Error(w, "forbidden", http.StatusForbidden)
		}, 1, http.StatusForbidden, nil},
		{"403 not among WithLimitStatuses is returned", get, 1, func(n int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "0")
			http.Error(w, "forbidden", http.StatusForbidden)
		}, 1, http.StatusForbidden, []httpclient.Option{httpclient.WithLimitStatuses(http.StatusTooManyRequests)}},
		{"429 without a retry time is returned", get, -1, answer429(""), 1, http.StatusTooManyRequests, nil},
		{"500 is returned", get, -1, func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "0")
			http.Error(w, "boom", http.StatusInternalServerError)
		}, 1, http.StatusInternalServerError, nil},
		{"POST without body is not retried", request{method: http.MethodPost}, -1, answer429("0"), 1, http.StatusTooManyRequests, nil},
		{"POST with a replayable body is not retried", request{method: http.MethodPost, body: func() io.Reader { return bytes.NewReader([]byte("b")) }}, 1, answer429("0"), 1, http.StatusTooManyRequests, nil},
		{"PATCH with a replayable body is not retried", request{method: http.MethodPatch, body: func() io.Reader { return bytes.NewReader([]byte("b")) }}, 1, answer429("0"), 1, http.StatusTooManyRequests, nil},
		{"POST with WithRetryAnyMethod is retried", request{method: http.MethodPost, body: func() io.Reader { return bytes.NewReader([]byte("b")) }}, 1, answer429("0"), 2, http.StatusTooManyRequests, []httpclient.Option{httpclient.WithRetryAnyMethod()}},
		{"POST with Idempotency-Key is retried", request{method: http.MethodPost, header: http.Header{"Idempotency-Key": {"k1"}}}, 1, answer429("0"), 2, http.StatusTooManyRequests, nil},
		{"PUT with a one-shot body is not retried", request{method: http.MethodPut, body: func() io.Reader { return io.MultiReader(strings.NewReader("b")) }}, -1, answer429("0"), 1, http.StatusTooManyRequests, nil},
		{"PUT with a replayable body and WithRetryAnyMethod is retried", request{method: http.MethodPut, body: func() io.Reader { return strings.NewReader("b") }}, 1, answer429("0"), 2, http.StatusTooManyRequests, []httpclient.Option{httpclient.WithRetryAnyMethod()}},
		{"PUT with a one-shot body and WithRetryAnyMethod is not retried", request{method: http.MethodPut, body: func() io.Reader { return io.MultiReader(strings.NewReader("b")) }}, 1, answer429("0"), 1, http.StatusTooManyRequests, []httpclient.Option{httpclient.WithRetryAnyMethod()}},
		{"DELETE is not retried", request{method: http.MethodDelete}, 1, answer429("0"), 1, http.StatusTooManyRequests, nil},
		{"DELETE with X-Idempotency-Key is retried", request{method: http.MethodDelete, header: http.Header{"X-Idempotency-Key": {"k2"}}}, 1, answer429("0"), 2, http.StatusTooManyRequests, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newCountingServer(t, clockwork.NewRealClock(), tt.answer)
			b, err := throttle.NewLocal(1000, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			cc := &closeCounter{rt: srv.Client().Transport}
			opts := []httpclient.Option{httpclient.WithBase(cc)}
			if tt.retries >= 0 {
				opts = append(opts, httpclient.WithRetries(tt.retries))
			}
			opts = append(opts, tt.opts...)
			tr := mustTransport(t, throttle.New(b), opts...)
			var body io.Reader
			if tt.req.body != nil {
				body = tt.req.body()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, tt.req.method, srv.URL, body)
			for k, v := range tt.req.header {
				req.Header[k] = v
			}
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			if n := srv.count(); n != tt.wantSent {
				t.Errorf("the server saw %d requests, want %d", n, tt.wantSent)
			}
			if got, want := cc.closed.Load(), cc.bodies.Load()-1; got != want {
				t.Errorf("%d of the %d discarded response bodies were closed", got, want)
			}
			drain(resp)
			if tt.req.body != nil {
				for i, got := range srv.sentBodies() {
					if got != "b" {
						t.Errorf("request %d carried body %q, want %q", i+1, got, "b")
					}
				}
			}
		})
	}
}

// TestTransportNoRetryBeyondDeadline: a pause longer than the caller's
// deadline returns the 429 at once, and still pauses the limit.
func TestTransportNoRetryBeyondDeadline(t *testing.T) {
	clk := clockwork.NewFakeClock()
	srv := newCountingServer(t, clk, answer429("10"))
	b, err := throttle.NewLocal(1000, time.Second, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	tr := mustTransport(t, throttle.New(b, throttle.WithClock(clk)), httpclient.WithBase(srv.Client().Transport))
	client := &http.Client{Transport: tr}

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("Do: %v; want the 429 itself", err)
	}
	drain(resp)
	if resp.StatusCode != http.StatusTooManyRequests || srv.count() != 1 {
		t.Fatalf("got %s after %d requests; want the 429 after 1, as the 10 s pause is beyond the 1 s deadline", resp.Status, srv.count())
	}
	req, _ = http.NewRequestWithContext(httpclient.ContextWithMaxWait(context.Background(), 9*time.Second), http.MethodGet, srv.URL, nil)
	if _, err := client.Do(req); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("Do during the pause with maxWait 9 s: %v; want ErrTimeout", err)
	}
	if n := srv.count(); n != 1 {
		t.Errorf("the server saw %d requests; none may be sent during the pause", n)
	}
}

// TestTransportLocalPause: with a bucket that is not a Pauser, the
// Transport pauses itself (and only itself): its next request waits for
// the pause's end on the limiter's clock, while another Transport on the
// same bucket goes on.
func TestTransportLocalPause(t *testing.T) {
	clk := clockwork.NewFakeClock()
	srv := newCountingServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.Header().Set("X-RateLimit-Reset", "5")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		fmt.Fprint(w, "ok")
	})
	b, err := throttle.NewLocal(1000, time.Second, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	paused := &http.Client{Transport: mustTransport(t, throttle.New(b, throttle.WithClock(clk)), httpclient.WithBase(srv.Client().Transport), httpclient.WithRetries(0))}
	other := &http.Client{Transport: mustTransport(t, throttle.New(b, throttle.WithClock(clk)), httpclient.WithBase(srv.Client().Transport))}

	resp, err := paused.Get(srv.URL)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("first Get: %v, %v; want the 429", resp, err)
	}
	drain(resp)

	// Fails fast: the pause is beyond the request's wait.
	req, _ := http.NewRequestWithContext(httpclient.ContextWithMaxWait(context.Background(), time.Second), http.MethodGet, srv.URL, nil)
	if _, err := paused.Do(req); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("Get during the pause with maxWait 1 s: %v; want ErrTimeout", err)
	}

	// Another Transport does not share a local pause.
	resp, err = other.Get(srv.URL)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("Get through another Transport: %v, %v; want 200", resp, err)
	}
	drain(resp)

	// Waits for the pause's end, then goes.
	done := make(chan error, 1)
	go func() {
		resp, err := paused.Get(srv.URL)
		if err == nil {
			drain(resp)
		}
		done <- err
	}()
	bctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := clk.BlockUntilContext(bctx, 1); err != nil {
		t.Fatalf("the request did not wait for the pause: %v", err)
	}
	if n := srv.count(); n != 2 {
		t.Fatalf("the server saw %d requests; want 2 (the 429 and the other Transport's)", n)
	}
	clk.Advance(5 * time.Second)
	if err := <-done; err != nil {
		t.Fatalf("Get after the pause: %v", err)
	}
	if n := srv.count(); n != 3 {
		t.Errorf("the server saw %d requests, want 3", n)
	}
}

// pauseRecorder is a test-only Pauser bucket around a Local: it records
// every Pause and refuses while paused.
type pauseRecorder struct {
	throttle.Bucket
	clock clockwork.Clock

	mu     sync.Mutex
	pauses []string // "key=d"
	until  map[string]time.Time
}

func (p *pauseRecorder) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	p.mu.Lock()
	left := p.until[key].Sub(p.clock.Now())
	p.mu.Unlock()
	if left > 0 {
		return throttle.Decision{Delay: left, Remaining: -1}, nil
	}
	return p.Bucket.Take(ctx, key, n, maxWait)
}

func (p *pauseRecorder) Pause(_ context.Context, key string, d time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pauses = append(p.pauses, fmt.Sprintf("%s=%v", key, d))
	if u := p.clock.Now().Add(d); u.After(p.until[key]) {
		p.until[key] = u
	}
	return nil
}

// TestTransportPausesTheBucket: a Pauser bucket is paused under the
// request's key, for the time the provider named; WithRequestKey picks
// the key per request, and keys are independent.
func TestTransportPausesTheBucket(t *testing.T) {
	clk := clockwork.NewFakeClockAt(time.Unix(1_800_000_000, 0))
	hosts := map[string]int{}
	var mu sync.Mutex
	srv := newCountingServer(t, clk, func(_ int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hosts[r.URL.Path]++
		first := hosts[r.URL.Path] == 1
		mu.Unlock()
		if first && r.URL.Path == "/a" {
			w.Header().Set("X-RateLimit-Reset", "1800000003") // an epoch: 3 s from now
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		fmt.Fprint(w, "ok")
	})
	local, err := throttle.NewLocal(1000, time.Second, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	pb := &pauseRecorder{Bucket: local, clock: clk, until: map[string]time.Time{}}
	lim := throttle.New(pb, throttle.WithClock(clk))
	tr := mustTransport(t, nil, httpclient.WithBase(srv.Client().Transport), httpclient.WithRetries(0),
		httpclient.WithRequestKey(func(r *http.Request) throttle.Keyed { return lim.Key(r.URL.Path) }))
	client := &http.Client{Transport: tr}

	resp, err := client.Get(srv.URL + "/a")
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("Get /a: %v, %v; want the 429", resp, err)
	}
	drain(resp)
	pb.mu.Lock()
	got := strings.Join(pb.pauses, ",")
	pb.mu.Unlock()
	if got != "/a=3s" {
		t.Errorf("Pause calls: %q, want %q", got, "/a=3s")
	}
	req, _ := http.NewRequestWithContext(httpclient.ContextWithMaxWait(context.Background(), 0), http.MethodGet, srv.URL+"/a", nil)
	if _, err := client.Do(req); !errors.Is(err, throttle.ErrTimeout) {
		t.Errorf("Get /a during its pause: %v; want ErrTimeout", err)
	}
	resp, err = client.Get(srv.URL + "/b")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("Get /b, another key: %v, %v; want 200", resp, err)
	}
	drain(resp)
	if n := srv.count(); n != 2 {
		t.Errorf("the server saw %d requests, want 2", n)
	}
}

// TestTransportPerRequestKey: keys chosen per request have their own
// budgets; a zero Keyed falls back to the Transport's limiter.
func TestTransportPerRequestKey(t *testing.T) {
	srv := newCountingServer(t, clockwork.NewRealClock(), nil)
	b, err := throttle.NewLocal(1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	lim := throttle.New(b)
	tr := mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport), httpclient.WithMaxWait(0),
		httpclient.WithRequestKey(func(r *http.Request) throttle.Keyed {
			if tenant := r.Header.Get("X-Tenant"); tenant != "" {
				return lim.Key(tenant)
			}
			return throttle.Keyed{}
		}))
	client := &http.Client{Transport: tr}
	do := func(tenant string) error {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		if tenant != "" {
			req.Header.Set("X-Tenant", tenant)
		}
		resp, err := client.Do(req)
		if err == nil {
			drain(resp)
		}
		return err
	}
	for _, step := range []struct {
		tenant  string
		timeout bool
	}{{"a", false}, {"b", false}, {"a", true}, {"", false}, {"", true}, {"b", true}} {
		err := do(step.tenant)
		if step.timeout != errors.Is(err, throttle.ErrTimeout) {
			t.Errorf("tenant %q: %v; want timeout %v", step.tenant, err, step.timeout)
		}
	}
}

func TestNewTransportRefusesBadOptions(t *testing.T) {
	b, _ := throttle.NewLocal(1, time.Second)
	tests := []struct {
		name string
		lim  *throttle.Limiter
		opts []httpclient.Option
		want string
	}{
		{"nil limiter", nil, nil, "lim"},
		{"negative maxWait", throttle.New(b), []httpclient.Option{httpclient.WithMaxWait(-time.Second)}, "WithMaxWait"},
		{"negative retries", throttle.New(b), []httpclient.Option{httpclient.WithRetries(-1)}, "WithRetries"},
		// A cap left nil by an unchecked constructor would panic at the first request.
		{"nil pointer cap", throttle.New(b), []httpclient.Option{httpclient.WithConcurrency((*bucket.Concurrency)(nil))}, "WithConcurrency = (*bucket.Concurrency)(nil)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := httpclient.NewTransport(tt.lim, tt.opts...)
			if !errors.Is(err, throttle.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewTransport: %v; want ErrInvalid naming %s", err, tt.want)
			}
		})
	}
	if _, err := httpclient.NewTransport(nil, httpclient.WithRequestKey(func(*http.Request) throttle.Keyed { return throttle.Keyed{} })); err != nil {
		t.Errorf("NewTransport(nil, WithRequestKey): %v; a per-request limiter needs no default", err)
	}
}

// The error of a refused request names the request once (http.Client's
// *url.Error does), without its password.
func TestTransportErrorNamesTheRequestOnce(t *testing.T) {
	b, _ := throttle.NewLocal(1, time.Hour)
	lim := throttle.New(b)
	_ = lim.Acquire(context.Background(), 0)
	tr := mustTransport(t, lim, httpclient.WithMaxWait(0))
	u := &url.URL{Scheme: "http", Host: "127.0.0.1:1", Path: "/x", User: url.UserPassword("u", "secret")}
	req, _ := http.NewRequest(http.MethodGet, u.String(), nil)
	_, err := (&http.Client{Transport: tr}).Do(req)
	if err == nil || strings.Count(err.Error(), "127.0.0.1:1/x") != 1 || strings.Contains(err.Error(), "secret") || !errors.Is(err, throttle.ErrTimeout) {
		t.Errorf("Do: %v; want ErrTimeout, naming the redacted URL once", err)
	}
	var ue *url.Error
	if !errors.As(err, &ue) || ue.Op != "Get" {
		t.Errorf("Do: %v; want a *url.Error for the GET", err)
	}
}

// Guard an HTTP client: every request through it takes a permit first
// (here 10 per second, in memory; a fleet shares a Redis bucket instead).
// A request that cannot get a permit within its wait fails with
// ErrTimeout and is never sent; a 429 with Retry-After pauses the bucket.
func ExampleNewTransport() {
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello")
	}))
	defer provider.Close()

	b, err := throttle.NewLocal(10, time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	tr, err := httpclient.NewTransport(throttle.New(b), httpclient.WithMaxWait(2*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}

	resp, err := client.Get(provider.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.Status, string(body))
	// Output: 200 OK hello
}

// TestTransportPauseFromProviderHeaders: the pause a Pauser bucket gets
// for the provider's answers that misled the Transport before: a Unix time
// in RateLimit-Reset (GitLab) or in milliseconds in X-RateLimit-Reset was
// read as an hour-long delay, and a reset sent while calls remained (a 503
// during an outage) paused the fleet until the window's end.
func TestTransportPauseFromProviderHeaders(t *testing.T) {
	const now = 1_800_000_000
	tests := []struct {
		name   string
		status int
		header map[string]string
		want   string // the pauses recorded
	}{
		{"RateLimit-Reset Unix time", http.StatusTooManyRequests, map[string]string{"RateLimit-Reset": "1800000060", "RateLimit-Remaining": "0"}, "=1m0s"},
		{"X-RateLimit-Reset Unix time in ms", http.StatusTooManyRequests, map[string]string{"X-RateLimit-Reset": "1800000060000"}, "=1m0s"},
		{"503 with calls remaining", http.StatusServiceUnavailable, map[string]string{"X-RateLimit-Reset": "1800003000", "X-RateLimit-Remaining": "4999"}, ""},
		{"503 with nothing remaining", http.StatusServiceUnavailable, map[string]string{"X-RateLimit-Reset": "1800000030", "X-RateLimit-Remaining": "0"}, "=30s"},
		{"403 with Retry-After", http.StatusForbidden, map[string]string{"Retry-After": "20"}, "=20s"},
		{"403 without a retry time", http.StatusForbidden, map[string]string{"X-RateLimit-Reset": "1800000030", "X-RateLimit-Remaining": "40"}, ""},
		{"RateLimit draft -07 dictionary", http.StatusTooManyRequests, map[string]string{"RateLimit": "limit=100, remaining=0, reset=15"}, "=15s"},
		{"Anthropic requests exhausted", http.StatusTooManyRequests, map[string]string{"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": "2027-01-15T08:00:30Z"}, "=30s"},
		{"OpenAI 429 with tokens left", http.StatusTooManyRequests, map[string]string{"x-ratelimit-remaining-tokens": "40", "x-ratelimit-reset-tokens": "30s"}, ""},
		{"OpenAI 503 with tokens exhausted", http.StatusServiceUnavailable, map[string]string{"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1m30.5s"}, "=1m30.5s"},
		{"OpenAI retry-after-ms", http.StatusTooManyRequests, map[string]string{"retry-after-ms": "250"}, "=250ms"},
		{"instance 5 s behind the provider", http.StatusTooManyRequests, map[string]string{"X-RateLimit-Reset": "1800000007"}, "=2s"},
		{"instance 5 s ahead of the provider", http.StatusTooManyRequests, map[string]string{"X-RateLimit-Reset": "1799999997"}, "=2s"},
		{"instance 5 s behind, HTTP date", http.StatusServiceUnavailable, map[string]string{"Retry-After": time.Unix(1800000007, 0).UTC().Format(http.TimeFormat)}, "=2s"},
	}
	// How far the provider's clock, which writes the Date header, is ahead
	// of the instance's.
	ahead := map[string]time.Duration{
		"instance 5 s behind the provider":   5 * time.Second,
		"instance 5 s ahead of the provider": -5 * time.Second,
		"instance 5 s behind, HTTP date":     5 * time.Second,
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clockwork.NewFakeClockAt(time.Unix(now, 0))
			srv := newCountingServer(t, clk, func(_ int, w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Date", clk.Now().Add(ahead[tt.name]).UTC().Format(http.TimeFormat))
				for k, v := range tt.header {
					w.Header().Set(k, v)
				}
				http.Error(w, "no", tt.status)
			})
			local, err := throttle.NewLocal(1000, time.Second, throttle.WithClock(clk))
			if err != nil {
				t.Fatal(err)
			}
			pb := &pauseRecorder{Bucket: local, clock: clk, until: map[string]time.Time{}}
			tr := mustTransport(t, throttle.New(pb, throttle.WithClock(clk)), httpclient.WithBase(srv.Client().Transport), httpclient.WithRetries(0))
			resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
			if err != nil || resp.StatusCode != tt.status {
				t.Fatalf("Get: %v, %v; want the %d", resp, err, tt.status)
			}
			drain(resp)
			pb.mu.Lock()
			got := strings.Join(pb.pauses, ",")
			pb.mu.Unlock()
			if got != tt.want {
				t.Errorf("pauses %q, want %q", got, tt.want)
			}
		})
	}
}

// countingWrapper is a wrapper a user might write: it counts takes and
// offers Unwrap, and has no Pause of its own.
type countingWrapper struct {
	throttle.Bucket
	takes atomic.Int64
}

func (w *countingWrapper) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	w.takes.Add(1)
	return w.Bucket.Take(ctx, key, n, maxWait)
}

func (w *countingWrapper) Unwrap() throttle.Bucket { return w.Bucket }

// TestTransportPausesTheBucketBehindAWrapper: a provider's pause reaches
// the bucket behind a user's wrapper that offers Unwrap, as the Limiter
// finds the bucket's other methods (the Transport does not look at the
// wrapper only, which would pause nothing for the fleet).
func TestTransportPausesTheBucketBehindAWrapper(t *testing.T) {
	clk := clockwork.NewFakeClockAt(time.Unix(1_800_000_000, 0))
	srv := newCountingServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.Header().Set("Retry-After", "3")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		fmt.Fprint(w, "ok")
	})
	local, err := throttle.NewLocal(1000, time.Second, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	pb := &pauseRecorder{Bucket: local, clock: clk, until: map[string]time.Time{}}
	wrapped := &countingWrapper{Bucket: pb}
	lim := throttle.New(wrapped, throttle.WithClock(clk))
	defer lim.Close()
	tr := mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport), httpclient.WithRetries(0))
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("Get: %v, %v; want the 429", resp, err)
	}
	drain(resp)
	pb.mu.Lock()
	got := strings.Join(pb.pauses, ",")
	pb.mu.Unlock()
	if !strings.HasPrefix(got, "=3s") {
		t.Errorf("Pause calls on the wrapped bucket: %q, want the provider's 3s for key \"\"", got)
	}
	if wrapped.takes.Load() == 0 {
		t.Error("the wrapper saw no take")
	}
}

// TestTransportRequestKeyOfANilLimiterIsTheTransportsOwn: a request key
// built from a nil Limiter (a map of limiters without the request's host,
// say) means the Transport's own limiter, as a zero Keyed does; it used
// to, while the Transport told one from the other by the Keyed's Limiter.
func TestTransportRequestKeyOfANilLimiterIsTheTransportsOwn(t *testing.T) {
	clk := clockwork.NewFakeClockAt(time.Unix(1_800_000_000, 0))
	srv := newCountingServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
	})
	local, err := throttle.NewLocal(1000, time.Second, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	lim := throttle.New(local, throttle.WithClock(clk))
	defer lim.Close()
	var none map[string]*throttle.Limiter
	tr := mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport),
		httpclient.WithRequestKey(func(r *http.Request) throttle.Keyed {
			return none[r.URL.Host].Key(r.URL.Host)
		}))
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
	if err != nil {
		t.Fatalf("Get: %v; want the Transport's own limiter used", err)
	}
	if got := drain(resp); got != "ok" {
		t.Errorf("body %q, want ok", got)
	}
}
