package provider

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func get(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

func TestProviderEnforcesAndCounts(t *testing.T) {
	for _, pol := range []Policy{Periods, Aligned, Sliding} {
		t.Run(pol.String(), func(t *testing.T) {
			// An hour-long interval: the test cannot cross a window.
			p, err := Start(Config{Limit: 3, Interval: time.Hour, Policy: pol})
			require.NoError(t, err)
			defer func() { require.NoError(t, p.Close()) }()
			http.DefaultClient.CloseIdleConnections()
			defer http.DefaultClient.CloseIdleConnections()

			for off := range 3 {
				assert.Equal(t, http.StatusOK, get(t, fmt.Sprintf("%s/call?topic=t&partition=1&offset=%d", p.URL(), off)))
			}
			resp, err := http.Get(p.URL() + "/call?topic=t&partition=1&offset=3")
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
			assert.NotEmpty(t, resp.Header.Get("Retry-After"))

			s := p.Stats()
			assert.Equal(t, Stats{Accepted: 3, Rejected: 1, MaxInWindow: 3, MaxInAnyInterval: 3, Records: 3}, s)
			assert.Equal(t, 1, p.Seen("t", 1, 2))
			assert.Equal(t, 0, p.Seen("t", 1, 3), "a refused request does not count as seen")
			assert.Equal(t, int64(3), p.Rate(time.Minute))
		})
	}
}

func TestProviderCountsDuplicatesAndBadInput(t *testing.T) {
	p, err := Start(Config{Limit: 10, Interval: time.Hour})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	defer http.DefaultClient.CloseIdleConnections()
	for range 3 {
		assert.Equal(t, http.StatusOK, get(t, p.URL()+"/?topic=a&partition=0&offset=7"))
	}
	assert.Equal(t, http.StatusBadRequest, get(t, p.URL()+"/?topic=a&partition=x&offset=7"))
	s := p.Stats()
	assert.Equal(t, int64(1), s.Records)
	assert.Equal(t, int64(2), s.Duplicates)

	_, err = Start(Config{Limit: 0, Interval: time.Second})
	assert.Error(t, err)
}

func TestPeriodsPolicy(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name string
		at   []time.Duration
		ok   []bool
	}{
		{"two per period", []time.Duration{0, 500 * ms, 999 * ms, 1500 * ms, 1600 * ms, 1700 * ms},
			[]bool{true, true, false, true, true, false}},
		// A period need not open with a request: requests at 0, 1.0, 1.5
		// and 1.9 s fit periods starting at 0 and 1.4 s.
		{"late refill", []time.Duration{0, 1000 * ms, 1500 * ms, 1900 * ms}, []bool{true, true, true, true}},
		// Nor as late as possible: 0, 1.2, 1.5, 2.1, 2.15 s fit only with a
		// period opening between 1.0 and 1.2 s.
		{"refill between", []time.Duration{0, 1200 * ms, 1500 * ms, 2100 * ms, 2150 * ms}, []bool{true, true, true, true, true}},
		{"three in a burst", []time.Duration{0, 1 * ms, 2 * ms, 1001 * ms, 1002 * ms, 1003 * ms}, []bool{true, true, false, true, true, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &Provider{cfg: Config{Limit: 2, Interval: time.Second, Policy: Periods}, seen: map[recordID]int{}}
			t0 := time.Unix(1000, 0)
			for i, at := range tt.at {
				ok, _ := p.admit(t0.Add(at))
				assert.Equal(t, tt.ok[i], ok, "request at %v", at)
			}
			assert.LessOrEqual(t, p.Stats().MaxInWindow, int64(2))
		})
	}
}

// TestPeriodsMeterMemoryStaysBounded: a long run keeps only the last few
// periods' requests.
func TestPeriodsMeterMemoryStaysBounded(t *testing.T) {
	var m periodsMeter
	accepted := 0
	for i := range 100_000 {
		if m.admit(int64(i)*int64(time.Millisecond), 10, int64(100*time.Millisecond)) {
			accepted++
		}
	}
	assert.Equal(t, 10_000, accepted, "10 per 100 ms over 100 s")
	assert.LessOrEqual(t, len(m.t), 4*11)
}

// With a latency, a request is counted when it arrives and answered only
// later: here never, until the caller gives up, and Close still returns.
func TestLatencyCountsOnArrival(t *testing.T) {
	_, err := Start(Config{Limit: 1, Interval: time.Hour, Latency: -time.Second})
	require.ErrorContains(t, err, "latency")

	p, err := Start(Config{Limit: 10, Interval: time.Hour, Latency: time.Hour})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	answered := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.URL()+"/call?topic=t&partition=0&offset=0&key=k", nil)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		answered <- err
	}()
	require.Eventually(t, func() bool { return p.Stats().Accepted == 1 }, 10*time.Second, time.Millisecond)
	select {
	case err := <-answered:
		t.Fatalf("answered before its latency: %v", err)
	default:
	}
	assert.Equal(t, 1, p.Seen("t", 0, 0))
	calls := p.Calls()
	require.Len(t, calls, 1)
	assert.Equal(t, Call{Topic: "t", Partition: 0, Offset: 0, Key: "k", At: calls[0].At}, calls[0])
	cancel()
	assert.ErrorIs(t, <-answered, context.Canceled)
}
