package httpclient_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

// grantCounter counts the permits its bucket grants, per key: the
// bucket's side of the count, apart from the Limiter and the Transport.
type grantCounter struct {
	throttle.Bucket
	mu     sync.Mutex
	grants map[string]int
}

func countGrants(b throttle.Bucket) *grantCounter {
	return &grantCounter{Bucket: b, grants: map[string]int{}}
}

func (g *grantCounter) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	d, err := g.Bucket.Take(ctx, key, n, maxWait)
	if err == nil && d.Granted {
		g.mu.Lock()
		g.grants[key] += int(n)
		g.mu.Unlock()
	}
	return d, err
}

func (g *grantCounter) of(key string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.grants[key]
}

func (g *grantCounter) total() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, v := range g.grants {
		n += v
	}
	return n
}

// attempt does what the consumer of package consumer does for one
// attempt at a record: it takes a permit of k and calls handle with a
// context that holds it.
func attempt(t *testing.T, k throttle.Keyed, handle func(ctx context.Context)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // the handler timeout
	defer cancel()
	if k == (throttle.Keyed{}) { // a consumer without a Limiter takes none
		handle(ctx)
		return
	}
	require.NoError(t, k.Acquire(ctx, throttle.Forever), "the consumer's permit")
	handle(k.ContextWithPermit(ctx, 1))
}

// get sends a GET with ctx through client and returns its status.
func get(t *testing.T, ctx context.Context, client *http.Client, url string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	drain(resp)
	return resp.StatusCode
}

func localBucket(t *testing.T, clock clockwork.Clock, limit int64) *grantCounter {
	t.Helper()
	b, err := throttle.NewLocal(limit, time.Second, throttle.WithClock(clock))
	require.NoError(t, err)
	return countGrants(b)
}

// The wiring a user writes first, the same Limiter to the consumer and
// the Transport, charges each attempt one permit: counted at the bucket
// and, by arrival, at the provider.
func TestSameLimiterChargesOnePermitPerAttempt(t *testing.T) {
	srv := newCountingServer(t, clockwork.NewRealClock(), nil)
	b := localBucket(t, clockwork.NewRealClock(), 1000)
	lim := throttle.New(b)
	client := &http.Client{Transport: mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport))}
	const attempts = 20
	for range attempts {
		attempt(t, lim.Key(""), func(ctx context.Context) {
			assert.Equal(t, http.StatusOK, get(t, ctx, client, srv.URL))
		})
	}
	assert.Equal(t, attempts, srv.count(), "provider arrivals")
	assert.Equal(t, attempts, b.total(), "bucket grants: one per attempt, the consumer's, used by the Transport")
}

// A consumer without a Limiter passes no permit: the Transport takes one
// per request, one per attempt for a handler that makes one request.
func TestTransportAloneChargesOnePermitPerAttempt(t *testing.T) {
	srv := newCountingServer(t, clockwork.NewRealClock(), nil)
	b := localBucket(t, clockwork.NewRealClock(), 1000)
	client := &http.Client{Transport: mustTransport(t, throttle.New(b), httpclient.WithBase(srv.Client().Transport))}
	const attempts = 20
	for range attempts {
		attempt(t, throttle.Keyed{}, func(ctx context.Context) { // consumer.New(h, nil, ...): no permit, nothing held
			assert.Equal(t, http.StatusOK, get(t, ctx, client, srv.URL))
		})
	}
	assert.Equal(t, attempts, srv.count(), "provider arrivals")
	assert.Equal(t, attempts, b.total(), "bucket grants")
}

// A handler that makes two requests makes two calls: the second takes a
// permit of its own, as does a request made with a context that does not
// come from the handler's (the attempt is then charged twice).
func TestSecondRequestAndForeignContextTakeTheirOwnPermits(t *testing.T) {
	srv := newCountingServer(t, clockwork.NewRealClock(), nil)
	b := localBucket(t, clockwork.NewRealClock(), 1000)
	lim := throttle.New(b)
	client := &http.Client{Transport: mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport))}

	attempt(t, lim.Key(""), func(ctx context.Context) {
		get(t, ctx, client, srv.URL)
		get(t, ctx, client, srv.URL)
	})
	assert.Equal(t, 2, srv.count())
	assert.Equal(t, 2, b.total(), "two requests, two permits: the held one and the second's own")

	attempt(t, lim.Key(""), func(ctx context.Context) {
		get(t, context.Background(), client, srv.URL)
	})
	assert.Equal(t, 3, srv.count())
	assert.Equal(t, 4, b.total(), "a request without the handler's context does not see its permit")
}

