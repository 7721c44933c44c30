package redisenv

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2/server"
)

// withoutBinary hides redis-server for the rest of the test. Such tests
// cannot run in parallel.
func withoutBinary(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv(StandInEnv, "")
	saved := binaryCandidates
	binaryCandidates = nil
	t.Cleanup(func() { binaryCandidates = saved })
	if _, err := findBinary(); !errors.Is(err, ErrNoRedisServer) {
		t.Fatalf("findBinary = %v with the binary hidden", err)
	}
}

// fakeTB records what the helpers report instead of ending the test.
type fakeTB struct {
	testing.TB
	mu       sync.Mutex
	fatal    string
	skipped  string
	errored  string
	logged   string
	cleanups []func()
}

func (f *fakeTB) Helper()           {}
func (f *fakeTB) Log(args ...any)   {}
func (f *fakeTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fatal = fmt.Sprintf(format, args...)
}
func (f *fakeTB) Skip(args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.skipped = fmt.Sprint(args...)
}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errored = fmt.Sprintf(format, args...)
}
func (f *fakeTB) Logf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logged = fmt.Sprintf(format, args...)
}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.skipped = fmt.Sprintf(format, args...)
}
func (f *fakeTB) cleanup() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

func TestFallbackWithoutBinary(t *testing.T) {
	withoutBinary(t)
	t.Setenv(RequireEnv, "")

	var logs bytes.Buffer
	saved := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { slog.SetDefault(saved) })
	fallbackWarning = sync.Once{}

	s, err := Start()
	if err != nil {
		t.Fatalf("Start without a binary: %v", err)
	}
	defer s.Close()
	if s.Real() || s.Kind() != KindStandIn {
		t.Fatalf("Kind() = %q, Real() = %v; want the stand-in", s.Kind(), s.Real())
	}
	if err := s.Client().Ping(ctxT(t)).Err(); err != nil {
		t.Fatal(err)
	}
	if got := logs.String(); !strings.Contains(got, "level=WARN") || !strings.Contains(got, "NOT a real Redis") || !strings.Contains(got, "apt-get install -y redis-server") {
		t.Fatalf("fallback warning missing or unclear: %q", got)
	}

	var banner []string
	savedStderr := stderr
	stderr = func(line string) { banner = append(banner, line) }
	t.Cleanup(func() { stderr = savedStderr })
	announceStandIn = sync.Once{}
	f := &fakeTB{TB: t}
	if s := New(f); s == nil || s.Real() || f.fatal != "" {
		t.Fatalf("New without a binary = %v, fatal %q; want the stand-in", s, f.fatal)
	}
	f.cleanup()
	if len(banner) != 1 || !strings.Contains(banner[0], "NOT a real Redis") {
		t.Fatalf("stderr banner = %q", banner)
	}

	f = &fakeTB{TB: t}
	if c := NewCluster(f); c != nil || !strings.Contains(f.skipped, "SKIPPING") || f.fatal != "" {
		t.Fatalf("NewCluster without a binary = %v, skipped %q, fatal %q; want a skip", c, f.skipped, f.fatal)
	}
}

func TestRequireWithoutBinary(t *testing.T) {
	withoutBinary(t)
	for _, tc := range []struct {
		name string
		env  string
		opts []Option
	}{
		{"env", "1", nil},
		{"option", "", []Option{RequireReal()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(RequireEnv, tc.env)
			if _, err := Start(tc.opts...); !errors.Is(err, ErrNoRedisServer) {
				t.Fatalf("Start = %v, want ErrNoRedisServer", err)
			}
			f := &fakeTB{TB: t}
			if s := New(f, tc.opts...); s != nil || !strings.Contains(f.fatal, "redis-server is required") {
				t.Fatalf("New = %v, fatal %q; want a failure saying redis-server is required", s, f.fatal)
			}
			f = &fakeTB{TB: t}
			if c := NewCluster(f, tc.opts...); c != nil || !strings.Contains(f.fatal, "redis-server is required") || f.skipped != "" {
				t.Fatalf("NewCluster = %v, fatal %q, skipped %q; want a failure", c, f.fatal, f.skipped)
			}
		})
	}
	if _, err := StartCluster(); !errors.Is(err, ErrNoRedisServer) {
		t.Fatalf("StartCluster = %v, want ErrNoRedisServer", err)
	}
	// The stand-in stays available on request.
	t.Setenv(RequireEnv, "1")
	s, err := StartStandIn()
	if err != nil {
		t.Fatalf("StartStandIn under %s=1: %v", RequireEnv, err)
	}
	s.Close()
}

