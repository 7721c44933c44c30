package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/internal/redisenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// provider counts the requests that reach it; answer, when set, answers
// the n-th (from 1).
type provider struct {
	*httptest.Server
	mu       sync.Mutex
	arrivals []time.Time
}

func newProvider(t *testing.T, answer func(n int, w http.ResponseWriter)) *provider {
	p := &provider{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.arrivals = append(p.arrivals, time.Now())
		n := len(p.arrivals)
		p.mu.Unlock()
		if r.Header.Get("X-Org-Id") != "acme" {
			t.Errorf("request without X-Org-Id: acme")
		}
		if answer != nil {
			answer(n, w)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(p.Close)
	return p
}

func (p *provider) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.arrivals)
}

// summary runs the client and returns its counts.
func summary(t *testing.T, args ...string) (sent, ok, seen429, returned429, timeouts, errs int) {
	t.Helper()
	var out bytes.Buffer
	if err := run(context.Background(), args, &out); err != nil {
		t.Fatalf("run: %v", err)
	}
	var took string
	_, last, _ := strings.Cut(out.String(), "\n") // after the "calling" line
	if _, err := fmt.Sscanf(last, "httpclient: sent %d, ok %d, 429s %d (%d returned to callers), timeouts %d, errors %d in %s",
		&sent, &ok, &seen429, &returned429, &timeouts, &errs, &took); err != nil {
		t.Fatalf("summary %q: %v", out.String(), err)
	}
	t.Log(strings.TrimSpace(out.String()))
	return
}

func TestClientStaysUnderLimit(t *testing.T) {
	p := newProvider(t, nil)
	sent, ok, _, _, timeouts, errs := summary(t, "-target", p.URL+"/product/1", "-limit", "5", "-interval", "200ms",
		"-workers", "4", "-maxwait", "100ms", "-duration", "1s")
	if sent != p.count() {
		t.Errorf("the client says it sent %d, the provider saw %d", sent, p.count())
	}
	// Evenly spaced permits, 40 ms apart: at most 26 in 1 s, and a few
	// more for calls still waiting (up to -maxwait) at the end.
	if p.count() > 30 || ok != sent || errs != 0 {
		t.Errorf("provider saw %d calls (ok %d, errors %d); want at most 30 for 5 per 200ms over 1s (and calls waiting at the end)", p.count(), ok, errs)
	}
	if timeouts == 0 {
		t.Errorf("no call timed out, but calls arrived at twice the limit")
	}
}

func TestClientRedis(t *testing.T) {
	rs := redisenv.New(t)
	p := newProvider(t, nil)
	sent, ok, _, _, _, errs := summary(t, "-target", p.URL+"/product/1", "-limit", "5", "-interval", "200ms",
		"-workers", "4", "-maxwait", "100ms", "-duration", "1s", "-redis", rs.Addr())
	// The token bucket: at most 5 per refill, refills 200 ms apart.
	if sent != p.count() || p.count() > 35 || ok != sent || errs != 0 {
		t.Errorf("sent %d, provider saw %d, ok %d, errors %d; want at most 35 for 5 per 200ms over 1s", sent, p.count(), ok, errs)
	}
}

// TestClientRetriesAfter429: the 429 pauses the limit and the call is
// retried after it, so no caller sees it.
func TestClientRetriesAfter429(t *testing.T) {
	p := newProvider(t, func(n int, w http.ResponseWriter) {
		if n == 3 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		fmt.Fprint(w, "ok")
	})
	sent, ok, seen429, returned429, _, _ := summary(t, "-target", p.URL, "-limit", "20", "-interval", "1s",
		"-workers", "2", "-maxwait", "2s", "-timeout", "3s", "-duration", "1200ms")
	if seen429 != 1 || returned429 != 0 || ok != sent-1 {
		t.Errorf("429s seen %d, returned %d, ok %d of %d sent; want the one 429 retried", seen429, returned429, ok, sent)
	}
}

func TestClientRefusesBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-target", "http://192.0.2.1/"}, "-remote"},
		{[]string{"-target", "ftp://127.0.0.1/"}, "http"},
		{[]string{"-workers", "0"}, "-workers"},
		{[]string{"-duration", "0s"}, "-duration"},
		{[]string{"-timeout", "0s"}, "-timeout"},
		{[]string{"-maxwait", "-1s"}, "-maxwait"},
		{[]string{"-rate", "-1"}, "-rate"},
		{[]string{"-limit", "0"}, "limit"},
		{[]string{"-redis", "127.0.0.1:1"}, "-redis"},
	}
	for _, tt := range tests {
		err := run(context.Background(), tt.args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("run(%q): %v; want an error mentioning %q", tt.args, err, tt.want)
		}
	}
}

// TestCommandLine checks the conventions every example tool keeps (see
// internal/cli): usage on -h, exit 2 with one line for bad usage and a
// Redis that does not answer, exit 1 when every call failed, and the
// summary on SIGTERM.
func TestCommandLine(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer ok.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + closed.Addr().String() + "/"
	closed.Close() // nothing listens there any more: every call is refused

	cli.Check(t, command, append(cli.Conventions("httpclient", "-workers=0", "-target=ftp://x", "-target=http://example.com/", "-rate=x"),
		cli.Case{Name: "ok", Args: []string{"-target", ok.URL, "-duration", "300ms", "-limit", "100"}, Code: cli.ExitOK, Stdout: "httpclient: sent"},
		cli.Case{Name: "every call failed", Args: []string{"-target", refused, "-duration", "300ms"}, Code: cli.ExitFailed, Stderr: "every call failed"},
		cli.Case{Name: "redis not answering", Args: []string{"-target", ok.URL, "-redis", closed.Addr().String()}, Code: cli.ExitUsage, Stderr: "-redis"},
	))
	cli.Terminate(t, command, []string{"-target", ok.URL, "-duration", "1m"}, "httpclient: calling", "httpclient: sent", cli.ExitOK)
}
