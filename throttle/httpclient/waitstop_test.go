package httpclient_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

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
	if got := srv.served.Load(); got != 1 {
		t.Fatalf("served %d, want 1: the stopped request sent nothing", got)
	}
}
