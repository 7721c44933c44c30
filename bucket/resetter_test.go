package bucket

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// TestResetterFailover: two Resetters, one leads. When the leader dies
// without releasing its mutex, the other takes over within about one
// lease; when a leader's Run ends, it releases the mutex and the other
// takes over at once. The counter keeps being reset throughout.
func TestResetterFailover(t *testing.T) {
	t.Parallel()
	srv := redisenv.New(t)
	const lease = 150 * time.Millisecond
	for _, tc := range []struct {
		name   string
		crash  bool
		within time.Duration
	}{
		{"leader dies", true, lease + lease/4 + 50*time.Millisecond},
		{"leader stops", false, lease/4 + 50*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs cli.SyncBuffer // the Resetters' log, for the lease they lost
			c, err := NewCounter(srv.Client(), "failover-"+tc.name, 5, 50*time.Millisecond, WithLeaderLease(lease),
				WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			if err != nil {
				t.Fatal(err)
			}
			r1, _ := c.NewResetter("")
			r2, _ := c.NewResetter("")
			r1.keepLockOnExit = tc.crash
			ctx1, stop1 := context.WithCancel(context.Background())
			ctx2, stop2 := context.WithCancel(context.Background())
			done1, done2 := make(chan error, 1), make(chan error, 1)
			go func() { done1 <- r1.Run(ctx1) }()
			waitFor(t, time.Second, r1.leader)
			go func() { done2 <- r2.Run(ctx2) }()
			defer func() {
				stop1()
				stop2()
				<-done1
				<-done2
			}()

			lim := throttle.New(c)
			acquire := func(n int) {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				for range n {
					if err := lim.Acquire(ctx, throttle.Forever); err != nil {
						t.Fatalf("acquire: %v", err)
					}
				}
			}
			acquire(12) // spans three periods: r1 resets
			// r2 leads only once r1 lost its lease: an extension that
			// failed (Redis slower than a quarter of the lease, beside
			// other tests) hands the lease on, as it must.
			if r2.leader() && !strings.Contains(logs.String(), "resetter lost its lease") {
				t.Fatal("two leaders: r2 leads while r1 never lost its lease")
			}

			stop1()
			if err := <-done1; err != nil {
				t.Fatal(err)
			}
			done1 <- nil
			start := time.Now()
			waitFor(t, 2*lease, r2.leader)
			took := time.Since(start)
			t.Logf("took over in %v", took)
			if took > tc.within {
				t.Errorf("took over in %v, want within %v", took, tc.within)
			}
			acquire(12) // r2 resets now
		})
	}
}

func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", d)
		}
		time.Sleep(time.Millisecond) // test-side polling of a local flag
	}
}

// TestResetterRunTwice: a second concurrent Run is refused.
func TestResetterRunTwice(t *testing.T) {
	srv := redisenv.New(t)
	c, _ := NewCounter(srv.Client(), "twice", 5, 50*time.Millisecond)
	r, _ := c.NewResetter("")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitFor(t, time.Second, r.leader)
	if err := r.Run(ctx); err == nil {
		t.Error("second Run: nil error")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
