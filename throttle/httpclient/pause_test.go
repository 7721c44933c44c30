package httpclient_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

// TestAProvidersPauseHoldsTheLimitersWaitingCallers: a caller of the
// Transport's Limiter that waits for its permit's time when the provider
// answers 429 with Retry-After does not return in the pause: its permit
// is given back and it waits for the pause's end. (The Transport pauses
// the key through its Limiter, as Limiter.Report does, not only in the
// bucket.)
func TestAProvidersPauseHoldsTheLimitersWaitingCallers(t *testing.T) {
	clk := clockwork.NewFakeClock()
	local, err := throttle.NewLocal(1, time.Second, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	b := &pausingLocal{Local: local, clock: clk}
	lim := throttle.New(b, throttle.WithClock(clk))
	defer lim.Close()
	srv := newCountingServer(t, clk, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "10")
		http.Error(w, "slow down", http.StatusTooManyRequests)
	})
	client := &http.Client{Transport: mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport), httpclient.WithRetries(0))}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := lim.Acquire(ctx, 0); err != nil {
		t.Fatal(err)
	}
	// The permit goes with the request; the next one is a second away.
	held := lim.Key("").ContextWithPermit(ctx, 1)
	start := clk.Now()
	returned := make(chan time.Duration, 1)
	go func() {
		err := lim.Acquire(ctx, 20*time.Second)
		if err != nil {
			t.Errorf("the waiting caller: %v", err)
		}
		returned <- clk.Since(start)
	}()
	if err := clk.BlockUntilContext(ctx, 1); err != nil { // it sleeps until its permit's time
		t.Fatal(err)
	}

	req, _ := http.NewRequestWithContext(held, http.MethodGet, srv.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	if resp.StatusCode != http.StatusTooManyRequests || srv.count() != 1 {
		t.Fatalf("status %d after %d requests; want the one 429", resp.StatusCode, srv.count())
	}

	clk.Advance(time.Second) // the waiting caller's time, in the pause
	blocked := make(chan error, 1)
	go func() { blocked <- clk.BlockUntilContext(ctx, 2) }() // its deadline's timer and its key's gate's
	select {
	case at := <-returned:
		t.Fatalf("the waiting caller returned at +%v, in the provider's pause (until +10s)", at)
	case err := <-blocked:
		if err != nil {
			t.Fatalf("the waiting caller neither returned nor waited for the pause's end: %v", err)
		}
	}
	clk.Advance(9 * time.Second)
	select {
	case at := <-returned:
		if at < 10*time.Second {
			t.Errorf("the waiting caller returned at +%v; want at the pause's end, +10s", at)
		}
	case <-ctx.Done():
		t.Fatal("the waiting caller did not return after the pause")
	}
}
