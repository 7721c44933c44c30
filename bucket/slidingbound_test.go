package bucket

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
)

// tbReply is one answer of tb_take.lua.
type tbReply struct {
	status, delay, remaining, reset, limit, taken, now int64
}

// runTBTake runs tb_take.lua once on keys: n tokens of limit per period
// (ms), no pace (as for periods a Limiter does not spread).
func runTBTake(t *testing.T, b *TokenBucket, keys []string, n, limit, period int64) tbReply {
	t.Helper()
	r, err := scriptTBTake.Run(context.Background(), b.rdb, keys, n, limit, period, 0, 0, 0).Int64Slice()
	if err != nil {
		t.Fatalf("take %d: %v", n, err)
	}
	if len(r) != 7 {
		t.Fatalf("take %d: reply %v, want 7 fields", n, r)
	}
	return tbReply{r[0], r[1], r[2], r[3], r[4], r[5], r[6]}
}

// TestTokenBucketHoldsNextPeriodUntilLateGrantsAreAnIntervalOld: a
// period whose grants came in its second half holds back the next
// period's grants until they are an interval old, so that no span of one
// interval holds more than the limit. A refused take is told exactly
// when they leave (before the period's end, on the server's clock), and
// then gets them. With the bound of the period alone the next period's
// whole limit went at its start: up to twice the limit in one interval.
// The script is run without a pace, as for a period a Limiter does not
// spread (a paced period would be lengthened by the late grants: the
// next test).
func TestTokenBucketHoldsNextPeriodUntilLateGrantsAreAnIntervalOld(t *testing.T) {
	srv := redisenv.New(t)
	retryWhenSlow(t, func(attempt int) (slow bool) {
		return holdsNextPeriodUntilLateGrantsLeave(t, srv, attempt)
	})
}

// holdsNextPeriodUntilLateGrantsLeave is one attempt of
// TestTokenBucketHoldsNextPeriodUntilLateGrantsAreAnIntervalOld on a fresh
// key; slow reports that the machine was too slow for its timing.
func holdsNextPeriodUntilLateGrantsLeave(t *testing.T, srv *redisenv.Server, attempt int) (slow bool) {
	const limit, period = 10, 600 // ms
	b, _, keys := caseBucket(t, srv.Client(), fmt.Sprintf("slide-late-%d", attempt), period*time.Millisecond, 0)

	// Period 1: one token at its start, the other nine past its middle.
	r := runTBTake(t, b, keys, 1, limit, period)
	if r.status != 1 {
		t.Fatalf("period 1's first take: %+v, want granted", r)
	}
	time.Sleep(time.Duration(r.reset-period/2+period/10) * time.Millisecond) // to 0.6 of the period: a boundary on the server's clock, not a sync
	r = runTBTake(t, b, keys, limit-1, limit, period)
	if r.status != 1 {
		t.Fatalf("period 1's second half: %+v, want the other %d granted", r, limit-1)
	}
	late := r.now // server ms of the nine grants
	time.Sleep(time.Duration(r.reset+1) * time.Millisecond)

	// Period 2: the refill is due; the nine are in the window until
	// late+period.
	r = runTBTake(t, b, keys, 1, limit, period)
	if r.status != 1 {
		t.Fatalf("period 2's first token: %+v, want granted (only the nine late grants are in the window)", r)
	}
	if r.now >= late+period {
		t.Logf("attempt %d: period 2 began %d ms after the late grants, past their interval: too slow to check", attempt, r.now-late)
		return true
	}
	r = runTBTake(t, b, keys, limit-1, limit, period)
	if r.status != 0 {
		t.Fatalf("period 2's start, %d more: %+v; with the nine late grants of period 1 less than an interval old that makes %d in one interval, limit %d", limit-1, r, 2*limit-1, limit)
	}
	if r.remaining != 0 {
		t.Fatalf("refused: remaining %d, want 0 (nothing can be granted now)", r.remaining)
	}
	if want := late + period - r.now; r.delay != want {
		t.Fatalf("refused take told to wait %d ms, want %d (until the nine are an interval old; the period ends in %d)", r.delay, want, r.reset)
	}
	time.Sleep(time.Duration(r.delay) * time.Millisecond) // the time the bucket named: the behaviour under test
	r = runTBTake(t, b, keys, limit-1, limit, period)
	if r.status != 1 || r.now < late+period {
		t.Fatalf("period 2, after the wait the bucket named: %+v, want %d granted at or after %d", r, limit-1, late+period)
	}
	r = runTBTake(t, b, keys, 1, limit, period)
	if r.status != 0 || r.delay != r.reset {
		t.Fatalf("period 2, all taken: %+v, want refused until the period's end", r)
	}
	return false
}

