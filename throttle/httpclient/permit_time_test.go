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

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

// paced places its k-th permit k·every after its first take, on its
// clock, with a margin, as package bucket's TokenBucket places a crowd
// that can wait.
type paced struct {
	clock clockwork.Clock
	every time.Duration
	mu    sync.Mutex
	first time.Time
	k     int
}

func (p *paced) Take(_ context.Context, _ string, _ int64, _ time.Duration) (throttle.Decision, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	if p.first.IsZero() {
		p.first = now
	}
	at := p.first.Add(time.Duration(p.k) * p.every)
	p.k++
	return throttle.Decision{Granted: true, Delay: max(at.Sub(now), 0), Margin: time.Millisecond, Limit: 4, Remaining: 0, Reset: time.Second}, nil
}

// TestTheTransportSendsEachCallAtItsPermitsTime: calls whose permits have
// times ahead reach the provider at those times, not when the permits
// were granted.
func TestTheTransportSendsEachCallAtItsPermitsTime(t *testing.T) {
	clk := clockwork.NewFakeClock()
	srv := newCountingServer(t, clk, func(_ int, w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })
	lim := throttle.New(&paced{clock: clk, every: 250 * time.Millisecond}, throttle.WithClock(clk))
	defer lim.Close()
	client := &http.Client{Transport: mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport))}
	ctx := context.Background()
	done := make(chan int, 4)
	for range 4 {
		go func() { done <- get(t, ctx, client, srv.URL) }()
	}
	assert.Equal(t, http.StatusOK, <-done, "the first permit's time is now")
	for i := 2; i >= 0; i-- {
		waitSleepers(t, clk, i+1) // every call left waits for its permit's time
		assert.Equal(t, 3-i, srv.count(), "arrivals before the next permit's time")
		clk.Advance(250 * time.Millisecond)
		assert.Equal(t, http.StatusOK, <-done)
	}
	assert.Equal(t, 4, srv.count())
}
