package bucket

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// unrenewedSlots builds, as newSlots does, a Concurrency of lease whose
// renewals never come: its clock is a fake one that nothing advances.
func unrenewedSlots(t *testing.T, rdb redis.UniversalClient, key string, capacity int64, lease time.Duration) *Concurrency {
	t.Helper()
	s := newSlots(t, rdb, key, capacity, WithLease(lease))
	s.clock = clockwork.NewFakeClock()
	return s
}

// TestConcurrencyGenerationFromTheFutureClosesTheCapNoLongerThanASpan: a
// generation that the server's clock puts in the future (created on a
// master whose clock was ahead, then a failover to this one; or a
// garbage value) closes the cap for at most a span
// (lease/3 + min(lease/3, 1 s)) for an instance that remembers another
// one, never until the server's clock catches up with it.
func TestConcurrencyGenerationFromTheFutureClosesTheCapNoLongerThanASpan(t *testing.T) {
	srv := redisenv.New(t)
	const lease = 300 * time.Millisecond
	rdb := srv.Client()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		gen  func(now time.Time) string
	}{
		{"an hour ahead", func(now time.Time) string {
			return strconv.FormatInt(now.Add(time.Hour).UnixMicro(), 10) + ".7"
		}},
		{"garbage", func(time.Time) string { return "99999999999999999999999999.1" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSlots(t, rdb, "future-gen-"+tc.name, 1, WithLease(lease))
			mustHold(t, s)() // s now remembers the generation
			keys := capKeys(t, s, "")
			now := serverNow(t, rdb)
			if err := rdb.HSet(ctx, keys[5], "g", tc.gen(now)).Err(); err != nil {
				t.Fatal(err)
			}
			rel, err := s.Hold(ctx, "", 3*time.Second)
			if err != nil {
				t.Fatalf("Hold(3s) after a generation %s replaced the remembered one, span %v = %v, want the slot once the span is over", tc.name, lease/3+min(lease/3, time.Second), err)
			}
			rel()
		})
	}
}

// TestConcurrencyHoldersKeyEvictedAdmitsNobodyAboveCapacity: Redis
// evicts the holders' key alone (a maxmemory policy: every key of the
// cap has a time to live, so volatile-* policies may pick it) while both
// slots are held by live callers whose renewals have not come yet. A
// process that used the key (it remembers the generation, which Redis
// kept) and a new one must not get a slot before the renewals put the
// holders back.
func TestConcurrencyHoldersKeyEvictedAdmitsNobodyAboveCapacity(t *testing.T) {
	srv := redisenv.New(t)
	const lease = 300 * time.Millisecond
	rdb := srv.Client()
	ctx := context.Background()
	a := unrenewedSlots(t, rdb, "evicted", 2, lease) // its renewals do not come
	used := newSlots(t, rdb, "evicted", 2, WithLease(lease))
	mustHold(t, used)()
	for range 2 {
		rel := mustHold(t, a)
		defer rel()
	}
	keys := capKeys(t, a, "")
	if err := rdb.Del(ctx, keys[0]).Err(); err != nil { // evicted
		t.Fatal(err)
	}
	fresh := newSlots(t, rdb, "evicted", 2, WithLease(lease))
	for name, s := range map[string]*Concurrency{"that used the key": used, "new": fresh} {
		if err := holdNowAndRelease(ctx, s); !errors.Is(err, throttle.ErrTimeout) {
			t.Errorf("Hold(0) of a process %s, the holders' key evicted, both slots held by live callers = %v, want ErrTimeout", name, err)
		}
	}
}

// TestConcurrencyHoldWithoutWaitOnAClosedCapSaysWhy: a Hold(0) refused
// because the cap is closed after a loss (no holder in it, every slot
// free) says so and what to do, instead of "no slot free".
func TestConcurrencyHoldWithoutWaitOnAClosedCapSaysWhy(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	s := newSlots(t, rdb, "closed", 2)
	keys := capKeys(t, s, "")
	now := serverNow(t, rdb)
	till := float64(now.Add(4 * time.Second).UnixMilli())
	if err := rdb.ZAdd(ctx, keys[4], redis.Z{Score: till, Member: "!frozen"}).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := s.Hold(ctx, "", 0)
	if !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("Hold(0) on a closed cap = %v, want ErrTimeout", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "closed") || !strings.Contains(msg, "maxWait") {
		t.Errorf("Hold(0) on a closed cap, every slot free, says %q; want it to say the cap is closed and that a Hold with a maxWait gets the slot", msg)
	}
}

