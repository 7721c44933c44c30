package llmprovider_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/headway-go/headway/internal/llmprovider"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

// TestMain fails the package's tests if any goroutine outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// start runs a provider for the test.
func start(t *testing.T, cfg llmprovider.Config) *llmprovider.Provider {
	t.Helper()
	p, err := llmprovider.Start(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
	return p
}

// reply is one answer as a caller sees it.
type reply struct {
	status int
	header http.Header
	tokens int64
}

// call sends one request, naming record when not empty. It may run on
// a goroutine of its own: it reports errors with t.Errorf, and returns a
// zero reply then.
func call(t *testing.T, p *llmprovider.Provider, record string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, p.URL()+"/v1/chat/completions", nil)
	if err != nil {
		t.Errorf("NewRequest: %v", err)
		return reply{}
	}
	if record != "" {
		req.Header.Set(llmprovider.RecordHeader, record)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("call: %v", err)
		return reply{}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("reading the answer: %v", err)
		return reply{}
	}
	r := reply{status: resp.StatusCode, header: resp.Header}
	if resp.StatusCode == http.StatusOK {
		var u struct {
			Usage struct {
				TotalTokens int64 `json:"total_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(body, &u); err != nil {
			t.Errorf("body %q: %v", body, err)
		}
		r.tokens = u.Usage.TotalTokens
	}
	return r
}

func TestRequestsPerWindowAreCountedExactly(t *testing.T) {
	clk := clockwork.NewFakeClock()
	p := start(t, llmprovider.Config{RPM: 5, Window: time.Second, Clock: clk})
	for i := range 5 {
		r := call(t, p, "")
		require.Equal(t, http.StatusOK, r.status, "call %d", i)
		assert.Equal(t, fmt.Sprint(4-i), r.header.Get("X-Ratelimit-Remaining-Requests"))
		assert.Equal(t, "5", r.header.Get("X-Ratelimit-Limit-Requests"))
		assert.Equal(t, "1s", r.header.Get("X-Ratelimit-Reset-Requests"))
	}
	r := call(t, p, "")
	require.Equal(t, http.StatusTooManyRequests, r.status)
	assert.Equal(t, "requests", r.header.Get(llmprovider.RefusedHeader))
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	assert.Equal(t, "0", r.header.Get("X-Ratelimit-Remaining-Requests"))

	clk.Advance(999 * time.Millisecond) // the window still holds all five
	r = call(t, p, "")
	require.Equal(t, http.StatusTooManyRequests, r.status)
	assert.Equal(t, "1ms", r.header.Get("X-Ratelimit-Reset-Requests"))
	clk.Advance(time.Millisecond) // they leave it
	r = call(t, p, "")
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "4", r.header.Get("X-Ratelimit-Remaining-Requests"))

	s := p.Stats()
	assert.Equal(t, llmprovider.Stats{Accepted: 6, Tokens: 6, Refused: 2, RefusedRequests: 2, MaxInFlight: 1, MaxRequestsInWindow: 5, MaxTokensInWindow: 5}, s)
}

func TestTokensPerWindowAreCountedAtArrival(t *testing.T) {
	clk := clockwork.NewFakeClock()
	p := start(t, llmprovider.Config{TPM: 100, Window: time.Second, MinTokens: 30, MaxTokens: 30, Clock: clk})
	for i := range 3 {
		r := call(t, p, "")
		require.Equal(t, http.StatusOK, r.status, "call %d", i)
		assert.Equal(t, int64(30), r.tokens)
		assert.Equal(t, fmt.Sprint(70-30*i), r.header.Get("X-Ratelimit-Remaining-Tokens"))
		assert.Empty(t, r.header.Get("X-Ratelimit-Limit-Requests"), "no RPM set")
	}
	clk.Advance(500 * time.Millisecond)
	// 10 tokens left, the call costs 30: refused until the first call
	// leaves the window.
	r := call(t, p, "")
	require.Equal(t, http.StatusTooManyRequests, r.status)
	assert.Equal(t, "tokens", r.header.Get(llmprovider.RefusedHeader))
	assert.Equal(t, "10", r.header.Get("X-Ratelimit-Remaining-Tokens"))
	assert.Equal(t, "500ms", r.header.Get("X-Ratelimit-Reset-Tokens"))
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	clk.Advance(500 * time.Millisecond) // all three leave the window
	r = call(t, p, "")
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "70", r.header.Get("X-Ratelimit-Remaining-Tokens"))

	s := p.Stats()
	assert.Equal(t, int64(4), s.Accepted)
	assert.Equal(t, int64(120), s.Tokens)
	assert.Equal(t, int64(90), s.MaxTokensInWindow)
	assert.Equal(t, int64(1), s.RefusedTokens)
}

func TestCostsAreDrawnWithinBoundsFromTheSeed(t *testing.T) {
	draws := func(seed uint64) []int64 {
		p := start(t, llmprovider.Config{MinTokens: 10, MaxTokens: 50, Seed: seed})
		var out []int64
		var sum int64
		for range 40 {
			r := call(t, p, "")
			require.Equal(t, http.StatusOK, r.status)
			require.GreaterOrEqual(t, r.tokens, int64(10))
			require.LessOrEqual(t, r.tokens, int64(50))
			out = append(out, r.tokens)
			sum += r.tokens
		}
		assert.Equal(t, sum, p.Stats().Tokens, "the provider's count of tokens")
		return out
	}
	a, b, c := draws(7), draws(7), draws(8)
	assert.Equal(t, a, b, "one seed, one sequence")
	assert.NotEqual(t, a, c, "another seed, another sequence")
	distinct := map[int64]bool{}
	for _, v := range a {
		distinct[v] = true
	}
	assert.Greater(t, len(distinct), 10, "costs vary: %v", a)
}

func TestCallsAboveTheConcurrencyCapAreRefused(t *testing.T) {
	clk := clockwork.NewFakeClock()
	p := start(t, llmprovider.Config{Concurrency: 3, Latency: time.Second, Clock: clk})
	const n = 5
	replies := make(chan reply, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { replies <- call(t, p, "") })
	}
	// The two beyond the cap are refused at once; the three admitted
	// wait out their latency on the fake clock.
	for range n - 3 {
		r := <-replies
		assert.Equal(t, http.StatusTooManyRequests, r.status)
		assert.Equal(t, "concurrency", r.header.Get(llmprovider.RefusedHeader))
		assert.Empty(t, r.header.Get("Retry-After"), "no window to wait for")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, clk.BlockUntilContext(ctx, 3))
	clk.Advance(time.Second)
	wg.Wait()
	close(replies)
	for r := range replies {
		assert.Equal(t, http.StatusOK, r.status)
	}
	s := p.Stats()
	assert.Equal(t, 3, s.MaxInFlight)
	assert.Equal(t, int64(3), s.Accepted)
	assert.Equal(t, int64(2), s.RefusedConcurrency)
	// All three left before their answers: three new calls are admitted
	// at once.
	replies = make(chan reply, 3)
	for range 3 {
		wg.Go(func() { replies <- call(t, p, "") })
	}
	require.NoError(t, clk.BlockUntilContext(ctx, 3))
	clk.Advance(time.Second)
	wg.Wait()
	close(replies)
	for r := range replies {
		assert.Equal(t, http.StatusOK, r.status)
	}
	assert.Equal(t, int64(2), p.Stats().RefusedConcurrency)
}

func TestRecordsSeenTwiceAreCounted(t *testing.T) {
	p := start(t, llmprovider.Config{})
	for _, id := range []string{"a", "b", "a", "", "c", "a"} {
		require.Equal(t, http.StatusOK, call(t, p, id).status)
	}
	assert.Equal(t, 3, p.Seen("a"))
	assert.Equal(t, 0, p.Seen("z"))
	s := p.Stats()
	assert.Equal(t, int64(3), s.Records)
	assert.Equal(t, int64(2), s.Duplicates)
	assert.Contains(t, s.String(), "3 records, 2 duplicates")
}

// TestConcurrentLoadNeverExceedsTheLimits hammers the provider from many
// goroutines on the real clock: its own counts stay within every limit,
// and every call is either accepted or refused.
func TestConcurrentLoadNeverExceedsTheLimits(t *testing.T) {
	p := start(t, llmprovider.Config{RPM: 20, TPM: 400, Concurrency: 4, Window: 200 * time.Millisecond,
		MinTokens: 5, MaxTokens: 40, Seed: 1, Latency: 2 * time.Millisecond})
	const workers, each = 8, 40
	began := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				r := call(t, p, "")
				if r.status != http.StatusOK && r.status != http.StatusTooManyRequests {
					t.Errorf("status %d", r.status)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(began)
	s := p.Stats()
	assert.Equal(t, int64(workers*each), s.Accepted+s.Refused)
	// An independent bound: at most RPM per window of the test's time.
	assert.LessOrEqual(t, s.Accepted, 20*(int64(elapsed/(200*time.Millisecond))+1), "over %v", elapsed)
	assert.Equal(t, s.Refused, s.RefusedRequests+s.RefusedTokens+s.RefusedConcurrency)
	assert.LessOrEqual(t, s.MaxInFlight, 4)
	assert.LessOrEqual(t, s.MaxRequestsInWindow, int64(20))
	assert.LessOrEqual(t, s.MaxTokensInWindow, int64(400))
	assert.Positive(t, s.Accepted)
	t.Log(s)
}

// TestHeadersReadByTheTransport: the provider's answers mean to
// httpclient.ReadAnswer what OpenAI's do: a success that spends the last
// tokens holds them back until they are fully restored (the reset), a
// refusal until its Retry-After, and the requests limit is advertised per
// minute.
func TestHeadersReadByTheTransport(t *testing.T) {
	clk := clockwork.NewFakeClock()
	p := start(t, llmprovider.Config{RPM: 60, TPM: 50, MinTokens: 25, MaxTokens: 25, Clock: clk})
	read := func() throttle.Answer {
		resp, err := http.Get(p.URL())
		require.NoError(t, err)
		resp.Body.Close()
		return httpclient.ReadAnswer(resp, clk.Now())
	}
	assert.Equal(t, throttle.Answer{Limit: 60, Window: time.Minute}, read())
	clk.Advance(10 * time.Second)
	// The second call spends the last tokens: pause until they are
	// fully restored, when it leaves the minute, 60 s on.
	assert.Equal(t, throttle.Answer{Retry: true, RetryAfter: time.Minute, Limit: 60, Window: time.Minute}, read())
	// Refused: Retry-After says the same, in whole seconds.
	assert.Equal(t, throttle.Answer{Refused: true, Retry: true, RetryAfter: 50 * time.Second, Limit: 60, Window: time.Minute}, read())
}

// TestConcurrencyRefusalAsksForNoPause: a call refused for the
// concurrency cap, with calls and tokens remaining, is a refusal without
// a retry time: the fleet slows, it does not stop until a window's end.
func TestConcurrencyRefusalAsksForNoPause(t *testing.T) {
	clk := clockwork.NewFakeClock()
	p := start(t, llmprovider.Config{RPM: 60, TPM: 1000, Concurrency: 1, Latency: time.Second, Clock: clk})
	held := make(chan reply, 1)
	go func() { held <- call(t, p, "") }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, clk.BlockUntilContext(ctx, 1))
	resp, err := http.Get(p.URL())
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "concurrency", resp.Header.Get(llmprovider.RefusedHeader))
	assert.Equal(t, throttle.Answer{Refused: true, Limit: 60, Window: time.Minute}, httpclient.ReadAnswer(resp, clk.Now()))
	clk.Advance(time.Second)
	assert.Equal(t, http.StatusOK, (<-held).status)
}

func TestStartRefusesBadConfig(t *testing.T) {
	for _, tt := range []struct {
		field string
		cfg   llmprovider.Config
	}{
		{"RPM", llmprovider.Config{RPM: -1}},
		{"TPM", llmprovider.Config{TPM: -1}},
		{"Concurrency", llmprovider.Config{Concurrency: -1}},
		{"Window", llmprovider.Config{Window: -time.Second}},
		{"MinTokens", llmprovider.Config{MinTokens: -1, MaxTokens: 4}},
		{"MaxTokens", llmprovider.Config{MinTokens: 5, MaxTokens: 4}},
		{"MaxTokens", llmprovider.Config{TPM: 10, MinTokens: 5, MaxTokens: 11}},
		{"Latency", llmprovider.Config{Latency: -time.Second}},
		{"Counting", llmprovider.Config{Counting: 7}},
	} {
		_, err := llmprovider.Start(tt.cfg)
		if assert.Error(t, err, tt.field) {
			assert.True(t, errors.Is(err, throttle.ErrInvalid), "%v", err)
			assert.Contains(t, err.Error(), tt.field)
		}
	}
}

// TestContinuousCountingRefillsAsTimePasses: a Continuous provider starts
// full, and gives back a limit's share as time passes, not a window after
// each call.
func TestContinuousCountingRefillsAsTimePasses(t *testing.T) {
	clk := clockwork.NewFakeClock()
	p := start(t, llmprovider.Config{RPM: 4, TPM: 100, Window: time.Second, MinTokens: 10, MaxTokens: 10,
		Counting: llmprovider.Continuous, Clock: clk})
	for i := range 4 {
		r := call(t, p, "")
		require.Equal(t, http.StatusOK, r.status, "call %d", i)
		assert.Equal(t, fmt.Sprint(3-i), r.header.Get("X-Ratelimit-Remaining-Requests"))
	}
	r := call(t, p, "")
	require.Equal(t, http.StatusTooManyRequests, r.status)
	assert.Equal(t, "requests", r.header.Get(llmprovider.RefusedHeader))
	assert.Equal(t, "1", r.header.Get("Retry-After"), "a call's share comes back in 250 ms, rounded up")
	assert.Equal(t, "1s", r.header.Get("X-Ratelimit-Reset-Requests"), "full again in one window")

	clk.Advance(249 * time.Millisecond)
	require.Equal(t, http.StatusTooManyRequests, call(t, p, "").status, "not a whole call refilled yet")
	clk.Advance(time.Millisecond)
	r = call(t, p, "")
	require.Equal(t, http.StatusOK, r.status, "a quarter window refills one call")
	assert.Equal(t, "0", r.header.Get("X-Ratelimit-Remaining-Requests"))
	clk.Advance(10 * time.Second)
	r = call(t, p, "")
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "3", r.header.Get("X-Ratelimit-Remaining-Requests"), "refilled up to the limit, no more")
	assert.Equal(t, "90", r.header.Get("X-Ratelimit-Remaining-Tokens"))

	s := p.Stats()
	assert.Equal(t, int64(6), s.Accepted)
	assert.Equal(t, int64(2), s.RefusedRequests)
	assert.Equal(t, int64(5), s.MaxRequestsInWindow, "four at once, and a fifth within the second")
}

// TestContinuousTokensWaitForTheirShare: a call whose tokens the bucket
// does not hold is refused until enough has refilled.
func TestContinuousTokensWaitForTheirShare(t *testing.T) {
	clk := clockwork.NewFakeClock()
	p := start(t, llmprovider.Config{TPM: 100, Window: 10 * time.Second, MinTokens: 40, MaxTokens: 40,
		Counting: llmprovider.Continuous, Clock: clk})
	require.Equal(t, http.StatusOK, call(t, p, "").status)
	require.Equal(t, http.StatusOK, call(t, p, "").status)
	r := call(t, p, "") // 20 left, 40 needed: 2 s of refill
	require.Equal(t, http.StatusTooManyRequests, r.status)
	assert.Equal(t, "tokens", r.header.Get(llmprovider.RefusedHeader))
	assert.Equal(t, "2", r.header.Get("Retry-After"))
	assert.Equal(t, "20", r.header.Get("X-Ratelimit-Remaining-Tokens"))
	clk.Advance(2 * time.Second)
	require.Equal(t, http.StatusOK, call(t, p, "").status)
}

// TestAbandonedCallStaysInFlightUntilItsLatencyEnds: a caller that gives
// up on a call does not end it at the provider: the call counts as cut,
// and in flight, until its latency is over.
func TestAbandonedCallStaysInFlightUntilItsLatencyEnds(t *testing.T) {
	clk := clockwork.NewFakeClock()
	p := start(t, llmprovider.Config{Concurrency: 1, Latency: time.Second, Clock: clk})
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL(), nil)
	require.NoError(t, err)
	failed := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		failed <- err
	}()
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	require.NoError(t, clk.BlockUntilContext(wctx, 1)) // admitted, running
	cancel()
	require.Error(t, <-failed)
	require.Eventually(t, func() bool { return p.Stats().Cut == 1 }, 5*time.Second, time.Millisecond)

	r := call(t, p, "")
	assert.Equal(t, http.StatusTooManyRequests, r.status, "the abandoned call still runs")
	assert.Equal(t, "concurrency", r.header.Get(llmprovider.RefusedHeader))
	clk.Advance(time.Second)
	done := make(chan reply, 1)
	go func() { done <- call(t, p, "") }()
	require.NoError(t, clk.BlockUntilContext(wctx, 1)) // admitted: the abandoned call left
	clk.Advance(time.Second)
	assert.Equal(t, http.StatusOK, (<-done).status)
	s := p.Stats()
	assert.Equal(t, int64(2), s.Accepted)
	assert.Equal(t, int64(1), s.Cut)
	assert.Equal(t, 1, s.MaxInFlight)
}

// TestUsageIsOpenAIs: the answer's usage is what httpclient.WithCost reads
// (prompt and completion tokens), adding up to total_tokens.
func TestUsageIsOpenAIs(t *testing.T) {
	p := start(t, llmprovider.Config{MinTokens: 5, MaxTokens: 50, Seed: 3})
	for range 10 {
		resp, err := http.Post(p.URL(), "application/json", nil)
		require.NoError(t, err)
		var u struct {
			Usage struct {
				PromptTokens     int64 `json:"prompt_tokens"`
				CompletionTokens int64 `json:"completion_tokens"`
				TotalTokens      int64 `json:"total_tokens"`
			} `json:"usage"`
		}
		err = json.NewDecoder(resp.Body).Decode(&u)
		resp.Body.Close()
		require.NoError(t, err)
		assert.Positive(t, u.Usage.PromptTokens)
		assert.Positive(t, u.Usage.CompletionTokens)
		assert.Equal(t, u.Usage.TotalTokens, u.Usage.PromptTokens+u.Usage.CompletionTokens)
	}
}

// TestFixedCountingStartsAfreshEachWindow: a fixed window admits its
// limits, refuses beyond them until its end (the reset naming it), and
// the next window admits its limits afresh, right after the last calls
// of the one before.
func TestFixedCountingStartsAfreshEachWindow(t *testing.T) {
	clk := clockwork.NewFakeClock()
	p := start(t, llmprovider.Config{RPM: 3, TPM: 100, Window: time.Second, MinTokens: 10, MaxTokens: 10,
		Counting: llmprovider.Fixed, Clock: clk})
	clk.Advance(900 * time.Millisecond)
	for i := range 3 {
		r := call(t, p, "")
		require.Equal(t, http.StatusOK, r.status, "call %d", i)
		assert.Equal(t, fmt.Sprint(2-i), r.header.Get("X-Ratelimit-Remaining-Requests"))
		assert.Equal(t, "100ms", r.header.Get("X-Ratelimit-Reset-Requests"), "the window ends 100 ms on")
	}
	r := call(t, p, "")
	require.Equal(t, http.StatusTooManyRequests, r.status)
	assert.Equal(t, "requests", r.header.Get(llmprovider.RefusedHeader))
	clk.Advance(100 * time.Millisecond)
	for i := range 3 {
		require.Equal(t, http.StatusOK, call(t, p, "").status, "call %d of the next window", i)
	}
	require.Equal(t, http.StatusTooManyRequests, call(t, p, "").status)
	s := p.Stats()
	assert.Equal(t, int64(6), s.Accepted)
	assert.Equal(t, int64(6), s.MaxRequestsInWindow, "fixed windows admit twice the limit within one window across their edge")
}

// TestLatencyIsDrawnWithinTheJitter: each call runs Latency give or take
// Jitter, and the tallies sum the calls' running times.
func TestLatencyIsDrawnWithinTheJitter(t *testing.T) {
	const lat, jit = 40 * time.Millisecond, 20 * time.Millisecond
	p := start(t, llmprovider.Config{Window: time.Hour, Latency: lat, Jitter: jit, Seed: 3})
	const n = 20
	for i := range n {
		require.Equal(t, http.StatusOK, call(t, p, "").status, "call %d", i)
	}
	tl := p.Tallies()
	require.Len(t, tl, 1)
	assert.Equal(t, int64(n), tl[0].Requests)
	assert.GreaterOrEqual(t, tl[0].Busy, n*(lat-jit))
	assert.LessOrEqual(t, tl[0].Busy, n*(lat+jit))
	assert.NotEqual(t, n*lat, tl[0].Busy, "latencies drawn, not all the same")
	_, err := llmprovider.Start(llmprovider.Config{Latency: lat, Jitter: 2 * lat})
	assert.ErrorIs(t, err, throttle.ErrInvalid, "a jitter beyond the latency")
}
