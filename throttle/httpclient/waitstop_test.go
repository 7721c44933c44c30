package httpclient_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

// A request whose wait for a concurrency slot is stopped
// (throttle.ContextWithWaitStop) fails with an error that matches
// context.Canceled and names the stop's cause, as a stopped permit wait
// does, and sends nothing.
func TestTransportSlotWaitStoppedNamesTheStopsCause(t *testing.T) {
	srv := newInFlightServer(t, 0)
	slots, _ := throttle.NewLocalSlots(1)
	tr := mustTransport(t, fastLimiter(t), httpclient.WithConcurrency(slots))
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	first, err := client.Get(srv.URL) // holds the only slot while its body is open
	if err != nil {
		t.Fatal(err)
	}
	defer drain(first)

	gone := errors.New("partition gone")
	stop, end := context.WithCancelCause(context.Background())
	end(gone)
	ctx := throttle.ContextWithWaitStop(context.Background(), stop)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	_, err = client.Do(req)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, gone) {
		t.Fatalf("request whose slot wait was stopped = %v, want context.Canceled naming the stop's cause", err)
	}
	if n := strings.Count(err.Error(), "permit waits stopped"); n != 1 {
		t.Fatalf("request whose slot wait was stopped = %v: names the stop %d times, want once", err, n)
	}
	if got := srv.served.Load(); got != 1 {
		t.Fatalf("served %d, want 1: the stopped request sent nothing", got)
	}
}

// A request retried after a provider's 429 waits out the pause; when its
// waits are stopped meanwhile, it returns at once with an error naming
// the stop's cause, sends nothing more, and its context goes on.
func TestTransportPauseWaitBeforeARetryEndsWhenItsWaitsAreStopped(t *testing.T) {
	clk := clockwork.NewFakeClock()
	srv := newCountingServer(t, clk, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.Header().Set("Retry-After", "5")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		fmt.Fprint(w, "ok")
	})
	b, err := throttle.NewLocal(1000, time.Second, throttle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: mustTransport(t, throttle.New(b, throttle.WithClock(clk)), httpclient.WithBase(srv.Client().Transport))}

	gone := errors.New("partition gone")
	stop, end := context.WithCancelCause(context.Background())
	defer end(nil)
	ctx := throttle.ContextWithWaitStop(context.Background(), stop)
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		resp, err := client.Do(req)
		if err == nil {
			drain(resp)
		}
		done <- err
	}()
	bctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := clk.BlockUntilContext(bctx, 1); err != nil {
		t.Fatalf("the retry did not wait for the pause: %v", err)
	}
	end(gone)
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || !errors.Is(err, gone) {
			t.Fatalf("retry whose pause wait was stopped = %v, want context.Canceled naming the stop's cause", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stop did not end the pause wait")
	}
	if err := ctx.Err(); err != nil {
		t.Fatalf("the request's context ended too: %v", err)
	}
	if n := srv.count(); n != 1 {
		t.Fatalf("the server saw %d requests, want 1: nothing sent after the stop", n)
	}
}
