package httpclient_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

// TestReadAnswerAccountingHeaders: OpenAI's and Anthropic's per-dimension
// headers, as they come and as they should not.
func TestReadAnswerAccountingHeaders(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	openAI := func(remReq, resetReq, remTok, resetTok string) map[string]string {
		return map[string]string{
			"x-ratelimit-limit-requests": "500", "x-ratelimit-limit-tokens": "30000",
			"x-ratelimit-remaining-requests": remReq, "x-ratelimit-reset-requests": resetReq,
			"x-ratelimit-remaining-tokens": remTok, "x-ratelimit-reset-tokens": resetTok,
		}
	}
	perMinute := func(a throttle.Answer, limit int64) throttle.Answer {
		a.Limit, a.Window = limit, time.Minute
		return a
	}
	tests := []struct {
		name   string
		status int
		h      map[string]string
		want   throttle.Answer
	}{
		{"OpenAI success within limits", 200, openAI("499", "120ms", "29000", "2s"), perMinute(throttle.Answer{}, 500)},
		// A success that spends the last request holds requests for a
		// request's share of the time until they are fully restored
		// (reset / limit); a refusal, or tokens, for the whole reset.
		{"OpenAI tokens exhausted: the reset", 200, openAI("499", "120ms", "0", "6m0s"), perMinute(throttle.Answer{Retry: true, RetryAfter: 6 * time.Minute}, 500)},
		{"OpenAI requests exhausted: a request's share of the reset", 200, openAI("0", "20s", "100", "1s"), perMinute(throttle.Answer{Retry: true, RetryAfter: 40 * time.Millisecond}, 500)},
		{"OpenAI 429, requests at 0: the whole reset", 429, openAI("0", "20s", "100", "1s"), perMinute(throttle.Answer{Refused: true, Retry: true, RetryAfter: 20 * time.Second}, 500)},
		{"OpenAI both exhausted: the longer hold", 200, openAI("0", "1m30.5s", "0", "1s"), perMinute(throttle.Answer{Retry: true, RetryAfter: time.Second}, 500)},
		{"OpenAI requests exhausted, a limit of 1: the reset", 200, map[string]string{"x-ratelimit-limit-requests": "1", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "20s"}, perMinute(throttle.Answer{Retry: true, RetryAfter: 20 * time.Second}, 1)},
		{"OpenAI 503, requests at 0: the reset", 503, openAI("0", "20s", "100", "1s"), perMinute(throttle.Answer{Retry: true, RetryAfter: 20 * time.Second}, 500)},
		{"OpenAI 429 with retry-after", 429, map[string]string{"retry-after": "3", "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "9s"}, throttle.Answer{Refused: true, Retry: true, RetryAfter: 3 * time.Second}},
		{"OpenAI 429, none at 0: no pause", 429, openAI("3", "2s", "50", "7s"), perMinute(throttle.Answer{Refused: true}, 500)},
		{"OpenAI retry-after-ms first", 429, map[string]string{"retry-after-ms": "1500.5", "retry-after": "2"}, throttle.Answer{Refused: true, Retry: true, RetryAfter: 1500*time.Millisecond + 500*time.Microsecond}},
		{"retry-after-ms huge is capped at an hour", 429, map[string]string{"retry-after-ms": "99999999999999999999999"}, throttle.Answer{Refused: true, Retry: true, RetryAfter: time.Hour}},
		{"retry-after-ms garbage falls back", 429, map[string]string{"retry-after-ms": "-3", "retry-after": "2"}, throttle.Answer{Refused: true, Retry: true, RetryAfter: 2 * time.Second}},
		{"retry-after-ms on a success is no limit", 200, map[string]string{"retry-after-ms": "300"}, throttle.Answer{}},
		{"OpenAI reset in plain seconds", 200, map[string]string{"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1.5"}, throttle.Answer{Retry: true, RetryAfter: 1500 * time.Millisecond}},
		{"OpenAI negative reset ignored", 200, map[string]string{"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "-5s"}, throttle.Answer{}},
		{"OpenAI overflowing reset ignored", 200, map[string]string{"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "9999999999999h"}, throttle.Answer{}},
		{"OpenAI huge reset capped at an hour", 200, map[string]string{"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "2500000h"}, throttle.Answer{Retry: true, RetryAfter: time.Hour}},
		{"OpenAI daily reset capped at an hour", 200, map[string]string{"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "23h59m"}, throttle.Answer{Retry: true, RetryAfter: time.Hour}},
		{"OpenAI garbage", 200, map[string]string{"x-ratelimit-limit-requests": "NaN", "x-ratelimit-remaining-tokens": "-0", "x-ratelimit-reset-tokens": "soon"}, throttle.Answer{}},
		{"OpenAI remaining not 0", 200, map[string]string{"x-ratelimit-remaining-tokens": "1e0", "x-ratelimit-reset-tokens": "1s"}, throttle.Answer{}},
		{"OpenAI negative limit ignored", 200, map[string]string{"x-ratelimit-limit-requests": "-500"}, throttle.Answer{}},
		{"the smaller requests limit wins", 200, map[string]string{"x-ratelimit-limit-requests": "500", "anthropic-ratelimit-requests-limit": "50"}, perMinute(throttle.Answer{}, 50)},
		{"a slower X-RateLimit-Limit per second is not it", 200, map[string]string{"x-ratelimit-limit-requests": "6000", "X-RateLimit-Limit": "20"}, throttle.Answer{Limit: 20}},
		{"Anthropic output tokens exhausted", 200, map[string]string{
			"anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "49", "anthropic-ratelimit-requests-reset": "2026-03-01T12:00:01Z",
			"anthropic-ratelimit-output-tokens-limit": "8000", "anthropic-ratelimit-output-tokens-remaining": "0", "anthropic-ratelimit-output-tokens-reset": "2026-03-01T12:00:12Z",
		}, perMinute(throttle.Answer{Retry: true, RetryAfter: 12 * time.Second}, 50)},
		{"Anthropic input and tokens exhausted", 200, map[string]string{
			"anthropic-ratelimit-input-tokens-remaining": "0", "anthropic-ratelimit-input-tokens-reset": "2026-03-01T12:00:05.5Z",
			"anthropic-ratelimit-tokens-remaining": "0", "anthropic-ratelimit-tokens-reset": "2026-03-01T13:00:04+01:00",
		}, throttle.Answer{Retry: true, RetryAfter: 5500 * time.Millisecond}},
		{"Anthropic reset in the past", 200, map[string]string{"anthropic-ratelimit-tokens-remaining": "0", "anthropic-ratelimit-tokens-reset": "2026-03-01T11:00:00Z"}, throttle.Answer{Retry: true}},
		{"Anthropic reset not RFC 3339", 200, map[string]string{"anthropic-ratelimit-tokens-remaining": "0", "anthropic-ratelimit-tokens-reset": "30"}, throttle.Answer{}},
		{"Anthropic 429 with retry-after", 429, map[string]string{"retry-after": "4", "anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": "2026-03-01T12:00:30Z"}, throttle.Answer{Refused: true, Retry: true, RetryAfter: 4 * time.Second}},
		{"Anthropic 429 without retry-after, requests at 0", 429, map[string]string{"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": "2026-03-01T12:00:30Z"}, throttle.Answer{Refused: true, Retry: true, RetryAfter: 30 * time.Second}},
		{"503 with tokens left is no limit", 503, openAI("3", "2s", "50", "7s"), perMinute(throttle.Answer{}, 500)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := &http.Response{StatusCode: tt.status, Header: http.Header{}}
			for k, v := range tt.h {
				resp.Header.Set(k, v)
			}
			assert.Equal(t, tt.want, httpclient.ReadAnswer(resp, now))
		})
	}
}

// FuzzReadAnswerAccountingHeaders checks that no value of the accounting
// headers makes ReadAnswer panic, or answer a negative or overflowing
// wait, a negative limit or window.
func FuzzReadAnswerAccountingHeaders(f *testing.F) {
	for _, s := range []string{
		"", "0", "1s", "6m0s", "20ms", "1m30.5s", "0s", "1.5", "-1s", "+1s", "1e9", "NaN", "Inf", "-0", " 7s ",
		"9999999999999h", "2562047h47m16.854775807s", "2562047h47m16.854775808s", "1h1h1h1h", ".5s", "5.s", "1µs",
		"2026-03-01T12:00:12Z", "2026-03-01T12:00:05.5+01:00", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "2026-13-01T00:00:00Z",
		"500", "30000", "99999999999999999999999999", "9223372036854775807", "-500",
	} {
		f.Add(s, s, s, "")
		f.Add(s, "0", s, "Sun, 01 Mar 2026 11:59:55 GMT")
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, limit, remaining, reset, date string) {
		if a := httpclient.ReadAnswer(nil, now); a != (throttle.Answer{}) {
			t.Fatalf("ReadAnswer(nil) = %+v", a)
		}
		for _, status := range []int{200, 429, 503} {
			for _, prefix := range []string{"x-ratelimit-%s-requests", "x-ratelimit-%s-tokens", "anthropic-ratelimit-tokens-%s", "anthropic-ratelimit-output-tokens-%s"} {
				h := http.Header{}
				h.Set(sprintf(prefix, "limit"), limit)
				h.Set(sprintf(prefix, "remaining"), remaining)
				h.Set(sprintf(prefix, "reset"), reset)
				h.Set("retry-after-ms", limit)
				if date != "" {
					h.Set("Date", date)
				}
				a := httpclient.ReadAnswer(&http.Response{StatusCode: status, Header: h}, now)
				if a.RetryAfter < 0 || a.RetryAfter > time.Hour {
					t.Fatalf("%d %s (%q, %q, %q, Date %q): RetryAfter %v out of [0, 1h]", status, prefix, limit, remaining, reset, date, a.RetryAfter)
				}
				if !a.Retry && a.RetryAfter != 0 {
					t.Fatalf("%d %s: RetryAfter %v without Retry", status, prefix, a.RetryAfter)
				}
				if a.Limit < 0 || a.Window < 0 {
					t.Fatalf("%d %s (%q): Limit %d per %v", status, prefix, limit, a.Limit, a.Window)
				}
				if status != 429 && a.Refused {
					t.Fatalf("%d: Refused", status)
				}
			}
		}
	})
}

// sprintf replaces the one %s of format with s.
func sprintf(format, s string) string {
	for i := 0; i+1 < len(format); i++ {
		if format[i] == '%' && format[i+1] == 's' {
			return format[:i] + s + format[i+2:]
		}
	}
	return format
}

// TestTransportPausesTheFleetWhenTokensRunOut: one instance's call is
// answered 200 with x-ratelimit-remaining-tokens 0 and a reset in 1 s,
// naming no limit (so no token's share of the reset can be told); another
// instance (its own Transport, Limiter and Redis connection on one Redis
// token bucket) can send nothing until the reset.
func TestTransportPausesTheFleetWhenTokensRunOut(t *testing.T) {
	rs := redisenv.New(t)
	var answered atomic.Int64 // UnixNano when the exhausted answer left
	srv := newCountingServer(t, clockwork.NewRealClock(), func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.Header().Set("x-ratelimit-remaining-tokens", "0")
			w.Header().Set("x-ratelimit-reset-tokens", "1s")
			answered.Store(time.Now().UnixNano())
		} else {
			w.Header().Set("x-ratelimit-limit-tokens", "1000")
			w.Header().Set("x-ratelimit-remaining-tokens", "500")
			w.Header().Set("x-ratelimit-reset-tokens", "500ms")
		}
		w.Write([]byte(`{"usage":{"total_tokens":1000}}`))
	})
	client := func() *http.Client {
		b, err := bucket.NewTokenBucket(rs.Client(), "transport-tokens", 100, time.Second)
		if err != nil {
			t.Fatalf("NewTokenBucket: %v", err)
		}
		return &http.Client{Transport: mustTransport(t, throttle.New(b), httpclient.WithBase(srv.Client().Transport))}
	}
	a, b := client(), client()
	resp, err := a.Get(srv.URL)
	if err != nil {
		t.Fatalf("first call: %v", err)
	}
	drain(resp)

	// At once: the other instance may not send.
	req, _ := http.NewRequestWithContext(httpclient.ContextWithMaxWait(context.Background(), 0), http.MethodGet, srv.URL, nil)
	if resp, err := b.Do(req); !errors.Is(err, throttle.ErrTimeout) {
		if err == nil {
			drain(resp)
		}
		t.Fatalf("the other instance's call during the pause: %v; want ErrTimeout", err)
	}
	if n := srv.count(); n != 1 {
		t.Fatalf("the provider saw %d calls; want only the first during the pause", n)
	}
	// Waiting: it goes after the reset.
	resp, err = b.Get(srv.URL)
	if err != nil {
		t.Fatalf("the other instance's call after the pause: %v", err)
	}
	drain(resp)
	arr := srv.times()
	if len(arr) != 2 {
		t.Fatalf("the provider saw %d calls; want 2", len(arr))
	}
	// Redis counts the pause from when the client read the answer, a
	// little after it left.
	if gap := arr[1].Sub(time.Unix(0, answered.Load())); gap < time.Second {
		t.Errorf("the second call came %v after the exhausted answer; want the 1 s reset", gap)
	}
}

// TestWithAnswerHookPausesTheFleet: a hook reads a GraphQL cost extension
// (Shopify's throttleStatus) and asks for the time the points take to come
// back; the bucket is paused for it, as for a header.
func TestWithAnswerHookPausesTheFleet(t *testing.T) {
	clk := clockwork.NewFakeClockAt(time.Unix(1_800_000_000, 0))
	srv := newCountingServer(t, clk, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"extensions":{"cost":{"throttleStatus":{"currentlyAvailable":10,"restoreRate":50}}}}`))
	})
	local, err := throttle.NewLocal(1000, time.Second, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	pb := &pauseRecorder{Bucket: local, clock: clk, until: map[string]time.Time{}}
	var calls atomic.Int64
	hook := func(resp *http.Response, a *throttle.Answer) {
		calls.Add(1)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body)) // the caller reads it next
		if err != nil {
			return
		}
		var cost struct {
			Extensions struct {
				Cost struct {
					ThrottleStatus struct {
						CurrentlyAvailable float64 `json:"currentlyAvailable"`
						RestoreRate        float64 `json:"restoreRate"`
					} `json:"throttleStatus"`
				} `json:"cost"`
			} `json:"extensions"`
		}
		if json.Unmarshal(body, &cost) != nil {
			return
		}
		const wanted = 100 // the points the next query costs
		st := cost.Extensions.Cost.ThrottleStatus
		if st.CurrentlyAvailable < wanted && st.RestoreRate > 0 {
			// 90 points short, 50 per second back: 1.8 s.
			a.Retry, a.RetryAfter = true, time.Duration(math.Ceil((wanted-st.CurrentlyAvailable)/st.RestoreRate*1000))*time.Millisecond
		}
	}
	tr := mustTransport(t, throttle.New(pb, throttle.WithClock(clk)), httpclient.WithBase(srv.Client().Transport), httpclient.WithAnswer(hook))
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if body := drain(resp); !strings.Contains(body, "throttleStatus") {
		t.Errorf("the caller read %q after the hook; want the provider's body", body)
	}
	if calls.Load() != 1 {
		t.Errorf("the hook was called %d times; want once", calls.Load())
	}
	pb.mu.Lock()
	defer pb.mu.Unlock()
	assert.Equal(t, []string{"=1.8s"}, pb.pauses)
}

// TestTransportHoldsOnlyTheExhaustedDimension: an answer with requests
// exhausted for 300 ms and tokens for 3 s holds back, across the fleet
// sharing one Budget, each dimension until its own reset and no longer:
// a call that needs requests only goes after 300 ms, one that needs
// tokens waits the 3 s. (The whole budget was paused for the later
// reset, 3 s, whatever the call needed.)
func TestTransportHoldsOnlyTheExhaustedDimension(t *testing.T) {
	rs := redisenv.New(t)
	srv := newCountingServer(t, clockwork.NewRealClock(), func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.Header().Set("x-ratelimit-remaining-requests", "0")
			w.Header().Set("x-ratelimit-reset-requests", "300ms")
			w.Header().Set("x-ratelimit-remaining-tokens", "0")
			w.Header().Set("x-ratelimit-reset-tokens", "3s")
		}
		w.Write([]byte(`{"usage":{"total_tokens":10}}`))
	})
	client := func(est throttle.Cost) *http.Client {
		lim := throttle.New(newRequestsTokensBudget(t, rs, "dims"))
		t.Cleanup(func() { lim.Close() })
		return &http.Client{Transport: mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport),
			httpclient.WithCost(func(*http.Request) (throttle.Cost, error) { return est, nil }, nil))}
	}
	get := func(c *http.Client, maxWait time.Duration) error { return getWithin(c, srv.URL, maxWait) }
	withTokens := client(throttle.Cost{"requests": 1, "tokens": 10})
	requestsOnly := client(throttle.Cost{"requests": 1})
	if err := get(withTokens, 0); err != nil {
		t.Fatalf("first call: %v", err)
	}
	if err := get(withTokens, 0); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("a call needing tokens during their pause = %v, want ErrTimeout", err)
	}
	start := time.Now()
	if err := get(requestsOnly, 2*time.Second); err != nil {
		t.Fatalf("a call needing requests only, waiting 2 s: %v; want it sent after the requests' 300 ms", err)
	}
	if waited := time.Since(start); waited < 250*time.Millisecond {
		t.Fatalf("the requests-only call went after %v, before the requests' reset", waited)
	}
	if err := get(withTokens, 0); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("a call needing tokens before their reset = %v, want ErrTimeout", err)
	}
	if n := srv.count(); n != 2 {
		t.Fatalf("the provider saw %d calls, want 2", n)
	}
}

// TestTransportHoldsAnExhaustedDimensionOfALeasingLimiter: with a
// Limiter that leases permits from a Budget, "0 requests remaining,
// reset in 3 s" holds this instance's calls too: the permits it leased
// before the answer are not spent while the provider has none.
func TestTransportHoldsAnExhaustedDimensionOfALeasingLimiter(t *testing.T) {
	// 30 calls: a demand that leases several permits at once.
	checkHeldOnExhaustedDimension(t, "leased", "requests", 30, throttle.WithLeasing(throttle.Leasing{}))
}

// TestTransportWithoutCostHoldsCallsOnAnExhaustedDimension: a Transport
// without WithCost takes a permit of the Budget's requests per call, so
// that its calls name no tokens; yet each call spends the provider's
// tokens: "0 tokens remaining, reset in 3 s" holds its calls for 3 s.
func TestTransportWithoutCostHoldsCallsOnAnExhaustedDimension(t *testing.T) {
	checkHeldOnExhaustedDimension(t, "nocost", "tokens", 1)
}

// checkHeldOnExhaustedDimension: a provider answers its n-th call with
// "0 dim remaining, reset in 3 s"; through a Transport without WithCost,
// on a Limiter (with limOpts) of a fresh requests-and-tokens Budget
// under key, the n calls go and the next, waiting for nothing, times out
// without reaching the provider.
func checkHeldOnExhaustedDimension(t *testing.T, key, dim string, n int, limOpts ...throttle.LimiterOption) {
	t.Helper()
	rs := redisenv.New(t)
	srv := newCountingServer(t, clockwork.NewRealClock(), func(i int, w http.ResponseWriter, _ *http.Request) {
		if i == n {
			w.Header().Set("x-ratelimit-remaining-"+dim, "0")
			w.Header().Set("x-ratelimit-reset-"+dim, "3s")
		}
	})
	lim := throttle.New(newRequestsTokensBudget(t, rs, key), limOpts...)
	t.Cleanup(func() { lim.Close() })
	client := &http.Client{Transport: mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport))}
	for i := range n {
		if err := getWithin(client, srv.URL, 0); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
	}
	if err := getWithin(client, srv.URL, 0); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("a call while the provider has no %s left for 3 s = %v, want ErrTimeout", dim, err)
	}
	if got := srv.count(); got != n {
		t.Fatalf("the provider saw %d calls, want %d", got, n)
	}
}

// newRequestsTokensBudget makes a Budget on rs under key of 100 requests
// and 10,000 tokens a minute, or fails the test.
func newRequestsTokensBudget(t *testing.T, rs *redisenv.Server, key string) *bucket.Budget {
	t.Helper()
	b, err := bucket.NewBudget(rs.Client(), key, []bucket.Dimension{
		{Name: "requests", Limit: 100, Interval: time.Minute},
		{Name: "tokens", Limit: 10_000, Interval: time.Minute},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// getWithin sends a GET to url through c, waiting at most maxWait for a
// permit; it drains the body of an answer and returns the error of Do.
func getWithin(c *http.Client, url string, maxWait time.Duration) error {
	req, _ := http.NewRequestWithContext(httpclient.ContextWithMaxWait(context.Background(), maxWait), http.MethodGet, url, nil)
	resp, err := c.Do(req)
	if err == nil {
		drain(resp)
	}
	return err
}

// TestTransportLearnsAlignedWindowsFromARefusal: a success that spends the
// last request of 600 per minute (reset 60 s: the window's last call
// leaves then) holds the key back for one request's share of the reset,
// 100 ms, not the whole minute; a refusal that comes before that minute is
// over shows a provider that restores its requests only at its window's
// end, and from then on a success with none remaining holds the key until
// its reset. Judged on the Limiter's fake clock.
func TestTransportLearnsAlignedWindowsFromARefusal(t *testing.T) {
	clk := clockwork.NewFakeClock()
	srv := newCountingServer(t, clk, func(n int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("x-ratelimit-limit-requests", "600")
		w.Header().Set("x-ratelimit-remaining-requests", "0")
		if n == 2 { // refused: the window is not restored yet
			w.Header().Set("x-ratelimit-reset-requests", "59.85s")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.Header().Set("x-ratelimit-reset-requests", "60s")
	})
	var logs bytes.Buffer
	get := alignedClient(t, clk, srv, httpclient.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))

	status, err := get()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	clk.Advance(50 * time.Millisecond)
	_, err = get()
	assert.ErrorIs(t, err, throttle.ErrTimeout, "50 ms after the last request was spent: held for a request's share of the reset")
	clk.Advance(100 * time.Millisecond)
	status, err = get()
	require.NoError(t, err, "150 ms after: a request's share (100 ms) is over, not the whole reset")
	require.Equal(t, http.StatusTooManyRequests, status)
	assert.Contains(t, logs.String(), "only at its window's end")

	clk.Advance(time.Minute) // past the refusal's reset
	status, err = get()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	clk.Advance(500 * time.Millisecond)
	_, err = get()
	assert.ErrorIs(t, err, throttle.ErrTimeout, "once windows are known to be aligned, a success with none remaining holds until its reset")
	assert.Equal(t, 3, srv.count(), "calls that reached the provider")
}

// pausingLocal is a throttle.Local that a Limiter can pause (a bucket's
// Pause method, found by a type assertion), on its clock: a take before
// the pause's end is refused until then.
type pausingLocal struct {
	*throttle.Local
	clock clockwork.Clock
	mu    sync.Mutex
	until time.Time
}

func (b *pausingLocal) Pause(_ context.Context, _ string, d time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.until = b.clock.Now().Add(d)
	return nil
}

func (b *pausingLocal) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	b.mu.Lock()
	left := b.until.Sub(b.clock.Now())
	b.mu.Unlock()
	if left > 0 {
		return throttle.Decision{Delay: left}, nil
	}
	return b.Local.Take(ctx, key, n, maxWait)
}

// TestTransportLearnsNoAlignedWindowsFromOtherAnswers: what is not a
// refusal of a request sent after a success's hold (a 503, a success
// with a reset of 0 or without a limit) teaches nothing: a later success
// that spends the last request is still held only a request's share of
// its reset.
func TestTransportLearnsNoAlignedWindowsFromOtherAnswers(t *testing.T) {
	for _, second := range []struct {
		name  string
		write func(w http.ResponseWriter)
	}{
		{"a 503 with none remaining", func(w http.ResponseWriter) {
			w.Header().Set("x-ratelimit-limit-requests", "600")
			w.Header().Set("x-ratelimit-remaining-requests", "0")
			w.Header().Set("x-ratelimit-reset-requests", "59s")
			w.WriteHeader(http.StatusServiceUnavailable)
		}},
		{"a success with a reset of 0", func(w http.ResponseWriter) {
			w.Header().Set("x-ratelimit-limit-requests", "600")
			w.Header().Set("x-ratelimit-remaining-requests", "0")
			w.Header().Set("x-ratelimit-reset-requests", "0s")
		}},
		{"a success naming no limit", func(w http.ResponseWriter) {
			w.Header().Set("x-ratelimit-remaining-requests", "0")
			w.Header().Set("x-ratelimit-reset-requests", "59s")
		}},
	} {
		t.Run(second.name, func(t *testing.T) {
			clk := clockwork.NewFakeClock()
			srv := newCountingServer(t, clk, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n == 2 {
					second.write(w)
					return
				}
				w.Header().Set("x-ratelimit-limit-requests", "600")
				w.Header().Set("x-ratelimit-remaining-requests", "0")
				w.Header().Set("x-ratelimit-reset-requests", "60s")
			})
			get := alignedClient(t, clk, srv)
			_, err := get()
			require.NoError(t, err)
			clk.Advance(150 * time.Millisecond)
			_, err = get() // the second answer
			require.NoError(t, err)
			clk.Advance(2 * time.Minute) // past any pause it asked for
			_, err = get()
			require.NoError(t, err)
			clk.Advance(150 * time.Millisecond)
			_, err = get()
			assert.NoError(t, err, "a request's share of the reset (100 ms) is over: nothing taught aligned windows")
		})
	}
}

// TestTransportLearnsNoAlignedWindowsFromARequestInFlight: a refusal of a
// request sent before a success's hold ended (in flight when the last
// request was spent) says nothing of how the provider restores its
// window.
func TestTransportLearnsNoAlignedWindowsFromARequestInFlight(t *testing.T) {
	clk := clockwork.NewFakeClock()
	arrived := make(chan struct{})
	firstDone := make(chan struct{})
	srv := newCountingServer(t, clk, func(n int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("x-ratelimit-limit-requests", "600")
		w.Header().Set("x-ratelimit-remaining-requests", "0")
		switch n {
		case 1: // answered once the second is in flight
			<-arrived
			w.Header().Set("x-ratelimit-reset-requests", "60s")
		case 2: // refused, answered after the first's answer was read
			close(arrived)
			<-firstDone
			w.Header().Set("x-ratelimit-reset-requests", "59.9s")
			w.WriteHeader(http.StatusTooManyRequests)
		default:
			w.Header().Set("x-ratelimit-reset-requests", "60s")
		}
	})
	get := alignedClient(t, clk, srv)
	first := make(chan error, 1)
	go func() { _, err := get(); first <- err }()
	require.Eventually(t, func() bool { return srv.count() >= 1 }, 10*time.Second, time.Millisecond, "the first request at the provider")
	second := make(chan error, 1)
	go func() { _, err := get(); second <- err }()
	require.NoError(t, <-first)
	close(firstDone)
	require.NoError(t, <-second)
	clk.Advance(2 * time.Minute) // past the refusal's pause
	_, err := get()
	require.NoError(t, err)
	clk.Advance(150 * time.Millisecond)
	_, err = get()
	assert.NoError(t, err, "a request's share of the reset (100 ms) is over: the refusal in flight taught nothing")
}

// alignedClient is a client through a Transport (no retries, and opts)
// over a pausing Local on clk, whose requests wait for nothing.
func alignedClient(t *testing.T, clk *clockwork.FakeClock, srv *countingServer, opts ...httpclient.Option) func() (int, error) {
	t.Helper()
	loc, err := throttle.NewLocal(1000, time.Second, throttle.WithClock(clk))
	require.NoError(t, err)
	lim := throttle.New(&pausingLocal{Local: loc, clock: clk}, throttle.WithClock(clk))
	t.Cleanup(func() { _ = lim.Close() })
	opts = append([]httpclient.Option{httpclient.WithBase(srv.Client().Transport), httpclient.WithRetries(0)}, opts...)
	client := &http.Client{Transport: mustTransport(t, lim, opts...)}
	return func() (int, error) {
		req, _ := http.NewRequestWithContext(httpclient.ContextWithMaxWait(context.Background(), 0), http.MethodGet, srv.URL, nil)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		drain(resp)
		return resp.StatusCode, nil
	}
}
