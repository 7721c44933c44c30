package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/internal/redisenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start runs the provider with args on a free loopback port until the
// test ends, and returns its base URL and output.
func start(t *testing.T, args ...string) (string, *cli.SyncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &cli.SyncBuffer{}
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, append([]string{"-addr", "127.0.0.1:0", "-duration", "0"}, args...), out, func(a string) { addrc <- a })
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-errc:
		cancel()
		t.Fatalf("provider: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("provider: %v", err)
		}
		if !strings.Contains(out.String(), "provider: served") {
			t.Errorf("no summary printed: %q", out.String())
		}
	})
	return "http://" + addr, out
}

// enforces checks the shipped limits: at most 10 GETs per second per
// organisation, headers on every answer, 429 with Retry-After beyond,
// other organisations unaffected.
func enforces(t *testing.T, base string) {
	t.Helper()
	client := &http.Client{}
	defer client.CloseIdleConnections()
	get := func(org string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, base+"/product/1", nil)
		req.Header.Set("X-Org-Id", org)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET: %v", err)
		}
		resp.Body.Close()
		return resp
	}
	ok, refused := 0, 0
	// 21 calls span at most two 1 s windows, so at least one is refused.
	for range 21 {
		resp := get("acme")
		for _, h := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit"} {
			if resp.Header.Get(h) == "" {
				t.Errorf("answer %s lacks %s", resp.Status, h)
			}
		}
		switch resp.StatusCode {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			refused++
			if resp.Header.Get("Retry-After") == "" {
				t.Errorf("a 429 without Retry-After")
			}
		default:
			t.Errorf("status %s", resp.Status)
		}
	}
	if ok > 20 || refused == 0 {
		t.Errorf("%d served and %d refused of 21 calls; want at most 10 per second", ok, refused)
	}
	if resp := get("initech"); resp.StatusCode != http.StatusOK {
		t.Errorf("another organisation got %s; want 200", resp.Status)
	}
	// PUT: 10 per sliding 10 s, so the 11th in a row is refused.
	for i := 1; i <= 11; i++ {
		req, _ := http.NewRequest(http.MethodPut, base+"/product/1", strings.NewReader("{}"))
		req.Header.Set("X-Org-Id", "acme")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("PUT: %v", err)
		}
		resp.Body.Close()
		want := http.StatusNoContent
		if i == 11 {
			want = http.StatusTooManyRequests
		}
		if resp.StatusCode != want {
			t.Errorf("PUT %d: %s, want %d", i, resp.Status, want)
		}
		if got := resp.Header.Get("X-RateLimit-Remaining"); i <= 10 && got != fmt.Sprint(10-i) {
			t.Errorf("PUT %d: X-RateLimit-Remaining %q, want %d", i, got, 10-i)
		}
	}
}

func TestProviderInMemory(t *testing.T) {
	base, _ := start(t)
	enforces(t, base)
}

func TestProviderRedis(t *testing.T) {
	rs := redisenv.New(t)
	base, out := start(t, "-redis", rs.Addr())
	enforces(t, base)
	if !strings.Contains(out.String(), "in Redis at "+rs.Addr()) {
		t.Errorf("the banner does not say the limits are in Redis: %q", out.String())
	}
}

func TestProviderConfigFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "limits.yaml")
	os.WriteFile(good, []byte("slas:\n  - id: all\n    tiers: [{period: 60, threshold: 1}]\n"), 0o600)
	base, _ := start(t, "-config", good)
	for i, want := range []int{http.StatusNotFound, http.StatusTooManyRequests} {
		resp, err := http.Get(base + "/anything")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("call %d: %s, want %d", i+1, resp.Status, want)
		}
	}
	http.DefaultClient.CloseIdleConnections()
}

func TestProviderRefusesBadFlags(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("slas:\n  - id: a\n    tiers:\n      - period: ten\n        threshold: 1\n"), 0o600)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-config", bad}, "line 4: slas[0].tiers[0].period"},
		{[]string{"-config", filepath.Join(dir, "none.yaml")}, "no such file"},
		{[]string{"-addr", "0.0.0.0:8080"}, "-public"},
		{[]string{"-addr", "nonsense"}, "-addr"},
		{[]string{"-duration", "-1s"}, "-duration"},
		{[]string{"-redis", "127.0.0.1:1"}, "-redis"},
	}
	for _, tt := range tests {
		err := run(context.Background(), tt.args, &cli.SyncBuffer{}, nil)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("run(%q): %v; want an error mentioning %q", tt.args, err, tt.want)
		}
	}
}

// TestCommandLine checks the conventions every example tool keeps (see
// internal/cli): usage on -h, exit 2 with one line for bad usage or setup
// (a stray argument is refused, not left to hide every flag after it),
// and the summary on SIGTERM. The provider has no check of its own to
// fail.
func TestCommandLine(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	cli.Check(t, command, append(cli.Conventions("provider", "-duration=-1s", "-addr=192.0.2.1:80", "-config=/no/such/file.yaml"),
		cli.Case{Name: "stray before flags", Args: []string{"stray", "-duration", "300ms"}, Code: cli.ExitUsage, Stderr: `unexpected argument "stray"`},
		cli.Case{Name: "ok", Args: []string{"-addr", "127.0.0.1:0", "-duration", "200ms"}, Code: cli.ExitOK, Stdout: "provider: served"},
		cli.Case{Name: "redis not answering", Args: []string{"-addr", "127.0.0.1:0", "-redis", closed.Addr().String()}, Code: cli.ExitUsage, Stderr: "provider: "},
	))
	cli.Terminate(t, command, []string{"-addr", "127.0.0.1:0", "-duration", "0"}, "provider: serving", "provider: served", cli.ExitOK)
}