// TestStandInKeepsRealTime checks what the buckets need of the stand-in: a
// key set with PX expires as the wall clock passes, without anyone moving
// the stand-in's clock, PTTL counts down, and TIME (from a client and from
// Lua) is the wall clock. Before ClockTTL was turned on, the key lived
// forever and a token bucket's period never ended.
func TestStandInKeepsRealTime(t *testing.T) {
	t.Parallel()
	s, err := StartStandIn()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := s.Client()
	ctx := ctxT(t)

	for _, src := range []string{"client", "lua"} {
		var got time.Time
		if src == "client" {
			got, err = c.Time(ctx).Result()
		} else {
			var r []any
			r, err = c.Eval(ctx, "return redis.call('TIME')", nil).Slice()
			if err == nil {
				sec, _ := strconv.ParseInt(r[0].(string), 10, 64)
				usec, _ := strconv.ParseInt(r[1].(string), 10, 64)
				got = time.Unix(sec, usec*1000)
			}
		}
		if err != nil {
			t.Fatalf("TIME from %s: %v", src, err)
		}
		if d := time.Since(got); d < -50*time.Millisecond || d > 50*time.Millisecond {
			t.Fatalf("TIME from %s is %v away from the wall clock", src, d)
		}
	}

	const ttl = 150 * time.Millisecond
	start := time.Now()
	if err := c.Set(ctx, "k", "v", ttl).Err(); err != nil {
		t.Fatal(err)
	}
	// Poll on the server's own answer: the condition is the server's clock.
	prev := ttl + time.Millisecond
	for {
		pttl, err := c.PTTL(ctx, "k").Result()
		if err != nil {
			t.Fatal(err)
		}
		if pttl < 0 {
			break // -2: gone
		}
		if pttl >= prev {
			t.Fatalf("PTTL %v after %v: not counting down", pttl, prev)
		}
		prev = pttl
		if time.Since(start) > 2*time.Second {
			t.Fatalf("key still there %v after a %v TTL (PTTL %v)", time.Since(start), ttl, pttl)
		}
		time.Sleep(10 * time.Millisecond) // the server's clock must pass; nothing to wait on
	}
	if elapsed := time.Since(start); elapsed < ttl {
		t.Fatalf("key gone after %v, before its %v TTL", elapsed, ttl)
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS after expiry = %d, %v", n, err)
	}
}

// TestStandInForced checks StandInEnv: Start gives the stand-in although a
// binary may be installed, StartCluster refuses, NewCluster and NeedReal
// skip saying why, and together with RequireEnv it is an error.
func TestStandInForced(t *testing.T) {
	t.Setenv(StandInEnv, "1")
	t.Setenv(RequireEnv, "")
	s, err := Start()
	if err != nil {
		t.Fatalf("Start with %s=1: %v", StandInEnv, err)
	}
	defer s.Close()
	if s.Real() {
		t.Fatalf("Start with %s=1 gave %s", StandInEnv, s.Kind())
	}
	if _, err := StartCluster(); !errors.Is(err, ErrNoRedisServer) {
		t.Fatalf("StartCluster with %s=1 = %v, want ErrNoRedisServer", StandInEnv, err)
	}
	f := &fakeTB{TB: t}
	if c := NewCluster(f); c != nil || !strings.Contains(f.skipped, StandInEnv) || f.fatal != "" {
		t.Fatalf("NewCluster = %v, skipped %q, fatal %q; want a skip naming %s", c, f.skipped, f.fatal, StandInEnv)
	}
	f = &fakeTB{TB: t}
	NeedReal(f, s, "pausing the server")
	if !strings.Contains(f.skipped, "pausing the server") || !strings.Contains(f.skipped, StandInEnv) || f.fatal != "" {
		t.Fatalf("NeedReal: skipped %q, fatal %q", f.skipped, f.fatal)
	}

	t.Setenv(RequireEnv, "1")
	if _, err := Start(); !errors.Is(err, errContradiction) {
		t.Fatalf("Start with both %s and %s = %v, want the contradiction", StandInEnv, RequireEnv, err)
	}
	f = &fakeTB{TB: t}
	NeedReal(f, s, "pausing the server")
	if !strings.Contains(f.fatal, "needs a real redis-server") || f.skipped != "" {
		t.Fatalf("NeedReal under %s=1: fatal %q, skipped %q; want a failure", RequireEnv, f.fatal, f.skipped)
	}
}

