package httpclient_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

// periodic grants limit per aligned period (a second unless every says
// otherwise) of its clock, as a fixed window does, and says so
// (periodic: see throttle.Bucket).
type periodic struct {
	clock clockwork.Clock
	limit int64
	every time.Duration
	mu    sync.Mutex
	used  map[int64]int64
}

func (p *periodic) period() time.Duration {
	if p.every > 0 {
		return p.every
	}
	return time.Second
}

func (p *periodic) Take(_ context.Context, _ string, n int64, _ time.Duration) (throttle.Decision, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	since := p.clock.Now().Sub(time.Time{})
	k := int64(since / p.period())
	reset := time.Duration(k+1)*p.period() - since
	if p.used[k]+n > p.limit {
		return throttle.Decision{Delay: reset, Limit: p.limit, Remaining: p.limit - p.used[k], Reset: reset}, nil
	}
	p.used[k] += n
	return throttle.Decision{Granted: true, Limit: p.limit, Remaining: p.limit - p.used[k], Reset: reset}, nil
}

func (p *periodic) Fallback() (int64, time.Duration, int64) { return p.limit, p.period(), 1 }
func (p *periodic) Periodic() bool                          { return true }

// The Transport's calls of a period go at the limit's even pace instead of
// all at the period's start: the provider sees them a limit-th of the
// interval (of 95 % of it) apart.
func TestCallsAreSpreadOverThePeriod(t *testing.T) {
	clk := clockwork.NewFakeClockAt(time.Time{}.Add(time.Hour)) // at a period's start
	srv := newCountingServer(t, clk, func(_ int, w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })
	lim := throttle.New(&periodic{clock: clk, limit: 4, used: map[int64]int64{}}, throttle.WithClock(clk))
	defer lim.Close()
	client := &http.Client{Transport: mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport))}
	ctx := context.Background()
	done := make(chan int, 4)
	for range 4 {
		go func() { done <- get(t, ctx, client, srv.URL) }()
	}
	assert.Equal(t, http.StatusOK, <-done, "the period's first call goes at once")
	for i := 2; i >= 0; i-- {
		waitSleepers(t, clk, i+1) // every call left waits for its place
		assert.Equal(t, 3-i, srv.count(), "arrivals before the next place")
		clk.Advance(237500 * time.Microsecond) // a quarter of 95 % of the interval
		assert.Equal(t, http.StatusOK, <-done)
	}
	assert.Equal(t, 4, srv.count())
}

// A client whose timeout comes before a call's place in the period (the
// Transport's wait is then the request's deadline) sends the call at
// once: held until its deadline, the call would fail there, its permit
// spent for nothing.
func TestACallWhoseClientTimeoutComesBeforeItsPlaceGoesAtOnce(t *testing.T) {
	clk := clockwork.NewFakeClockAt(time.Time{}.Add(time.Hour)) // at a period's start
	srv := newCountingServer(t, clk, func(_ int, w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })
	lim := throttle.New(&periodic{clock: clk, limit: 10, every: time.Minute, used: map[int64]int64{}}, throttle.WithClock(clk))
	defer lim.Close()
	client := &http.Client{Transport: mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport)), Timeout: 2 * time.Second}
	ctx := context.Background()
	for i := range 4 { // the places are 0, 5.7, 11.4 and 17.1 s on (the limiter's clock stands still)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err, "call %d", i+1)
		drain(resp)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
	assert.Equal(t, 4, srv.count())
}
