package provider

import (
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

func TestPeriodsPolicyOpensANewPeriodAfterTheInterval(t *testing.T) {
	p := &Provider{cfg: Config{Limit: 2, Interval: time.Second, Policy: Periods}, seen: map[recordID]int{}}
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at time.Duration
		ok bool
	}{{0, true}, {500 * time.Millisecond, true}, {999 * time.Millisecond, false}, {1500 * time.Millisecond, true}, {1600 * time.Millisecond, true}, {1700 * time.Millisecond, false}, {2499 * time.Millisecond, false}, {2500 * time.Millisecond, true}}
	for _, s := range steps {
		ok, _ := p.admit(t0.Add(s.at))
		assert.Equal(t, s.ok, ok, "request at %v", s.at)
	}
	assert.Equal(t, int64(2), p.Stats().MaxInWindow)
}
