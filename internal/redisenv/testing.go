package redisenv

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
)

// Once per process, New and NewCluster print which kind of Redis the tests
// use to stderr, besides t.Logf, so `go test -v` and failing runs show it.
var (
	announceReal    sync.Once
	announceStandIn sync.Once
	announceSkip    sync.Once
)

// stderr prints a once-per-process line.
var stderr = func(line string) { fmt.Fprintln(os.Stderr, line) }

// New starts a server with [Start] for the test, closes it in t.Cleanup and
// fails the test if it cannot start, in particular when redis-server is
// required ([RequireEnv], [RequireReal]) but not installed. It logs which
// kind of server runs.
func New(t testing.TB, opts ...Option) *Server {
	t.Helper()
	quietClientLog()
	s, err := Start(opts...)
	if err != nil {
		if errors.Is(err, ErrNoRedisServer) {
			t.Fatalf("redisenv: redis-server is required but not installed (install it: apt-get install -y redis-server; unset %s to allow the stand-in): %v", RequireEnv, err)
		} else {
			t.Fatalf("redisenv: %v", err)
		}
		return nil
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("redisenv: %v", err)
		}
	})
	if s.Real() {
		line := fmt.Sprintf("redisenv: using real %s at %s", s.Kind(), s.Addr())
		t.Log(line)
		announceReal.Do(func() { stderr(line) })
	} else if os.Getenv(StandInEnv) == "1" {
		line := fmt.Sprintf("redisenv: using the %s at %s because %s=1; tests that need a real redis-server process skip", s.Kind(), s.Addr(), StandInEnv)
		t.Log(line)
		announceStandIn.Do(func() { stderr(line) })
	} else {
		line := fmt.Sprintf("redisenv: WARNING: using the %s at %s, NOT a real Redis; install redis-server (apt-get install -y redis-server), and set %s=1 to forbid the stand-in", s.Kind(), s.Addr(), RequireEnv)
		t.Log(line)
		announceStandIn.Do(func() { stderr(line) })
	}
	return s
}

// NewCluster starts a cluster with [StartCluster] for the test and closes it
// in t.Cleanup. Without a redis-server binary it skips the test, loudly, or
// fails it when [RequireEnv] or [RequireReal] demand a real server; it fails
// the test on any other error.
func NewCluster(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	quietClientLog()
	c, err := StartCluster(opts...)
	if err != nil {
		if !errors.Is(err, ErrNoRedisServer) {
			t.Fatalf("redisenv: %v", err)
			return nil
		}
		if cfg, cerr := newConfig(opts); cerr == nil && !cfg.requireReal {
			line := fmt.Sprintf("redisenv: SKIPPING Redis Cluster test: redis-server is not installed and Cluster has no stand-in; install it: apt-get install -y redis-server (%v)", err)
			if errors.Is(err, errHidden) {
				line = fmt.Sprintf("redisenv: SKIPPING Redis Cluster test: %s=1 hides redis-server and Cluster has no stand-in", StandInEnv)
			}
			announceSkip.Do(func() { stderr(line) })
			t.Skip(line)
			return nil
		}
		t.Fatalf("redisenv: redis-server is required but not installed (install it: apt-get install -y redis-server): %v", err)
		return nil
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("redisenv: %v", err)
		}
	})
	line := fmt.Sprintf("redisenv: using real Redis Cluster (%s) at %v", c.nodes[0].Kind(), c.Addrs())
	t.Log(line)
	announceReal.Do(func() { stderr(line) })
	return c
}

// NeedReal stops a test that needs a real redis-server (to pause, kill or
// restart it) when s is the in-process stand-in: it fails the test when
// [RequireEnv] is "1" (as in CI, so that nothing is skipped there) and
// skips it otherwise, saying why.
func NeedReal(t testing.TB, s *Server, why string) {
	t.Helper()
	if s.Real() {
		return
	}
	needBinary(t, why)
}

// needBinary fails (under RequireEnv) or skips a test that cannot run
// without the redis-server binary.
func needBinary(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("redisenv: %s needs a real redis-server and %s=1 forbids skipping: install it (apt-get install -y redis-server)", why, RequireEnv)
		return
	}
	if os.Getenv(StandInEnv) == "1" {
		t.Skipf("redisenv: SKIP: %s needs a real redis-server process; %s=1 hides the installed one", why, StandInEnv)
		return
	}
	t.Skipf("redisenv: SKIP: %s needs a real redis-server process, which is not installed; install it to run this test (apt-get install -y redis-server, or brew install redis)", why)
}

// UsesStandIn reports whether [Start] would start the in-process stand-in
// now: [StandInEnv] is "1", or no redis-server binary is installed, and
// [RequireEnv] does not forbid the stand-in. Tests use it to tell figures
// of throughput, which the stand-in cannot reach on a busy machine, from
// guarantees, which it must keep.
func UsesStandIn() bool {
	cfg, err := newConfig(nil)
	if err != nil || cfg.check() != nil || cfg.requireReal {
		return false
	}
	_, err = binary(cfg)
	return err != nil
}

// Shortfall reports a throughput figure below its bound (utilization, how
// fast a new limit is reached): a test failure against a real redis-server,
// a log line against the in-process stand-in (see [UsesStandIn]). The
// stand-in builds a fresh Lua interpreter for every script call (about
// 0.3 ms, several under -race), so dozens of callers on a busy machine
// queue behind it, store calls pass their bound and limiters fall back to
// their failure policy. Guarantees (nothing above a limit) must still be
// asserted with t.Errorf on both.
func Shortfall(t testing.TB, format string, args ...any) {
	t.Helper()
	if UsesStandIn() {
		t.Logf("redisenv: not asserted on the stand-in (throughput): %s", fmt.Sprintf(format, args...))
		return
	}
	t.Errorf(format, args...)
}
