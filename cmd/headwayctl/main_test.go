package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/internal/redisenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// ctl runs headwayctl with args against addr and returns its exit status,
// stdout and stderr.
func ctl(t *testing.T, addr string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"-redis", addr}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

func TestSetLimitShowClear(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	// The fleet: a token bucket of 100 per hour, one grant taken.
	b, err := bucket.NewTokenBucket(srv.Client(), "mparticle", 100, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Take(ctx, "", 1, 0); err != nil {
		t.Fatal(err)
	}

	code, out, errs := ctl(t, srv.Addr(), "show", "-key", "mparticle")
	if code != 0 {
		t.Fatalf("show: exit %d, %s", code, errs)
	}
	for _, want := range []string{"tokenbucket mparticle", "none set live", "limit 100, 1 counting, 99 left; the last stops counting in ", "paused     no", "instances  1 live"} {
		if !strings.Contains(out, want) {
			t.Errorf("show: want %q in\n%s", want, out)
		}
	}

	code, out, errs = ctl(t, srv.Addr(), "set-limit", "-key", "mparticle", "-limit", "300")
	if code != 0 || !strings.Contains(out, "limit set to 300") || !strings.Contains(out, "next take") {
		t.Fatalf("set-limit: exit %d, out %q, err %q", code, out, errs)
	}
	// The fleet applies it from its next take; State says so.
	st, err := b.State(ctx, "")
	if err != nil || !st.Live || st.Limit != 300 || st.Current != 300 {
		t.Fatalf("State after set-limit: %+v, %v", st, err)
	}
	code, out, _ = ctl(t, srv.Addr(), "show", "-key", "mparticle", "-default", "100")
	if code != 0 || !strings.Contains(out, "300 (set live; default 100)") {
		t.Fatalf("show after set-limit: exit %d\n%s", code, out)
	}

	code, out, _ = ctl(t, srv.Addr(), "show", "-key", "mparticle", "-json")
	var js map[string]any
	if err := json.Unmarshal([]byte(out), &js); code != 0 || err != nil {
		t.Fatalf("show -json: exit %d, %v\n%s", code, err, out)
	}
	if js["limit"] != 300.0 || js["live"] != true || js["current"] != 300.0 || js["used"] != 1.0 || js["remaining"] != 299.0 || js["instances"] != 1.0 {
		t.Fatalf("show -json: %s", out)
	}

	if code, out, errs := ctl(t, srv.Addr(), "clear-limit", "-key", "mparticle"); code != 0 || !strings.Contains(out, "cleared") {
		t.Fatalf("clear-limit: exit %d, %q %q", code, out, errs)
	}
	if st, err := b.State(ctx, ""); err != nil || st.Live || st.Limit != 100 {
		t.Fatalf("State after clear-limit: %+v, %v", st, err)
	}
}

func TestTenantFixedWindowAndGCRA(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	fw, err := bucket.NewFixedWindow(srv.Client(), "get-product", 10, time.Hour, bucket.WithPrefix("app"))
	if err != nil {
		t.Fatal(err)
	}
	if code, _, errs := ctl(t, srv.Addr(), "-prefix", "app", "set-limit", "-bucket", "fixedwindow", "-interval", "1h", "-key", "get-product", "-tenant", "acme", "-limit", "3"); code != 0 {
		t.Fatalf("set-limit: exit %d: %s", code, errs)
	}
	for i := range 4 {
		d, err := fw.Take(ctx, "acme", 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		if d.Granted != (i < 3) || d.Limit != 3 {
			t.Fatalf("acme take %d: %+v, want the live limit 3", i, d)
		}
	}
	if d, _ := fw.Take(ctx, "", 1, 0); d.Limit != 10 {
		t.Fatalf("the base budget keeps its limit: %+v", d)
	}
	code, out, _ := ctl(t, srv.Addr(), "-prefix", "app", "show", "-bucket", "fixedwindow", "-interval", "1h", "-key", "get-product", "-tenant", "acme")
	if code != 0 || !strings.Contains(out, "3 per 1h0m0s (set live)") || !strings.Contains(out, "limit 3, 3 used, 0 left; next window in") {
		t.Fatalf("show: exit %d\n%s", code, out)
	}

	g, err := bucket.NewGCRA(srv.Client(), "billing", 10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Take(ctx, "", 1, 0); err != nil {
		t.Fatal(err)
	}
	code, out, _ = ctl(t, srv.Addr(), "show", "-bucket", "gcra", "-interval", "1s", "-key", "billing", "-default", "10")
	if code != 0 || !strings.Contains(out, "9 left now, 1 counted against the burst") {
		t.Fatalf("gcra show: exit %d\n%s", code, out)
	}
	code, out, _ = ctl(t, srv.Addr(), "pause", "-bucket", "gcra", "-interval", "1s", "-key", "billing", "-for", "2s")
	if code != 0 || !strings.Contains(out, "paused for 2s") {
		t.Fatalf("pause: exit %d: %s", code, out)
	}
	if d, _ := g.Take(ctx, "", 1, 0); d.Granted || d.Delay < time.Second {
		t.Fatalf("take while paused: %+v", d)
	}
	code, out, _ = ctl(t, srv.Addr(), "show", "-bucket", "gcra", "-interval", "1s", "-key", "billing")
	if code != 0 || !strings.Contains(out, "paused     for 1.9") && !strings.Contains(out, "paused     for 2s") {
		t.Fatalf("show while paused: exit %d\n%s", code, out)
	}
}

func TestUsageErrors(t *testing.T) {
	srv := redisenv.New(t)
	tests := []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "no command"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"show"}, 2, "-key is required"},
		{[]string{"set-limit", "-key", "k"}, 2, "-limit is required"},
		{[]string{"set-limit", "-key", "k", "-limit", "0"}, 2, "limit = 0"},
		{[]string{"set-limit", "-key", "k", "-limit", "2000000000"}, 2, "must be at most 1000000000"},
		{[]string{"set-limit", "-bucket", "fixedwindow", "-key", "k", "-limit", "5"}, 2, "-interval is required"},
		{[]string{"set-limit", "-bucket", "leaky", "-key", "k", "-limit", "5"}, 2, `-bucket = "leaky"`},
		{[]string{"set-limit", "-bucket", "gcra", "-interval", "1ms", "-key", "k", "-limit", "5000"}, 2, "one per microsecond"},
		{[]string{"pause", "-key", "k"}, 2, "-for is required"},
		{[]string{"pause", "-key", "k", "-for", "-1s"}, 2, "must be positive"},
		{[]string{"show", "-key", "k", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"show", "-nope"}, 2, "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, _, errs := ctl(t, srv.Addr(), tt.args...)
			if code != tt.code || !strings.Contains(errs, tt.want) {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit %d and %q", code, errs, tt.code, tt.want)
			}
		})
	}
}

