package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/internal/redisenv"
)

// TestMain quiets the library's logs (HEADWAY_TEST_LOG=1 shows them) and
// fails the package if any goroutine outlives its tests.
func TestMain(m *testing.M) {
	redisenv.QuietLogs()
	goleak.VerifyTestMain(m)
}

// The short soak CI runs: 5 s, 200 keys, 20 workers, a sample a second,
// for each bucket kind. Redis holds at most a few keys per limiter key
// while the load runs, and none shortly after it stops (every key
// expires); the goroutines and the heap stay flat, and the library's own
// goroutines within their caps at every sample; no Acquire fails.
func TestShortSoak(t *testing.T) {
	for _, kind := range []string{"tokenbucket", "gcra", "sliding"} {
		t.Run(kind, func(t *testing.T) {
			srv := redisenv.New(t)
			// The soak samples Redis's memory (INFO memory), which the
			// stand-in does not report, and runs 200 keys × 20 workers.
			redisenv.NeedReal(t, srv, "a soak that samples Redis's memory")
			cfg := defaultConfig()
			cfg.Duration, cfg.Keys, cfg.Workers, cfg.Sample = 5*time.Second, 200, 20, time.Second
			cfg.Bucket, cfg.Redis = kind, srv.Addr()
			var out bytes.Buffer
			rep, err := run(context.Background(), cfg, &out)
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatal(err)
			}
			if bad := rep.Failures(); len(bad) > 0 {
				t.Errorf("the soak failed: %q", bad)
			}
			if rep.Granted == 0 {
				t.Error("nothing granted: the soak tested nothing")
			}
			for _, s := range rep.Samples {
				// At most maxKeysPerKey Redis keys per limiter key,
				// whatever the bucket, and the set of live instances.
				if s.DBSize > int64(maxKeysPerKey*cfg.Keys+1) {
					t.Errorf("at %v: DBSIZE %d, more than %d per key (%d keys)", s.At, s.DBSize, maxKeysPerKey, cfg.Keys)
				}
			}
			if rep.EndGoroutine > rep.BaselineGoroutines+2 {
				t.Errorf("%d goroutines after the load, %d before", rep.EndGoroutine, rep.BaselineGoroutines)
			}

			// Every key expires: within two periods (plus slack) once the
			// load has stopped, every key is gone.
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			defer rdb.Close()
			wait := 2*cfg.Period + 3*time.Second
			deadline := time.Now().Add(wait)
			for {
				keys, err := rdb.Keys(context.Background(), "*").Result()
				if err != nil {
					t.Fatal(err)
				}
				left := keys
				if len(left) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d keys left %v after the load stopped, e.g. %q", len(left), wait, left[:min(len(left), 5)])
				}
				time.Sleep(50 * time.Millisecond) // polls an outcome (keys expiring on the server's clock), bounded
			}
		})
	}
}

// TestChurnSoak: keys that come and go (each used twice, 60,000 in all),
// adapting now and then, with Redis paused for a second early on (in the
// first third of the samples, the ramp): the heap of the last third is no
// higher than the middle third's, the goroutines than the first's (the
// Limiter forgets the keys that went idle, those asked in the outage once
// their local grants no longer count), and no Acquire fails.
func TestChurnSoak(t *testing.T) {
	redisenv.NeedReal(t, redisenv.New(t), "a soak that pauses its redis-server")
	cfg := defaultConfig()
	cfg.Duration, cfg.Workers, cfg.Sample = 9*time.Second, 20, 500*time.Millisecond
	cfg.Churn, cfg.Adaptive, cfg.OutageAt, cfg.OutageFor = 60_000, true, time.Second, time.Second
	var out bytes.Buffer
	rep, err := run(context.Background(), cfg, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if bad := rep.Failures(); len(bad) > 0 {
		t.Errorf("the soak failed: %q", bad)
	}
	if rep.Granted == 0 {
		t.Error("nothing granted: the soak tested nothing")
	}
}

// TestCommandLine checks the conventions every example tool keeps (see
// internal/cli): usage on -h, exit 2 with one line for bad usage, before
// any redis-server starts.
func TestCommandLine(t *testing.T) {
	cli.Check(t, command, cli.Conventions("soak", "-bucket=nonsense", "-keys=0", "-sample=0s", "-duration=x"))
}

// TestTerminate: SIGTERM stops the soak early and it still prints its
// summary; what ran is judged by the same checks. A signal that comes
// during a sample does not fail it with "context canceled".
func TestTerminate(t *testing.T) {
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "a soak that samples Redis's memory")
	cli.Terminate(t, command, []string{"-redis", srv.Addr(), "-duration", "1m", "-sample", "200ms", "-keys", "20", "-workers", "4"},
		"      2s ", "acquires:", cli.ExitOK) // after about ten samples
}