// TestConcurrencyHoldersReleasedByAnOldVersionDoNotCloseTheCap: in a
// rolling deploy, a process of the previous version (its scripts know
// no generation) gives back the last slot; the holders' key is then gone
// while the generation's record still has a lease running. That is a
// release, not a loss: the next Hold(0) gets its slot at once.
func TestConcurrencyHoldersReleasedByAnOldVersionDoNotCloseTheCap(t *testing.T) {
	srv := redisenv.New(t)
	const lease = 300 * time.Millisecond
	rdb := srv.Client()
	ctx := context.Background()
	a := unrenewedSlots(t, rdb, "old-release", 1, lease) // its renewals and release are not this test's
	mustHold(t, a)
	keys := capKeys(t, a, "")
	holders, err := rdb.ZRange(ctx, keys[0], 0, -1).Result()
	if err != nil || len(holders) != 1 {
		t.Fatalf("holders %v, %v; want one", holders, err)
	}
	// The previous version's release: marked gone for two leases, removed.
	now := serverNow(t, rdb)
	gone := float64(now.Add(2 * lease).UnixMilli())
	if err := rdb.ZAdd(ctx, keys[4], redis.Z{Score: gone, Member: holders[0]}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZRem(ctx, keys[0], holders[0]).Err(); err != nil {
		t.Fatal(err)
	}
	s := newSlots(t, rdb, "old-release", 1, WithLease(lease))
	if err := holdNowAndRelease(ctx, s); err != nil {
		t.Fatalf("Hold(0) after the last holder was released by a previous version's script = %v, want the slot at once", err)
	}
}

// TestConcurrencyOutJustLongerThanALateHoldersLeaseClosesTheCap: a live
// holder's renewal is late (still within its round trip's allowance,
// min(lease/3, 1 s)); another script lands meanwhile, then Redis stops
// answering until just after the holder's lease ended: the silence is
// shorter than lease/3 + min(lease/3, 1 s), yet the holder was cut off
// by it. The first Hold after it must not take the holder's slot.
func TestConcurrencyOutJustLongerThanALateHoldersLeaseClosesTheCap(t *testing.T) {
	srv := redisenv.New(t)
	const lease = 300 * time.Millisecond
	rdb := srv.Client()
	ctx := context.Background()
	a := unrenewedSlots(t, rdb, "late", 1, lease) // its renewal is held back: late, then cut off
	mustHold(t, a)
	keys := capKeys(t, a, "")
	last, err := rdb.ZRangeWithScores(ctx, keys[0], 0, 0).Result()
	if err != nil || len(last) != 1 {
		t.Fatalf("holders %v, %v; want one", last, err)
	}
	end := time.UnixMilli(int64(last[0].Score))
	renewed := end.Add(-lease)
	serverAt := func(at time.Time) {
		t.Helper()
		waitSlots(t, "server time "+at.Format(time.StampMilli), func() bool {
			now, err := rdb.Time(ctx).Result()
			return err == nil && !now.Before(at)
		})
	}
	// The renewal due at lease/3 is 80 ms late; another instance's script
	// lands at lease/3 + 80 ms after the last renewal; then Redis is out.
	b := newSlots(t, rdb, "late", 1, WithLease(lease))
	serverAt(renewed.Add(lease/3 + 80*time.Millisecond))
	if _, err := b.Hold(ctx, "", 0); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("Hold(0), the only slot held = %v, want ErrTimeout", err)
	}
	// Redis answers again just after the holder's lease ended.
	c := newSlots(t, rdb, "late", 1, WithLease(lease))
	serverAt(end.Add(time.Millisecond))
	rel, err := c.Hold(ctx, "", 0)
	now, _ := rdb.Time(ctx).Result()
	t.Logf("Hold after the lease's end answered at end%+v", now.Sub(end))
	if err == nil {
		rel()
		t.Fatalf("Hold(0) right after a live holder's lease ended in a silence of Redis = a slot; want ErrTimeout (the cap closed)")
	}
}

// TestConcurrencyLongCallsWithLiveRenewalsNeverCloseTheCap: holders of
// several instances in calls of many leases, renewing on time, and a
// waiter among them, never close the cap: a freed slot goes at once.
// "On time" is the test's to show: a holder's renewals delayed for about
// two renewal periods (the process stalled, or Redis) land after its
// lease's end, and the cap then closes as its godoc says. A close is a
// failure unless, in the lease and a renewal period before it, the test's
// own round trips to Redis or one goroutine of the process (the stall
// meter) were held a renewal period (lease/3) or more: what is seen from
// outside of the renewals' own delay.
func TestConcurrencyLongCallsWithLiveRenewalsNeverCloseTheCap(t *testing.T) {
	t.Parallel()
	srv := redisenv.New(t)
	const lease = 300 * time.Millisecond
	stall := startStallMeter(t)
	rdb := srv.Client()
	ctx := context.Background()
	var inst []*Concurrency
	for range 3 {
		inst = append(inst, newSlots(t, srv.Client(), "long-calls", 2, WithLease(lease)))
	}
	keys, err := inst[0].keys("")
	if err != nil {
		t.Fatal(err)
	}
	var rels []func()
	for _, s := range inst[:2] {
		rels = append(rels, mustHold(t, s))
	}
	waited := make(chan error, 1)
	go func() {
		rel, err := inst[2].Hold(ctx, "", 20*lease)
		if err == nil {
			rel()
		}
		waited <- err
	}()
	began := time.Now()
	deadline := began.Add(6 * lease) // calls of six leases
	var gaps []span                  // between two of the test's samples
	closed := false
	for last := began; !closed && time.Now().Before(deadline); {
		f, err := rdb.ZScore(ctx, keys[4], "!frozen").Result()
		now := time.Now()
		gaps, last, closed = append(gaps, span{last, now}), now, err == nil
		if closed {
			from := now.Add(-lease - lease/3)
			stalled := stall.longestStall(from, now)
			for _, g := range gaps {
				stalled = max(stalled, earlier(g.to, now).Sub(later(g.from, from)))
			}
			if stalled < lease/3-10*time.Millisecond {
				t.Fatalf("the cap closed (until %v) with every holder renewing on time: the longest stall seen was %v, less than a renewal period (%v)", f, stalled, lease/3)
			}
			t.Logf("the cap closed (until %v) after a stall of %v, a renewal period or more (%v): renewals were not on time", f, stalled, lease/3)
		}
		time.Sleep(5 * time.Millisecond) // sampling the cap's state, not a sync
	}
	rels[0]()
	if err := <-waited; err != nil {
		t.Fatalf("the waiter, after a release = %v, want the slot", err)
	}
	if closed {
		rels[1]()
		return // it may still be closed: a free slot is not the newcomer's
	}
	rel, err := newSlots(t, srv.Client(), "long-calls", 2, WithLease(lease)).Hold(ctx, "", 0)
	if err != nil {
		t.Fatalf("Hold(0) of a new instance, a slot free = %v, want it at once", err)
	}
	rel()
	rels[1]()
}
