package redisenv

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// withoutBinary hides redis-server for the rest of the test. Such tests
// cannot run in parallel.
func withoutBinary(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
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