// TestShortfall: a throughput figure below its bound fails a test against a
// real server and is only logged against the stand-in, as UsesStandIn says.
func TestShortfall(t *testing.T) {
	for _, tc := range []struct {
		name, standIn, require string
		hide, want             bool
	}{
		{"forced", "1", "", false, true},
		{"no binary", "", "", true, true},
		{"no binary, required", "", "1", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.hide {
				withoutBinary(t)
			}
			t.Setenv(StandInEnv, tc.standIn)
			t.Setenv(RequireEnv, tc.require)
			if got := UsesStandIn(); got != tc.want {
				t.Fatalf("UsesStandIn() = %v, want %v", got, tc.want)
			}
			f := &fakeTB{TB: t}
			Shortfall(f, "utilization %d%%", 40)
			if tc.want && (f.errored != "" || !strings.Contains(f.logged, "utilization 40%")) {
				t.Errorf("on the stand-in: errored %q, logged %q; want only a log line", f.errored, f.logged)
			}
			if !tc.want && f.errored != "utilization 40%" {
				t.Errorf("on a real server: errored %q; want the failure", f.errored)
			}
		})
	}
	if _, err := findBinary(); err == nil {
		t.Setenv(StandInEnv, "")
		t.Setenv(RequireEnv, "")
		if UsesStandIn() {
			t.Error("UsesStandIn() with redis-server installed and nothing forced = true")
		}
	}
}

// TestScriptKeepsAKeyAliveThatWasAliveAtItsStart: Redis judges expiry at
// the time a script started, so a key alive then stays readable until the
// script ends, however long it runs; the stand-in must too. Each run reads
// the key's PTTL, stalls past the key's TTL (the real server in a loop on
// TIME; the stand-in in its pre-command hook, which runs before a script's
// commands too), then GETs the key. A stand-in that let the key expire in
// between (miniredis's ClockTTL moves its clock on every key access) broke
// window.lua: a script that read TIME just before its window's end and
// its counter just after found none and started the full window afresh
// (TestConformance/FixedWindow on a loaded machine: 31 permits where 3
// windows of 10 fit).
func TestScriptKeepsAKeyAliveThatWasAliveAtItsStart(t *testing.T) {
	const script = `
local pttl = redis.call('PTTL', KEYS[1])
local t0 = redis.call('TIME')
local from = tonumber(t0[1]) * 1000000 + tonumber(t0[2])
local spin = tonumber(ARGV[1])
while spin > 0 do
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000000 + tonumber(t[2]) - from >= spin then break end
end
return {pttl, redis.call('GET', KEYS[1])}`
	const ttl = 200 * time.Millisecond
	kinds(t, func(t *testing.T, s *Server) {
		c := s.Client()
		ctx := ctxT(t)
		for attempt := 1; ; attempt++ {
			key := fmt.Sprintf("k%d", attempt)
			if err := c.Set(ctx, key, "v", ttl).Err(); err != nil {
				t.Fatal(err)
			}
			// The key is gone by the wall clock once this has passed.
			past := time.Now().Add(ttl + 20*time.Millisecond)
			spin := int64(0)
			var stalled atomic.Bool
			if s.Real() {
				spin = time.Until(past).Microseconds()
			} else {
				s.mini.Server().SetPreHook(func(_ *server.Peer, cmd string, args ...string) bool {
					if cmd == "GET" && len(args) == 1 && args[0] == key && stalled.CompareAndSwap(false, true) {
						time.Sleep(time.Until(past))
					}
					return false
				})
			}
			r, err := c.Eval(ctx, script, []string{key}, spin).Slice()
			if !s.Real() {
				s.mini.Server().SetPreHook(nil)
				if !stalled.Load() {
					t.Fatalf("the script's GET was not held up by the hook: nothing checked")
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			if pttl, _ := r[0].(int64); pttl <= 0 {
				// The script started after the key expired: too slow a
				// machine to tell; try again with a new key.
				if attempt == 3 {
					t.Fatalf("three scripts in a row started after their key's %v TTL (PTTL %d)", ttl, pttl)
				}
				continue
			}
			if len(r) < 2 || r[1] != "v" {
				t.Fatalf("a key alive at the script's start (PTTL %v) read after its TTL within the script = %v; want \"v\": expiry must be judged at the script's start", r[0], r[1:])
			}
			if n, err := c.Exists(ctx, key).Result(); err != nil || n != 0 {
				t.Fatalf("EXISTS after the script = %d, %v; want 0: the key's TTL has passed", n, err)
			}
			return
		}
	})
}
