package httpclient_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

// inFlightServer is a provider on loopback that counts, by itself, the
// requests its handler runs at once.
type inFlightServer struct {
	*httptest.Server
	now, most, served atomic.Int64
}

func newInFlightServer(t *testing.T, hold time.Duration) *inFlightServer {
	s := &inFlightServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := s.now.Add(1)
		for m := s.most.Load(); n > m && !s.most.CompareAndSwap(m, n); m = s.most.Load() {
		}
		time.Sleep(hold) // the provider's work
		s.served.Add(1)
		s.now.Add(-1)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(s.Close)
	return s
}

// fastLimiter is a Limiter whose rate never binds in these tests.
func fastLimiter(t *testing.T) *throttle.Limiter {
	t.Helper()
	b, err := throttle.NewLocal(100000, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return throttle.New(b)
}

// TestTransportConcurrencyCapsTheFleetsRequestsInFlight: three
// Transports, each with its own Redis client and Concurrency, never have
// more than the cap's requests in the provider's handler at once, as the
// provider counts them.
func TestTransportConcurrencyCapsTheFleetsRequestsInFlight(t *testing.T) {
	const capacity, instances, workers, each = 2, 3, 3, 8
	rs := redisenv.New(t)
	srv := newInFlightServer(t, 3*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range instances {
		slots, err := bucket.NewConcurrency(rs.Client(), "provider", capacity)
		if err != nil {
			t.Fatal(err)
		}
		defer slots.Close()
		tr := mustTransport(t, fastLimiter(t), httpclient.WithConcurrency(slots))
		defer tr.CloseIdleConnections()
		client := &http.Client{Transport: tr}
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
					resp, err := client.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					drain(resp)
				}
			}()
		}
	}
	wg.Wait()
	if got := srv.served.Load(); got != instances*workers*each {
		t.Fatalf("served %d, want %d", got, instances*workers*each)
	}
	if m := srv.most.Load(); m > capacity || m < 1 {
		t.Fatalf("the provider saw %d in flight, want 1..%d", m, capacity)
	}
}

// TestTransportHoldsTheSlotUntilTheBodyIsClosed: a response whose body is
// open keeps its slot; closing it frees the slot for the next request.
func TestTransportHoldsTheSlotUntilTheBodyIsClosed(t *testing.T) {
	srv := newInFlightServer(t, 0)
	slots, _ := throttle.NewLocalSlots(1)
	tr := mustTransport(t, fastLimiter(t), httpclient.WithConcurrency(slots))
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	ctx := context.Background()

	first, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(httpclient.ContextWithMaxWait(ctx, 0), http.MethodGet, srv.URL, nil)
	if _, err := client.Do(req); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("request while the first body is open = %v, want ErrTimeout", err)
	}
	drain(first)
	resp, err := client.Do(req.Clone(req.Context()))
	if err != nil {
		t.Fatalf("request after the first body closed = %v", err)
	}
	drain(resp)
	if got := srv.served.Load(); got != 2 {
		t.Fatalf("served %d, want 2", got)
	}
}

// TestTransportTakesTheSlotBeforeThePermit: a request that finds no slot
// takes no permit, and a request whose permit does not come, or whose
// send fails, gives its slot back.
func TestTransportTakesTheSlotBeforeThePermit(t *testing.T) {
	srv := newInFlightServer(t, 0)
	slots, _ := throttle.NewLocalSlots(1)
	b, err := throttle.NewLocal(1, time.Hour) // a single permit
	if err != nil {
		t.Fatal(err)
	}
	tr := mustTransport(t, throttle.New(b), httpclient.WithConcurrency(slots), httpclient.WithMaxWait(30*time.Millisecond))
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	ctx := context.Background()

	taken, err := slots.Hold(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Get(srv.URL); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("request with every slot held = %v, want ErrTimeout", err)
	}
	taken()
	resp, err := client.Get(srv.URL) // the permit is still there
	if err != nil {
		t.Fatalf("request after the slot came back = %v, want the unspent permit", err)
	}
	drain(resp)
	if _, err := client.Get(srv.URL); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("request with no permit left = %v, want ErrTimeout", err)
	}
	rel, err := slots.Hold(ctx, "", 0)
	if err != nil {
		t.Fatalf("slot after a permit timeout = %v, want it given back", err)
	}
	rel()

	// A send that fails gives the slot back too.
	down := httptest.NewServer(http.NotFoundHandler())
	url := down.URL
	down.Close()
	tr2 := mustTransport(t, fastLimiter(t), httpclient.WithConcurrency(slots))
	if _, err := (&http.Client{Transport: tr2}).Get(url); err == nil {
		t.Fatal("request to a closed server succeeded")
	}
	rel, err = slots.Hold(ctx, "", 0)
	if err != nil {
		t.Fatalf("slot after a failed send = %v, want it given back", err)
	}
	rel()
}

type panickingBase struct{}

func (panickingBase) RoundTrip(*http.Request) (*http.Response, error) { panic("a broken RoundTripper") }

// A panic inside RoundTrip (the base RoundTripper's, or a WithAnswer
// hook's) gives the request's slot back: an http.Server recovers such
// panics, and the slot must not stay held for the life of the process.
func TestPanicInsideRoundTripGivesTheSlotBack(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer srv.Close()
	for name, opts := range map[string][]httpclient.Option{
		"base":        {httpclient.WithBase(panickingBase{})},
		"answer hook": {httpclient.WithBase(srv.Client().Transport), httpclient.WithAnswer(func(*http.Response, *throttle.Answer) { panic("a broken hook") })},
	} {
		t.Run(name, func(t *testing.T) {
			slots, err := throttle.NewLocalSlots(1)
			if err != nil {
				t.Fatal(err)
			}
			b, err := throttle.NewLocal(1000, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := httpclient.NewTransport(throttle.New(b), append(opts, httpclient.WithConcurrency(slots))...)
			if err != nil {
				t.Fatal(err)
			}
			req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
			if err != nil {
				t.Fatal(err)
			}
			func() {
				defer func() {
					if recover() == nil {
						t.Error("the panic did not reach the caller")
					}
				}()
				_, _ = tr.RoundTrip(req)
			}()
			release, err := slots.Hold(context.Background(), "", 0)
			if err != nil {
				t.Fatalf("the slot after the panic: %v, want it free again", err)
			}
			release()
		})
	}
}