// Concurrent requests of one attempt share its one held permit: exactly
// one of them uses it.
func TestConcurrentRequestsUseTheHeldPermitOnce(t *testing.T) {
	srv := newCountingServer(t, clockwork.NewRealClock(), nil)
	b := localBucket(t, clockwork.NewRealClock(), 1000)
	lim := throttle.New(b)
	client := &http.Client{Transport: mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport))}
	const parallel = 8
	attempt(t, lim.Key(""), func(ctx context.Context) {
		var wg sync.WaitGroup
		for range parallel {
			wg.Go(func() { get(t, ctx, client, srv.URL) })
		}
		wg.Wait()
	})
	assert.Equal(t, parallel, srv.count())
	assert.Equal(t, parallel, b.total(), "one permit per request: the held one, and one each for the rest")
}

// Per-key budgets: a record's key and its request's key that match use
// one permit; different keys are different budgets, both charged.
func TestRequestKeyComposesWithTheRecordsKey(t *testing.T) {
	srv := newCountingServer(t, clockwork.NewRealClock(), nil)
	b := localBucket(t, clockwork.NewRealClock(), 1000)
	lim := throttle.New(b)
	client := &http.Client{Transport: mustTransport(t, nil, httpclient.WithBase(srv.Client().Transport),
		httpclient.WithRequestKey(func(r *http.Request) throttle.Keyed { return lim.Key(r.Header.Get("X-Tenant")) }))}
	send := func(ctx context.Context, tenant string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		require.NoError(t, err)
		req.Header.Set("X-Tenant", tenant)
		resp, err := client.Do(req)
		require.NoError(t, err)
		drain(resp)
	}

	attempt(t, lim.Key("acme"), func(ctx context.Context) { send(ctx, "acme") })
	assert.Equal(t, 1, b.of("acme"), "the same key: the record's permit serves its request")

	attempt(t, lim.Key("acme"), func(ctx context.Context) { send(ctx, "globex") })
	assert.Equal(t, 2, b.of("acme"), "the record's budget is charged")
	assert.Equal(t, 1, b.of("globex"), "and the request's own, another budget")
	assert.Equal(t, 2, srv.count())
}

// A held permit is used at once, whatever the Transport's maxWait: the
// consumer waited for it under its own bound. A request that takes its
// own permit waits at most the Transport's maxWait and its deadline.
func TestHeldPermitServesAtOnceWhateverTheWait(t *testing.T) {
	srv := newCountingServer(t, clockwork.NewRealClock(), nil)
	b := localBucket(t, clockwork.NewRealClock(), 1) // one permit per second
	lim := throttle.New(b)
	client := &http.Client{Transport: mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport), httpclient.WithMaxWait(0))}

	attempt(t, lim.Key(""), func(ctx context.Context) {
		assert.Equal(t, http.StatusOK, get(t, ctx, client, srv.URL), "the held permit, with maxWait 0 and the bucket empty")
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		require.NoError(t, err)
		_, err = client.Do(req)
		assert.ErrorIs(t, err, throttle.ErrTimeout, "a second request needs its own permit, within maxWait 0")
	})
	assert.Equal(t, 1, srv.count())
}