// TestTokenBucketPacedPeriodHoldsNextPeriodsStart: through Take (a paced
// period), a crowd that comes late in a period a single take started
// lengthens it so that its grants lie on the pace; the next period's
// start then finds them less than an interval old and grants only what
// the window leaves, telling the others when the crowd's grants leave it.
func TestTokenBucketPacedPeriodHoldsNextPeriodsStart(t *testing.T) {
	srv := redisenv.New(t)
	retryWhenSlow(t, func(attempt int) (slow bool) {
		return pacedPeriodHoldsNextPeriodsStart(t, srv, attempt)
	})
}

// pacedPeriodHoldsNextPeriodsStart is one attempt of
// TestTokenBucketPacedPeriodHoldsNextPeriodsStart on a fresh key; slow
// reports that the machine was too slow for its timing.
func pacedPeriodHoldsNextPeriodsStart(t *testing.T, srv *redisenv.Server, attempt int) (slow bool) {
	ctx := context.Background()
	const limit, interval = 10, 1000 * time.Millisecond
	b, err := NewTokenBucket(srv.Client(), fmt.Sprintf("slide-paced-%d", attempt), limit, interval)
	if err != nil {
		t.Fatal(err)
	}
	d, err := b.Take(ctx, "", 1, 0)
	if err != nil || !d.Granted {
		t.Fatalf("first take: %+v, %v", d, err)
	}
	time.Sleep(interval * 3 / 10) // a real-time boundary: the crowd comes late
	d, err = b.Take(ctx, "", limit-1, 0)
	if err != nil || !d.Granted {
		t.Fatalf("the crowd's take: %+v, %v", d, err)
	}
	crowd := time.Now()
	time.Sleep(d.Reset + time.Millisecond)
	d, err = b.Take(ctx, "", limit-1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if since := time.Since(crowd); since >= interval {
		t.Logf("attempt %d: the next period's take came %v after the crowd, past its interval: too slow to check", attempt, since)
		return true
	}
	if d.Granted {
		t.Fatalf("next period's start granted %d with the crowd's %d less than an interval old: %d in one interval, limit %d", limit-1, limit-1, 2*(limit-1), limit)
	}
	if d.Delay >= d.Reset {
		t.Fatalf("refused take told to wait %v, the period's end (%v): want when the crowd's grants leave the window", d.Delay, d.Reset)
	}
	time.Sleep(d.Delay) // the time the bucket named
	d, err = b.Take(ctx, "", limit-1, 0)
	if err != nil || !d.Granted {
		t.Fatalf("after the wait the bucket named: %+v, %v", d, err)
	}
	return false
}

// retryWhenSlow runs a timed scenario up to three times, each on fresh
// keys, until one ran fast enough to check what it checks: a slow machine
// repeats the scenario instead of skipping it, and fails when no attempt
// could check anything.
func retryWhenSlow(t *testing.T, attempt func(i int) (slow bool)) {
	t.Helper()
	const attempts = 3
	for i := range attempts {
		if !attempt(i) {
			return
		}
	}
	t.Fatalf("all %d attempts were too slow for the scenario's timing (see the log)", attempts)
}
