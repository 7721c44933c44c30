package bucket

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// TestFailLocalGrantsNothingMoreFromASpentPeriod: one instance, 1,000
// concurrent callers spend a token bucket's period of 1,000 per 4 s (their
// takes coalesced, so the callers of one round trip are told different
// Remaining figures, in no particular order); Redis is then paused for the
// rest of the period. FailLocal must grant nothing more in it: the period
// is spent, whatever answer was the last to arrive (it granted 78–668 more
// when the degraded mode rested on that answer).
func TestFailLocalGrantsNothingMoreFromASpentPeriod(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time fault test")
	}
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "SIGSTOP")
	const limit, period = 1000, 4 * time.Second
	tb, err := NewTokenBucket(shortClient(t, srv.Addr()), "spent", limit, period, WithHeartbeat(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	lim := throttle.New(tb)
	defer lim.Close()
	ctx := context.Background()
	if err := lim.Acquire(ctx, time.Second); err != nil { // the period begins; scripts load
		t.Fatal(err)
	}
	begun := time.Now()
	var spent atomic.Int64
	spent.Add(1)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range limit - 1 {
		wg.Go(func() {
			<-start
			// No wait: every permit is placed now (a caller that could
			// wait would be paced, and one whose place came after its
			// wait would give it back).
			if lim.Acquire(ctx, 0) == nil {
				spent.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	// A caller whose place came after what its wait had left gave its
	// permit back (Decision.Cancel): what is left goes at once, through
	// the Limiter, so that every permit is placed and the key has nothing
	// left for an interval.
	for lim.Acquire(ctx, 0) == nil {
		spent.Add(1)
	}
	if st, err := tb.State(ctx, ""); err != nil || st.Remaining != 0 {
		t.Fatalf("%d permits handed out, State %+v, %v; the test needs the whole limit placed", spent.Load(), st, err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Resume() }()
	var more atomic.Int64
	until := begun.Add(period - 300*time.Millisecond) // still within the spent period
	for range 50 {
		wg.Go(func() {
			for time.Now().Before(until) {
				if lim.Acquire(ctx, 200*time.Millisecond) == nil {
					more.Add(1)
				} else {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	waitInflight(t, &tb.common)
	if n := more.Load(); n != 0 {
		t.Errorf("%d more permits granted in a period whose %d were spent before Redis paused", n, limit)
	}
}