// A retry after the provider's pause is a new call to the provider: it
// takes a permit of its own, after the pause.
func TestRetryAfterPauseTakesItsOwnPermit(t *testing.T) {
	clk := clockwork.NewFakeClock()
	srv := newCountingServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			answer429("2")(n, w, r)
			return
		}
		fmt.Fprint(w, "ok")
	})
	b := localBucket(t, clk, 1000)
	lim := throttle.New(b, throttle.WithClock(clk))
	client := &http.Client{Transport: mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport))}

	done := make(chan int, 1)
	go attempt(t, lim.Key(""), func(ctx context.Context) { done <- get(t, ctx, client, srv.URL) })
	waitSleepers(t, clk, 1) // the retry waits out the pause
	assert.Equal(t, 1, srv.count())
	assert.Equal(t, 1, b.total(), "the first send used the held permit")
	clk.Advance(2 * time.Second)
	assert.Equal(t, http.StatusOK, <-done)
	assert.Equal(t, 2, srv.count(), "provider arrivals: the 429 and the retry")
	assert.Equal(t, 2, b.total(), "the retry took its own permit")
}

// A request that finds the budget paused (a 429 with Retry-After seen by
// this Transport) waits out the pause and takes a new permit: the one it
// holds was taken before the pause, for a time the provider refused, and
// is given up, also for the handler's later requests.
func TestHeldPermitIsGivenUpAfterWaitingOutAPause(t *testing.T) {
	clk := clockwork.NewFakeClock()
	srv := newCountingServer(t, clk, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			answer429("3")(n, w, r)
			return
		}
		fmt.Fprint(w, "ok")
	})
	b := localBucket(t, clk, 1000) // not a Pauser: only the Transport pauses
	lim := throttle.New(b, throttle.WithClock(clk))
	client := &http.Client{Transport: mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport), httpclient.WithRetries(0))}

	// The consumer took the next record's permit before the 429 came.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, lim.Acquire(ctx, 0))
	next := lim.Key("").ContextWithPermit(ctx, 1)
	attempt(t, lim.Key(""), func(ctx context.Context) {
		assert.Equal(t, http.StatusTooManyRequests, get(t, ctx, client, srv.URL))
	})
	require.Equal(t, 2, b.total())

	// Its request waits for the pause's end.
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert.Equal(t, http.StatusOK, get(t, next, client, srv.URL))
		require.NoError(t, lim.Acquire(next, 0), "a later call of the attempt")
	}()
	waitSleepers(t, clk, 1)
	assert.Equal(t, 2, b.total(), "nothing taken during the pause")
	assert.Equal(t, 1, srv.count(), "nothing sent during the pause")
	clk.Advance(3 * time.Second)
	<-done
	assert.Equal(t, 2, srv.count())
	assert.Equal(t, 4, b.total(), "the request after the pause and the later call each took a permit of their own")
}

// A request whose body cannot be had again is not retried after a 429:
// the handler gets the 429, and the attempt cost one permit, the held one.
func TestNotReplayableRequestReturnsTheRefusal(t *testing.T) {
	clk := clockwork.NewFakeClock()
	srv := newCountingServer(t, clk, answer429("1"))
	b := localBucket(t, clk, 1000)
	lim := throttle.New(b, throttle.WithClock(clk))
	client := &http.Client{Transport: mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport))}
	attempt(t, lim.Key(""), func(ctx context.Context) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, oneShot(strings.NewReader("payload")))
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		drain(resp)
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	})
	assert.Equal(t, 1, srv.count())
	assert.Equal(t, 1, b.total())
}

// oneShot hides a reader's type, so that http.NewRequest cannot set
// GetBody: the body can be read once.
func oneShot(r *strings.Reader) interface{ Read([]byte) (int, error) } {
	return struct{ *strings.Reader }{r}
}

// waitSleepers waits until n goroutines sleep on clk.
func waitSleepers(t *testing.T, clk *clockwork.FakeClock, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := clk.BlockUntilContext(ctx, n); err != nil {
		t.Fatalf("waiting for %d sleepers: %v", n, err)
	}
}

