package httpclient_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

func TestReadAnswer(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name   string
		status int
		h      map[string]string
		want   throttle.Answer
	}{
		{"429 without hint", 429, nil, throttle.Answer{Refused: true}},
		{"429 with Retry-After", 429, map[string]string{"Retry-After": "3"}, throttle.Answer{Refused: true, Retry: true, RetryAfter: 3 * time.Second}},
		{"503 without hint says nothing", 503, nil, throttle.Answer{}},
		{"200 with nothing remaining", 200, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "2"}, throttle.Answer{Retry: true, RetryAfter: 2 * time.Second}},
		{"200 with some remaining", 200, map[string]string{"X-RateLimit-Remaining": "4", "X-RateLimit-Reset": "2", "X-RateLimit-Limit": "50"}, throttle.Answer{Limit: 50}},
		{"draft RateLimit exhausted", 200, map[string]string{"RateLimit": `"default";r=0;t=7`}, throttle.Answer{Retry: true, RetryAfter: 7 * time.Second}},
		{"draft RateLimit not exhausted", 200, map[string]string{"RateLimit": `"default";r=3;t=7`}, throttle.Answer{}},
		{"RateLimit-Policy q and w", 200, map[string]string{"RateLimit-Policy": `"burst";q=100;w=60, "daily";q=1000;w=86400`}, throttle.Answer{Limit: 1000, Window: 86400 * time.Second}},
		{"old RateLimit-Limit with window", 200, map[string]string{"RateLimit-Limit": "10, 10;w=1, 50;w=60"}, throttle.Answer{Limit: 50, Window: time.Minute}},
		{"garbage", 200, map[string]string{"X-RateLimit-Limit": "-5", "RateLimit-Policy": "x;q=y"}, throttle.Answer{}},
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
	assert.Equal(t, throttle.Answer{}, httpclient.ReadAnswer(nil, now))
}

func TestTransportReportsRefusalsWithoutHint(t *testing.T) {
	var refuse atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if refuse.Load() {
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.Header().Set("X-RateLimit-Limit", "1000") // above the configured limit: nothing to learn
	}))
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	b, err := throttle.NewLocal(50, time.Second)
	require.NoError(t, err)
	lim := throttle.New(b)
	tr, err := httpclient.NewTransport(lim, httpclient.WithBase(srv.Client().Transport))
	require.NoError(t, err)
	client := &http.Client{Transport: tr}
	get := func() int {
		resp, err := client.Get(srv.URL)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, get())
	s, err := lim.Key("").AdaptiveState(context.Background())
	require.NoError(t, err)
	assert.False(t, s.Active())

	refuse.Store(true)
	require.Equal(t, http.StatusTooManyRequests, get(), "a 429 without a retry time is returned as it is")
	s, err = lim.Key("").AdaptiveState(context.Background())
	require.NoError(t, err)
	assert.InDelta(t, 45, s.Rate, 1e-9, "and lowers the adaptive rate")
}

// TestTransportReportsZeroRetryAfterAsNoHint: "Retry-After: 0" pauses
// nothing, so the Transport reports the 429 as a refusal without a hint
// and the fleet slows down (before, nothing was paused and nothing
// learned: the provider was asked again at full speed).
func TestTransportReportsZeroRetryAfterAsNoHint(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	b, err := throttle.NewLocal(50, time.Second)
	require.NoError(t, err)
	lim := throttle.New(b)
	tr, err := httpclient.NewTransport(lim, httpclient.WithBase(srv.Client().Transport), httpclient.WithRetries(0))
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	s, err := lim.Key("").AdaptiveState(context.Background())
	require.NoError(t, err)
	assert.True(t, s.Active(), "the refusal lowered the adaptive rate")
	assert.InDelta(t, 45, s.Rate, 1e-9)
}

// TestTransportReportsRefusalsWithHint: a 429 with Retry-After pauses this
// Transport and also lowers the fleet's adaptive rate, so that the
// bucket's burst after the pause is paced; a 503 with Retry-After pauses
// and says nothing about the rate.
func TestTransportReportsRefusalsWithHint(t *testing.T) {
	for _, tt := range []struct {
		status int
		paced  bool
	}{{http.StatusTooManyRequests, true}, {http.StatusServiceUnavailable, false}} {
		t.Run(http.StatusText(tt.status), func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Retry-After", "2")
				w.WriteHeader(tt.status)
			}))
			defer srv.Close()
			defer srv.Client().CloseIdleConnections()
			clk := clockwork.NewFakeClock()
			b, err := throttle.NewLocal(50, time.Second, throttle.WithClock(clk))
			require.NoError(t, err)
			lim := throttle.New(b, throttle.WithClock(clk))
			tr, err := httpclient.NewTransport(lim, httpclient.WithBase(srv.Client().Transport), httpclient.WithRetries(0))
			require.NoError(t, err)
			client := &http.Client{Transport: tr}
			resp, err := client.Get(srv.URL)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, tt.status, resp.StatusCode)

			req, _ := http.NewRequestWithContext(httpclient.ContextWithMaxWait(context.Background(), time.Second), http.MethodGet, srv.URL, nil)
			_, err = client.Do(req)
			assert.ErrorIs(t, err, throttle.ErrTimeout, "the Transport is paused for 2 s")
			s, err := lim.Key("").AdaptiveState(context.Background())
			require.NoError(t, err)
			if tt.paced {
				assert.InDelta(t, 45, s.Rate, 1e-9, "the refusal lowered the adaptive rate")
			} else {
				assert.False(t, s.Active(), "a 503 is not a refusal of the rate")
			}
		})
	}
}

// ReadAnswer reads OpenAI's requests limit as per minute, as OpenAI counts;
// for a provider that sends the same header per day, the caller says so.
func ExampleReadAnswer_window() {
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{}}
	resp.Header.Set("x-ratelimit-limit-requests", "14400")
	a := httpclient.ReadAnswer(resp, time.Now())
	fmt.Println(a.Limit, "per", a.Window)

	// Groq's x-ratelimit-limit-requests counts requests per day.
	a.Window = 24 * time.Hour
	fmt.Println(a.Limit, "per", a.Window)
	// Output:
	// 14400 per 1m0s
	// 14400 per 24h0m0s
}

// The requests limit of the accounting headers is read per minute; a
// WithAnswer hook that knows its provider counts per day says so, and the
// fleet's ceiling follows the day's rate.
func TestAnswerHookSetsTheWindowOfTheRequestsLimit(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("x-ratelimit-limit-requests", "1800")
	}))
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	for _, tt := range []struct {
		name    string
		window  time.Duration // set by the hook; 0: no hook
		ceiling float64       // per second
	}{
		{"read per minute", 0, 30},
		{"per day, as the hook says", 24 * time.Hour, 1800.0 / 86400},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := throttle.NewLocal(50, time.Second)
			require.NoError(t, err)
			lim := throttle.New(b)
			opts := []httpclient.Option{httpclient.WithBase(srv.Client().Transport)}
			if tt.window > 0 {
				opts = append(opts, httpclient.WithAnswer(func(resp *http.Response, a *throttle.Answer) {
					if resp.Header.Get("x-ratelimit-limit-requests") != "" {
						a.Window = tt.window
					}
				}))
			}
			tr, err := httpclient.NewTransport(lim, opts...)
			require.NoError(t, err)
			resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
			require.NoError(t, err)
			resp.Body.Close()
			s, err := lim.Key("").AdaptiveState(context.Background())
			require.NoError(t, err)
			assert.InDelta(t, tt.ceiling, s.Ceiling, 1e-9)
		})
	}
}