func TestRedisDown(t *testing.T) {
	code, _, errs := ctl(t, "127.0.0.1:1", "-timeout", "2s", "show", "-key", "k")
	if code != 1 || !strings.Contains(errs, "headwayctl: ") || !strings.Contains(errs, "127.0.0.1:1") {
		t.Fatalf("exit %d, stderr %q; want 1 and the address", code, errs)
	}
}

// TestCommandLine checks the conventions every example tool keeps (see
// internal/cli), in headwayctl's form with commands: usage on -h (global
// or a command's) exits 0; bad usage exits 2 with one line; a Redis that
// does not answer exits 1. It runs one command and exits, so it has no
// summary to print on SIGTERM.
func TestCommandLine(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	cli.Check(t, run, []cli.Case{
		{Name: "-h", Args: []string{"-h"}, Code: cli.ExitOK, Stdout: "Usage:"},
		{Name: "-help", Args: []string{"-help"}, Code: cli.ExitOK, Stdout: "Global flags"},
		{Name: "command -h", Args: []string{"show", "-h"}, Code: cli.ExitOK, Stdout: "-tenant"},
		{Name: "help", Args: []string{"help"}, Code: cli.ExitOK, Stdout: "Commands:"},
		{Name: "no command", Args: nil, Code: cli.ExitUsage, Stderr: "no command given"},
		{Name: "unknown command", Args: []string{"stray", "-h"}, Code: cli.ExitUsage, Stderr: `unknown command "stray"`},
		{Name: "bad value", Args: []string{"-timeout", "soon", "show"}, Code: cli.ExitUsage, Stderr: "-timeout"},
		{Name: "unknown flag", Args: []string{"show", "-key", "k", "-nope"}, Code: cli.ExitUsage, Stderr: "-nope"},
		{Name: "stray after command", Args: []string{"show", "-key", "k", "extra"}, Code: cli.ExitUsage, Stderr: `unexpected argument "extra"`},
		{Name: "redis not answering", Args: []string{"-redis", closed.Addr().String(), "-timeout", "300ms", "show", "-key", "k"}, Code: cli.ExitFailed, Stderr: "headwayctl:"},
	})
}