// The default base keeps the connections of a burst of concurrent calls
// for the next burst: http.DefaultTransport kept 2 per host and opened
// (and closed) a connection for every other call of each burst. WithBase
// still decides when given.
func TestDefaultBaseKeepsConnectionsForABurst(t *testing.T) {
	const burst = 32
	var opened atomic.Int64
	var arrived sync.WaitGroup
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		arrived.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done := make(chan struct{})
		go func() { arrived.Wait(); close(done) }()
		select { // answer once the whole burst is in: every call holds a connection
		case <-done:
		case <-ctx.Done():
		}
		fmt.Fprint(w, "ok")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	b, err := throttle.NewLocal(1000, time.Second)
	require.NoError(t, err)
	lim := throttle.New(b)

	opens := func(tr *httpclient.Transport) (first, second int64) {
		defer tr.CloseIdleConnections()
		client := &http.Client{Transport: tr}
		for round := range 2 {
			before := opened.Load()
			arrived.Add(burst)
			var wg sync.WaitGroup
			for range burst {
				wg.Go(func() { get(t, context.Background(), client, srv.URL) })
			}
			wg.Wait()
			if round == 0 {
				first = opened.Load() - before
			} else {
				second = opened.Load() - before
			}
		}
		return first, second
	}
	first, second := opens(mustTransport(t, lim))
	assert.EqualValues(t, burst, first, "the first burst opens a connection per call")
	assert.Zero(t, second, "the second burst reuses them all")

	first, second = opens(mustTransport(t, lim, httpclient.WithBase(&http.Transport{MaxIdleConnsPerHost: 1})))
	assert.EqualValues(t, burst, first)
	assert.EqualValues(t, burst-1, second, "a base given with WithBase keeps its own pool: 1 idle connection per host")
}

// countingRT counts the requests it passes on.
type countingRT struct {
	http.RoundTripper
	n atomic.Int64
}

func (c *countingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.RoundTripper.RoundTrip(r)
}

// A program that replaced http.DefaultTransport (to trace every call, say)
// keeps it: the default base is a sized clone only of an *http.Transport.
func TestDefaultBaseKeepsAReplacedDefaultTransport(t *testing.T) {
	srv := newCountingServer(t, clockwork.NewRealClock(), nil)
	orig := http.DefaultTransport
	rt := &countingRT{RoundTripper: srv.Client().Transport}
	http.DefaultTransport = rt
	defer func() { http.DefaultTransport = orig }()
	b, err := throttle.NewLocal(1000, time.Second)
	require.NoError(t, err)
	client := &http.Client{Transport: mustTransport(t, throttle.New(b))}
	assert.Equal(t, http.StatusOK, get(t, context.Background(), client, srv.URL))
	assert.EqualValues(t, 1, rt.n.Load(), "the request went through the replaced DefaultTransport")
}

// A provider whose headers lie: a Retry-After of days on a 429 pauses the
// fleet for at most an hour (and still counts as a refusal), and a
// Retry-After on a success pauses nothing and teaches nothing.
func TestLyingRetryAfterIsCappedAndASuccessIsNotARefusal(t *testing.T) {
	for _, tt := range []struct {
		name   string
		status int
		pauses string
		paced  bool
	}{
		{"429 with days", http.StatusTooManyRequests, "=1h0m0s", true},
		{"200 with a retry time", http.StatusOK, "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := clockwork.NewFakeClockAt(time.Unix(1_800_000_000, 0))
			srv := newCountingServer(t, clk, func(_ int, w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Retry-After", "999999")
				w.WriteHeader(tt.status)
			})
			local, err := throttle.NewLocal(50, time.Second, throttle.WithClock(clk))
			require.NoError(t, err)
			pb := &pauseRecorder{Bucket: local, clock: clk, until: map[string]time.Time{}}
			lim := throttle.New(knownRate{pb}, throttle.WithClock(clk))
			client := &http.Client{Transport: mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport), httpclient.WithRetries(0))}
			assert.Equal(t, tt.status, get(t, context.Background(), client, srv.URL))
			pb.mu.Lock()
			got := strings.Join(pb.pauses, ",")
			pb.mu.Unlock()
			assert.Equal(t, tt.pauses, got)
			s, err := lim.Key("").AdaptiveState(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tt.paced, s.Active())
		})
	}
}

// knownRate is a pauseRecorder that tells the Limiter its limit (50 per
// second), so that the Limiter can adapt.
type knownRate struct{ *pauseRecorder }

func (k knownRate) Fallback() (int64, time.Duration, int64) { return 50, time.Second, 1 }

