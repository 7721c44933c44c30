package httpclient_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

// No exported function panics on a nil or empty input, RetryAfter(nil,
// now) included.
func TestExportedFunctionsTakeNilWithoutPanicking(t *testing.T) {
	if d, ok := httpclient.RetryAfter(nil, headerNow); d != 0 || ok {
		t.Errorf("RetryAfter(nil) = %v, %v; want 0, false", d, ok)
	}
	if d, ok := httpclient.RetryAfter(&http.Response{StatusCode: http.StatusTooManyRequests}, headerNow); d != 0 || ok {
		t.Errorf("RetryAfter(no header) = %v, %v; want 0, false", d, ok)
	}
	if a := httpclient.ReadAnswer(&http.Response{StatusCode: http.StatusTooManyRequests}, headerNow); a != (throttle.Answer{Refused: true}) {
		t.Errorf("ReadAnswer(429, no header) = %+v; want a refusal", a)
	}
	//lint:ignore SA1012 the nil context is the input under test
	if ctx := httpclient.ContextWithMaxWait(nil, time.Second); ctx == nil {
		t.Error("ContextWithMaxWait(nil, 1s) = nil")
	}

	req := httptest.NewRequest(http.MethodGet, "http://example.invalid/", nil)
	var nilTr *httpclient.Transport
	if _, err := nilTr.RoundTrip(req); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("nil Transport: RoundTrip = %v; want an error matching ErrInvalid", err)
	}
	nilTr.CloseIdleConnections()
	if _, err := (&httpclient.Transport{}).RoundTrip(req); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("zero Transport: RoundTrip = %v; want an error matching ErrInvalid", err)
	}
	b, err := throttle.NewLocal(10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tr := mustTransport(t, throttle.New(b))
	if _, err := tr.RoundTrip(nil); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("RoundTrip(nil) = %v; want an error matching ErrInvalid", err)
	}
	if _, err := tr.RoundTrip(&http.Request{Method: http.MethodGet}); err == nil {
		t.Error("RoundTrip(a request without a URL) succeeded")
	}
}

// staticBase answers every request with a 200 whose body is body.
type staticBase struct{ body *trackedBody }

func (s staticBase) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: s.body, Request: r}, nil
}

// A WithAnswer hook that panics after the send, before reading the body or
// after swapping it, does not leave the response body open, and its
// connection with it: the body is closed, and the panic still reaches the
// caller, as net/http's client lets a RoundTripper's panic through.
func TestPanickingAnswerHookClosesTheResponseBody(t *testing.T) {
	for name, hook := range map[string]func(*http.Response, *throttle.Answer){
		"before reading": func(*http.Response, *throttle.Answer) { panic("a broken hook") },
		"after swapping the body": func(resp *http.Response, _ *throttle.Answer) {
			resp.Body = http.NoBody // lost the provider's body, then panicked
			panic("a broken hook")
		},
	} {
		t.Run(name, func(t *testing.T) {
			body := &trackedBody{Reader: http.NoBody}
			b, err := throttle.NewLocal(10, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			tr := mustTransport(t, throttle.New(b), httpclient.WithBase(staticBase{body}), httpclient.WithAnswer(hook))
			req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://example.invalid/", nil)
			if err != nil {
				t.Fatal(err)
			}
			var got any
			func() {
				defer func() { got = recover() }()
				_, _ = (&http.Client{Transport: tr}).Do(req)
			}()
			if got != "a broken hook" {
				t.Errorf("the caller recovered %v; want the hook's panic", got)
			}
			if !body.closed.Load() {
				t.Error("the response body is still open after the hook's panic")
			}
		})
	}
}

// nothingBase is a broken base RoundTripper: no response and no error.
type nothingBase struct{}

func (nothingBase) RoundTrip(*http.Request) (*http.Response, error) { return nil, nil }

// A base RoundTripper that answers neither a response nor an error (a
// test double's zero answer) does not make RoundTrip panic on the missing
// response: it is an error naming the base, as http.Client makes it, and
// the request's slot is given back.
func TestBaseGivingNoResponseAndNoErrorIsAnError(t *testing.T) {
	b, err := throttle.NewLocal(10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	slots, err := throttle.NewLocalSlots(1)
	if err != nil {
		t.Fatal(err)
	}
	tr := mustTransport(t, throttle.New(b), httpclient.WithBase(nothingBase{}), httpclient.WithConcurrency(slots))
	req := httptest.NewRequest(http.MethodGet, "http://example.invalid/", nil)
	var resp *http.Response
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("RoundTrip panicked: %v", p)
			}
		}()
		resp, err = tr.RoundTrip(req)
	}()
	if resp != nil || err == nil || !strings.Contains(err.Error(), "nothingBase") {
		t.Errorf("RoundTrip = %v, %v; want an error naming the base", resp, err)
	}
	release, err := slots.Hold(context.Background(), "", 0)
	if err != nil {
		t.Fatalf("the slot is still held: %v", err)
	}
	release()
}