// A permit held for another budget (the consumer's Limiter over another
// bucket) does not serve the Transport's request: each bucket is charged
// once, and the held permit is still there for its own budget.
func TestHeldPermitOfAnotherBucketIsNotUsed(t *testing.T) {
	srv := newCountingServer(t, clockwork.NewRealClock(), nil)
	consumerBucket := localBucket(t, clockwork.NewRealClock(), 1000)
	transportBucket := localBucket(t, clockwork.NewRealClock(), 1000)
	consumerLim, transportLim := throttle.New(consumerBucket), throttle.New(transportBucket)
	client := &http.Client{Transport: mustTransport(t, transportLim, httpclient.WithBase(srv.Client().Transport), httpclient.WithMaxWait(0))}

	attempt(t, consumerLim.Key(""), func(ctx context.Context) {
		assert.Equal(t, http.StatusOK, get(t, ctx, client, srv.URL))
		require.NoError(t, consumerLim.Acquire(ctx, 0))
	})
	assert.Equal(t, 1, srv.count())
	assert.Equal(t, 1, transportBucket.total(), "the Transport's budget took its own permit")
	assert.Equal(t, 1, consumerBucket.total(), "the consumer's permit was left for its own budget's next Acquire")
}

// One Transport that serves two Limiters (WithRequestKey picks one per
// request) uses each attempt's permit for its own Limiter only, and a
// 429 with Retry-After for one Limiter pauses that one alone.
func TestTransportSharedByTwoLimitersKeepsTheirPermitsAndPausesApart(t *testing.T) {
	clk := clockwork.NewFakeClock()
	srv := newCountingServer(t, clk, func(_ int, w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Budget") == "a" && r.URL.Query().Get("refuse") != "" {
			answer429("5")(0, w, r)
			return
		}
		fmt.Fprint(w, "ok")
	})
	ba, bb := localBucket(t, clk, 1000), localBucket(t, clk, 1000)
	la, lb := throttle.New(ba, throttle.WithClock(clk)), throttle.New(bb, throttle.WithClock(clk))
	client := &http.Client{Transport: mustTransport(t, nil, httpclient.WithBase(srv.Client().Transport), httpclient.WithRetries(0),
		httpclient.WithRequestKey(func(r *http.Request) throttle.Keyed {
			if r.Header.Get("X-Budget") == "a" {
				return la.Key("")
			}
			return lb.Key("")
		}))}
	send := func(ctx context.Context, budget, query string) int {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+query, nil)
		require.NoError(t, err)
		req.Header.Set("X-Budget", budget)
		resp, err := client.Do(req)
		require.NoError(t, err)
		drain(resp)
		return resp.StatusCode
	}

	attempt(t, la.Key(""), func(ctx context.Context) { send(ctx, "a", "") })
	attempt(t, lb.Key(""), func(ctx context.Context) { send(ctx, "b", "") })
	assert.Equal(t, 1, ba.total(), "a: one permit for its attempt")
	assert.Equal(t, 1, bb.total(), "b: one permit for its attempt")

	attempt(t, la.Key(""), func(ctx context.Context) {
		assert.Equal(t, http.StatusTooManyRequests, send(ctx, "a", "?refuse=1"))
	})
	attempt(t, lb.Key(""), func(ctx context.Context) {
		assert.Equal(t, http.StatusOK, send(ctx, "b", ""), "b is not paused by a's refusal")
	})
	assert.Equal(t, 2, bb.total())
	assert.Equal(t, 4, srv.count())

	done := make(chan int, 1)
	go attempt(t, la.Key(""), func(ctx context.Context) { done <- send(ctx, "a", "") })
	waitSleepers(t, clk, 1) // a's attempt waits out its pause for its permit
	assert.Equal(t, 4, srv.count(), "nothing sent for a during its pause")
	assert.Equal(t, 2, ba.total(), "nothing taken for a during its pause")
	clk.Advance(5 * time.Second)
	assert.Equal(t, http.StatusOK, <-done)
	assert.Equal(t, 5, srv.count())
	assert.Equal(t, 3, ba.total(), "a: the attempt's permit, taken after the pause, served its request")
}
