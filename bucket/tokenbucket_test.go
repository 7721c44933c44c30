package bucket

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/faultproxy"
	"github.com/headway-go/headway/internal/guarantee"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// A token bucket's guarantee is judged on the places tb_take.lua gives,
// exactly, on the Redis server's clock: the reply names the server's time
// and each permit's delay from it. The places are computed at once, so
// these tests take no time waiting for them.

// placed is the places of one take: one per permit, µs on the server's
// clock, and the take's wait.
type placed struct {
	places  []int64
	maxWait time.Duration
	asked   int64 // the server's clock when it decided
}

// takePlaces is one round trip of tb_take.lua through b (n < 0: up to -n),
// with the places it gave.
func takePlaces(t testing.TB, b *TokenBucket, key string, n int64, maxWait time.Duration) placed {
	t.Helper()
	u, err := b.run(context.Background(), key, n, maxWait, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := placed{maxWait: maxWait, asked: u.at}
	for i := range u.got {
		d := u.forCaller(i)
		reps := int64(1)
		if n > 0 {
			reps = n // one place for all n
		}
		for range reps {
			p.places = append(p.places, u.at+d.Delay.Microseconds())
		}
	}
	return p
}

// judgePlaces fails t unless places holds at most limit in any span of
// window (µs on the server's clock).
func judgePlaces(t testing.TB, places []int64, limit int64, window time.Duration) {
	t.Helper()
	times := make([]time.Time, len(places))
	for i, p := range places {
		times[i] = time.UnixMicro(p)
	}
	if r := guarantee.Sliding(times, limit, window, 0); r.Violations > 0 {
		t.Fatalf("%d places: %s", len(places), r.Detail)
	}
}

func newTB(t testing.TB, rdb redis.UniversalClient, key string, limit int64, interval time.Duration, opts ...TokenBucketOption) *TokenBucket {
	t.Helper()
	b, err := NewTokenBucket(rdb, key, limit, interval, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTokenBucketPlacesAtMostTheLimitInAnySpanOfAnIntervalAndItsMargin:
// three instances (each its own client, as processes would have) take
// from one key with mixed waits (none, short, long, Forever), one permit
// or several, all or up to k; every place given lies within its take's
// wait, and the places hold at most the limit in any span of the interval
// plus the margin, exactly.
func TestTokenBucketPlacesAtMostTheLimitInAnySpanOfAnIntervalAndItsMargin(t *testing.T) {
	srv := redisenv.New(t)
	const limit, interval, margin = 10, 200 * time.Millisecond, 5 * time.Millisecond
	var buckets []*TokenBucket
	for range 3 {
		buckets = append(buckets, newTB(t, srv.Client(), "places", limit, interval, WithArrivalMargin(margin)))
	}
	waits := []time.Duration{0, 20 * time.Millisecond, 150 * time.Millisecond, time.Second, throttle.Forever}
	var mu sync.Mutex
	var all []int64
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 40 {
				n := int64(1 + rng.IntN(3))
				if rng.IntN(3) == 0 {
					n = -n // up to
				}
				wait := waits[rng.IntN(len(waits))]
				p := takePlaces(t, buckets[g%3], "", n, wait)
				for _, at := range p.places {
					if wait != throttle.Forever && at-p.asked > wait.Microseconds() {
						t.Errorf("a place %v after the take, beyond its wait %v", time.Duration(at-p.asked)*time.Microsecond, wait)
					}
				}
				mu.Lock()
				all = append(all, p.places...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(all) < 3*limit {
		t.Fatalf("only %d permits placed", len(all))
	}
	judgePlaces(t, all, limit, interval+margin)
}

// TestTokenBucketGrantsABurstAtAnIdleKeyAtOnce: callers that cannot wait
// get the whole limit at an idle key at once, and the next is refused,
// told the earliest time one permit can have: an interval and the margin
// after the burst (and the round trips its permits counted besides).
func TestTokenBucketGrantsABurstAtAnIdleKeyAtOnce(t *testing.T) {
	srv := redisenv.New(t)
	const limit, interval, margin = 5, time.Second, 10 * time.Millisecond
	b := newTB(t, srv.Client(), "burst", limit, interval, WithArrivalMargin(margin))
	ctx := context.Background()
	var trips time.Duration // the most round trips a permit counted
	began := time.Now()
	for i := range limit {
		trips = max(trips, us(b.rtt.Load()))
		d, err := b.Take(ctx, "", 1, 0)
		if err != nil || !d.Granted || d.Delay != 0 || d.Margin <= 0 {
			t.Fatalf("take %d at an idle key: %+v, %v", i, d, err)
		}
	}
	d, err := b.Take(ctx, "", 1, 0)
	took := time.Since(began) // the burst's first permit was placed that long before the refusal, at most
	if err != nil || d.Granted {
		t.Fatalf("take beyond the limit with no wait: %+v, %v", d, err)
	}
	if d.Delay < interval+margin-took || d.Delay > interval+margin+trips {
		t.Fatalf("refused until %v, want an interval, the margin and the round trips after the burst (%v)", d.Delay, interval+margin+trips)
	}
}

// TestTokenBucketPacesCallersThatCanWait: a crowd that can wait is placed
// at the limit's even pace, interval/limit apart, not all at once.
func TestTokenBucketPacesCallersThatCanWait(t *testing.T) {
	srv := redisenv.New(t)
	const limit, interval = 10, time.Second
	b := newTB(t, srv.Client(), "paced", limit, interval)
	var places []int64
	for range limit / 2 {
		places = append(places, takePlaces(t, b, "", 1, throttle.Forever).places...)
	}
	pace := (interval / limit).Microseconds()
	for i := 1; i < len(places); i++ {
		if gap := places[i] - places[i-1]; gap < pace || gap > pace+1_000 {
			t.Fatalf("places %d and %d are %v apart, want the pace %v: %v", i-1, i, time.Duration(gap)*time.Microsecond, interval/limit, places)
		}
	}
	// A caller that cannot wait still gets what the limit leaves now,
	// the places ahead counted.
	for range limit / 2 {
		if p := takePlaces(t, b, "", 1, 0); len(p.places) != 1 || p.places[0] != p.asked {
			t.Fatalf("a caller that cannot wait, with the limit not reached: %+v", p)
		}
	}
	if p := takePlaces(t, b, "", 1, 0); len(p.places) != 0 {
		t.Fatalf("a caller that cannot wait, with the limit placed: %+v", p)
	}
}

// TestTokenBucketRefusedTakeTakesNothing: a take whose earliest place is
// beyond its wait leaves the schedule as it was.
func TestTokenBucketRefusedTakeTakesNothing(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	b := newTB(t, rdb, "refused", 3, time.Minute)
	for range 3 {
		takePlaces(t, b, "", 1, 0)
	}
	before, err := rdb.LRange(context.Background(), b.rootKeys[0], 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int64{1, 2, -3} {
		if p := takePlaces(t, b, "", n, time.Second); len(p.places) != 0 {
			t.Fatalf("take of %d placed %v with the key full for a minute", n, p.places)
		}
	}
	after, err := rdb.LRange(context.Background(), b.rootKeys[0], 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(before, after) {
		t.Fatalf("refused takes changed the schedule: %q, then %q", before, after)
	}
}

// TestTokenBucketCountsALostScheduleFull: after Redis loses a key's
// schedule (an empty restart, a failover, the key deleted), an instance
// that was given permits there counts the limit at the latest end it
// knows, so the key's next places come an interval after it: the lost
// permits and the new ones never exceed the limit in one span.
func TestTokenBucketCountsALostScheduleFull(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	const limit, interval, margin = 4, 300 * time.Millisecond, 5 * time.Millisecond
	b := newTB(t, rdb, "lost", limit, interval, WithArrivalMargin(margin))
	var all []int64
	for range limit {
		all = append(all, takePlaces(t, b, "", 1, throttle.Forever).places...)
	}
	if err := rdb.Del(context.Background(), b.rootKeys[0]).Err(); err != nil {
		t.Fatal(err)
	}
	for range 2 * limit {
		all = append(all, takePlaces(t, b, "", 1, throttle.Forever).places...)
	}
	judgePlaces(t, all, limit, interval+margin)
}

// TestTokenBucketCountsALostScheduleFullWhenAnotherInstanceStartedItAgain:
// after Redis loses a key's schedule, an instance that knew nothing of it
// (just started) may take first and start a schedule anew, with permits
// that end after the latest end an instance that knew was given. That
// instance's lost permits still count at its next take: the schedule it
// finds is not the one that held them.
func TestTokenBucketCountsALostScheduleFullWhenAnotherInstanceStartedItAgain(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	const limit, interval, margin = 10, time.Minute, 5 * time.Millisecond
	knew := newTB(t, rdb, "lost-restarted", limit, interval, WithArrivalMargin(margin))
	if p := takePlaces(t, knew, "", -limit, 0); len(p.places) != limit {
		t.Fatalf("%d of the limit at an idle key", len(p.places))
	}
	if err := rdb.Del(context.Background(), knew.rootKeys[0]).Err(); err != nil {
		t.Fatal(err)
	}
	fresh := newTB(t, srv.Client(), "lost-restarted", limit, interval, WithArrivalMargin(margin))
	if p := takePlaces(t, fresh, "", 1, 0); len(p.places) != 1 {
		t.Fatal("an instance that knew nothing of the key cannot tell it was lost: granted")
	}
	if p := takePlaces(t, knew, "", -limit, 0); len(p.places) != 0 {
		t.Fatalf("%d more at once by the instance given the whole limit a moment before the loss", len(p.places))
	}
}

// TestTokenBucketCountsAKeyOfThePreviousVersionFull: the token bucket
// before issue 41 kept a period's tokens under the same key, a string.
// Met during an upgrade, that key is neither an error at every take (the
// failure policy deciding for the fleet until the old instances stop) nor
// forgotten (the whole limit again on top of the old period's grants):
// its grants are counted full, ending with its period (the previous
// version's Limiter spread them over it), and the key becomes the
// schedule.
func TestTokenBucketCountsAKeyOfThePreviousVersionFull(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	const limit, interval, margin = 5, 200 * time.Millisecond, 5 * time.Millisecond
	b := newTB(t, rdb, "upgraded", limit, interval, WithArrivalMargin(margin))
	ctx := context.Background()
	if err := rdb.Set(ctx, b.rootKeys[0], "2", interval/2).Err(); err != nil { // 3 of 5 taken, half the period left
		t.Fatal(err)
	}
	d, err := b.Take(ctx, "", 1, 0)
	if err != nil || d.Granted {
		t.Fatalf("a take meeting the previous version's key: %+v, %v; want refused, the old period's grants counting", d, err)
	}
	if want := interval/2 + interval; d.Delay < interval || d.Delay > want+margin+10*time.Millisecond {
		t.Fatalf("refused for %v, want about an interval after the old period's end (%v)", d.Delay, want)
	}
	time.Sleep(d.Delay)
	if d, err := b.Take(ctx, "", limit, 10*time.Millisecond); err != nil || !d.Granted {
		t.Fatalf("the limit once the old grants stopped counting: %+v, %v", d, err)
	}
}

// TestTokenBucketCountsALostScheduleOncePerInstance: an instance counts
// its lost permits in the schedule begun again once, not at each of its
// takes: refused (its callers cannot wait), it is given no permit whose
// schedule it would remember, and counting the limit again at every take,
// at the schedule's tail, pushed the other instances' places an interval
// further each time.
func TestTokenBucketCountsALostScheduleOncePerInstance(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	const limit, interval = 5, 200 * time.Millisecond
	knew := newTB(t, rdb, "lost-once", limit, interval)
	if p := takePlaces(t, knew, "", -limit, 0); len(p.places) != limit {
		t.Fatalf("%d of the limit at an idle key", len(p.places))
	}
	if err := rdb.Del(context.Background(), knew.rootKeys[0]).Err(); err != nil {
		t.Fatal(err)
	}
	fresh := newTB(t, srv.Client(), "lost-once", limit, interval)
	start := takePlaces(t, fresh, "", 1, 0).asked
	var last int64
	for range 2 * limit {
		if p := takePlaces(t, knew, "", 1, 0); len(p.places) != 0 {
			t.Fatalf("the instance whose permits were lost, at once: %v", p.places)
		}
		p := takePlaces(t, fresh, "", 1, throttle.Forever)
		last = p.places[0]
	}
	// The lost permits hold the key an interval (and a margin) after the
	// loss; then 2·limit permits at the pace: two intervals more.
	if most := (4*interval + 50*time.Millisecond).Microseconds(); last-start > most {
		t.Fatalf("the last of %d permits placed %v after the first, want at most %v", 2*limit, time.Duration(last-start)*time.Microsecond, time.Duration(most)*time.Microsecond)
	}
}

// TestTokenBucketRemembersTheLatestEndOfAnUpToTake: the permits of an
// up-to take need not come in order of place (the last one at once after
// a paced one), and a lost schedule must be counted full at the latest
// end the instance was given, not at the end of the take's last permit.
func TestTokenBucketRemembersTheLatestEndOfAnUpToTake(t *testing.T) {
	t.Parallel()
	srv := redisenv.New(t)
	rdb := srv.Client()
	const limit, interval, margin = 10, 500 * time.Millisecond, 5 * time.Millisecond
	b := newTB(t, rdb, "latest-end", limit, interval, WithArrivalMargin(margin))
	// An idle key: the first at once, the second paced (interval/limit =
	// 50 ms on), the third beyond the wait's pace, at once.
	p := takePlaces(t, b, "", -3, 75*time.Millisecond)
	if len(p.places) != 3 || p.places[1] <= p.places[2] {
		t.Fatalf("places %v, want the second after the third", p.places)
	}
	all := p.places
	if err := rdb.Del(context.Background(), b.rootKeys[0]).Err(); err != nil {
		t.Fatal(err)
	}
	// Once the instance's last permit stops counting, the whole limit at
	// once: still counting, the paced permit must hold one of them back.
	ctx := context.Background()
	for {
		u, err := b.run(ctx, "", -limit, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		if u.got == 0 {
			time.Sleep(time.Duration(max(u.rest.Delay, time.Millisecond)))
			continue
		}
		for i := range u.got {
			all = append(all, u.at+u.forCaller(i).Delay.Microseconds())
		}
		break
	}
	judgePlaces(t, all, limit, interval+margin)
}

// TestTokenBucketKeepsTheBoundWhenRedeployedWithAnotherLimitOrInterval:
// a fleet redeployed on a used key with a shorter interval or a lower
// limit keeps the new bound from its first take, counting the permits the
// old fleet placed.
func TestTokenBucketKeepsTheBoundWhenRedeployedWithAnotherLimitOrInterval(t *testing.T) {
	srv := redisenv.New(t)
	margin := 5 * time.Millisecond
	for _, c := range []struct {
		name                 string
		oldLimit, newLimit   int64
		oldPeriod, newPeriod time.Duration
	}{
		{"shorter interval", 10, 10, 2 * time.Second, time.Second},
		{"lower limit", 10, 4, time.Second, time.Second},
		{"both", 20, 5, 2 * time.Second, 500 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			old := newTB(t, srv.Client(), "redeploy-"+c.name, c.oldLimit, c.oldPeriod, WithArrivalMargin(margin))
			var all []int64
			for range 2 * c.oldLimit {
				all = append(all, takePlaces(t, old, "", 1, throttle.Forever).places...)
			}
			next := newTB(t, srv.Client(), "redeploy-"+c.name, c.newLimit, c.newPeriod, WithArrivalMargin(margin))
			var fresh []int64
			for range 3 * c.newLimit {
				fresh = append(fresh, takePlaces(t, next, "", 1, throttle.Forever).places...)
			}
			// The new bound holds for the new places with every old place
			// still counting when they come.
			from := slices.Min(fresh) - (c.newPeriod + margin).Microseconds()
			for _, p := range all {
				if p > from {
					fresh = append(fresh, p)
				}
			}
			judgePlaces(t, fresh, c.newLimit, c.newPeriod+margin)
		})
	}
}

// TestTokenBucketLiveLimitAppliesToTheNextTake: a limit lowered live holds
// from the next take on, the permits placed before it counting.
func TestTokenBucketLiveLimitAppliesToTheNextTake(t *testing.T) {
	srv := redisenv.New(t)
	const interval, margin = time.Second, 5 * time.Millisecond
	b := newTB(t, srv.Client(), "live", 10, interval, WithArrivalMargin(margin))
	var all []int64
	for range 6 {
		all = append(all, takePlaces(t, b, "", 1, throttle.Forever).places...)
	}
	if err := b.SetLimit(context.Background(), "", 3); err != nil {
		t.Fatal(err)
	}
	var after []int64
	for range 6 {
		after = append(after, takePlaces(t, b, "", 1, throttle.Forever).places...)
	}
	first := slices.Min(after)
	for _, p := range all {
		if p > first-(interval+margin).Microseconds() {
			after = append(after, p)
		}
	}
	judgePlaces(t, after, 3, interval+margin)
	if _, err := b.Take(context.Background(), "", 4, throttle.Forever); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Fatalf("4 permits at once under a live limit of 3: %v, want ErrExceedsLimit", err)
	}
}

// TestTokenBucketHugeLimitAndIntervalKeepExactArithmetic: the largest
// limit and interval a constructor accepts place permits exactly.
func TestTokenBucketHugeLimitAndIntervalKeepExactArithmetic(t *testing.T) {
	srv := redisenv.New(t)
	b := newTB(t, srv.Client(), "huge", maxRateLimit, MaxInterval)
	ctx := context.Background()
	half := int64(maxRateLimit / 2)
	if d, err := b.Take(ctx, "", half, 0); err != nil || !d.Granted || d.Delay != 0 {
		t.Fatalf("half of a 2^50 limit at once: %+v, %v", d, err)
	}
	if d, err := b.Take(ctx, "", half+1, 0); err != nil || d.Granted {
		t.Fatalf("one permit more than the limit at once: %+v, %v", d, err)
	}
	if d, err := b.Take(ctx, "", half, 0); err != nil || !d.Granted {
		t.Fatalf("the other half of the limit: %+v, %v", d, err)
	}
}

// TestTokenBucketScheduleCountsEveryPermitPlaced: whatever mix of takes
// (one permit, several at one place, up to k with one wait or each
// caller's own, waits short and long; a third of the grants given back),
// after each the schedule's entries hold every permit placed and not given
// back, and its header says as much, its entries in order of end, one a
// slot. With a short interval, entries stop counting during the run (and
// the test then checks the header against the entries alone), paced and
// unpaced.
func TestTokenBucketScheduleCountsEveryPermitPlaced(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	for _, c := range []struct {
		limit    int64
		interval time.Duration
		prefill  int64 // permits taken first, so that batches find part of the room they ask
	}{
		{500, time.Minute, 0},                // paced; nothing stops counting during the test
		{100_000, time.Minute, 100_000 - 12}, // unpaced, at the edge of its room
		{8, 20 * time.Millisecond, 0},
		{500, 20 * time.Millisecond, 0},
	} {
		t.Run(fmt.Sprintf("%d per %v", c.limit, c.interval), func(t *testing.T) {
			b := newTB(t, rdb, fmt.Sprintf("counted-%d-%v", c.limit, c.interval), c.limit, c.interval)
			exact := c.interval == time.Minute
			rng := rand.New(rand.NewPCG(3, 4))
			waits := []time.Duration{0, time.Millisecond, 100 * time.Millisecond, 10 * time.Second, throttle.Forever}
			placedN := int64(0)
			if c.prefill > 0 {
				if d, err := b.Take(context.Background(), "", c.prefill, 0); err != nil || !d.Granted {
					t.Fatalf("prefill: %+v, %v", d, err)
				}
				placedN = c.prefill
			}
			for range 300 {
				n := int64(1 + rng.IntN(4))
				wait := waits[rng.IntN(len(waits))]
				var each []time.Duration
				if rng.IntN(2) == 0 {
					n = -(1 + rng.Int64N(8))
					if rng.IntN(2) == 0 {
						for range -n {
							each = append(each, waits[rng.IntN(len(waits))])
						}
						slices.Sort(each)
						wait = each[0]
					}
				}
				u, err := b.run(context.Background(), "", n, wait, each)
				if err != nil {
					t.Fatal(err)
				}
				for i := range max(-n, 1) {
					if d := u.forCaller(i); d.Granted {
						placedN += max(n, 1)
						if rng.IntN(3) == 0 { // a caller gone: its room is free again
							if err := d.Cancel(context.Background()); err != nil {
								t.Fatal(err)
							}
							placedN -= max(n, 1)
						}
					}
				}
				if count := scheduleConsistent(t, rdb, b.rootKeys[0], c.interval); exact && count != placedN {
					t.Fatalf("%d permits placed; the schedule holds %d", placedN, count)
				}
			}
		})
	}
}

// scheduleConsistent reads the schedule under key (schedule.lua) and
// fails t unless its entries are in order of end, one a slot of
// interval/256, and its header's count and cursor agree with them: count
// is their sum, before the sum of those ahead of cur. It returns count (0
// when no schedule is left: every entry stopped counting).
func scheduleConsistent(t *testing.T, rdb redis.UniversalClient, key string, interval time.Duration) int64 {
	t.Helper()
	list, err := rdb.LRange(context.Background(), key, 0, -1).Result()
	if err != nil || len(list) == 1 {
		t.Fatalf("schedule %q, %v", list, err)
	}
	if len(list) == 0 {
		return 0
	}
	var count, tat, cur, before int64
	if _, err := fmt.Sscanf(list[0], "%d %d %d %d", &count, &tat, &cur, &before); err != nil {
		t.Fatalf("header %q: %v", list[0], err)
	}
	var sum, ahead, last int64
	grid := interval.Microseconds() / 256
	for i, e := range list[1:] {
		var end, n int64
		if _, err := fmt.Sscanf(e, "%d %d", &end, &n); err != nil {
			t.Fatalf("entry %q: %v", e, err)
		}
		if end < last || last != 0 && end/grid == last/grid {
			t.Fatalf("entry %q after one ending at %d: entries must be in order of end, one a slot: %q", e, last, list)
		}
		if int64(i+1) < cur {
			ahead += n
		}
		sum, last = sum+n, end
	}
	if sum != count {
		t.Fatalf("the entries hold %d permits, the header says %d: %q", sum, count, list)
	}
	if cur <= int64(len(list)) && ahead != before {
		t.Fatalf("the entries before the cursor (%d) hold %d permits, the header says %d: %q", cur, ahead, before, list)
	}
	return count
}

// TestTokenBucketBatchKeepsAChangedEntryItReadsAgain: a batch that
// counts a permit in the schedule's last entry and then, searching for
// later callers' places, reads the entries around it again from Redis
// writes back the entry with that permit: the schedule holds every permit
// its header counts. (Seven entries: the search reads 1–4 and 5–8, the
// first read of the last entry, 7, at the call's start.)
func TestTokenBucketBatchKeepsAChangedEntryItReadsAgain(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	const limit, interval = 8, time.Second // paced 125 ms apart: an entry each
	b := newTB(t, rdb, "read-again", limit, interval)
	for range limit - 1 {
		if p := takePlaces(t, b, "", 1, throttle.Forever); len(p.places) != 1 {
			t.Fatalf("take: %+v, want a place", p)
		}
	}
	// The first caller cannot wait: the last room at once, counted in the
	// last entry. The others can: each place is found past one more
	// entry, the fifth read with the two after it.
	waits := []time.Duration{0, 10 * time.Second, 10 * time.Second, 10 * time.Second, 10 * time.Second, 10 * time.Second}
	u, err := b.run(context.Background(), "", -int64(len(waits)), waits[0], waits)
	if err != nil || u.got != int64(len(waits)) {
		t.Fatalf("batch: %+v, %v; want all %d placed", u, err, len(waits))
	}
	if count := scheduleConsistent(t, rdb, b.rootKeys[0], interval); count != limit-1+int64(len(waits)) {
		t.Fatalf("the schedule counts %d permits, want %d", count, limit-1+len(waits))
	}
}

// An up-to take with each caller's wait, at the limit: the callers that
// cannot wait are refused with the earliest place left after the places
// given to the others (not one of those places), and Remaining counts
// what is free at once after each caller's place.
func TestTokenBucketCallersRefusedInABatchAreToldThePlaceLeft(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	const limit, interval = 10, time.Second // paced 100 ms apart
	b := newTB(t, srv.Client(), "place-left", limit, interval)
	for range limit { // places 0, 100, ..., 900 ms ahead
		if p := takePlaces(t, b, "", 1, throttle.Forever); len(p.places) != 1 {
			t.Fatalf("placed %v, want one place", p.places)
		}
	}
	waits := []time.Duration{0, 5 * time.Second, 5 * time.Second}
	u, err := b.run(ctx, "", -3, waits[0], waits)
	if err != nil {
		t.Fatal(err)
	}
	refused, first, second := u.forCaller(0), u.forCaller(1), u.forCaller(2)
	if refused.Granted || !first.Granted || !second.Granted {
		t.Fatalf("decisions %+v, %+v, %+v; want the caller without a wait refused, the others placed", refused, first, second)
	}
	if refused.Delay <= second.Delay {
		t.Fatalf("refused with %v, a place given to another (%v, %v); want the earliest left after them", refused.Delay, first.Delay, second.Delay)
	}
	// None free at once after either place (the limit counts now), as a
	// take of their own would be told.
	if first.Remaining != 0 || second.Remaining != 0 {
		t.Fatalf("Remaining %d then %d, want 0 then 0", first.Remaining, second.Remaining)
	}
}

// TestTokenBucketGrantNamesTheNextPlace: a grant at a key at its limit
// names the earliest place one more permit could have (Decision.Next),
// exactly on the server's clock: a take whose wait ends before it is
// refused with that place, and one whose wait reaches it gets it.
func TestTokenBucketGrantNamesTheNextPlace(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	// Paced 2 s apart: however slowly the takes below go, the pace after
	// the last place stays beyond the waits that reach the next place.
	// (The schedule's slots are 15.6 ms: the first two permits, 20 ms or
	// more apart, are in two.)
	const limit, interval = 2, 4 * time.Second
	b := newTB(t, srv.Client(), "next-place", limit, interval)
	// The limit at once, its two permits 20 ms or more apart: the key is
	// full, the first stops counting first.
	first := takePlaces(t, b, "", 1, 0)
	time.Sleep(20 * time.Millisecond) // the server's clock moving is what is tested
	second := takePlaces(t, b, "", 1, 0)
	if len(first.places) != 1 || len(second.places) != 1 {
		t.Fatalf("placed %v and %v, want one place at once each", first.places, second.places)
	}
	u, err := b.run(ctx, "", 1, throttle.Forever, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := u.forCaller(0)
	// Its place is where the first permit stops counting; the next is
	// where the second does, as far after it as the second came after
	// the first.
	if !g.Granted || g.Delay <= 0 || g.Next < g.Delay+15*time.Millisecond {
		t.Fatalf("a take at the full key: %+v; want a place ahead that names the next one, 20 ms or so after it", g)
	}
	next := u.at + g.Next.Microseconds() // on the server's clock
	u, err = b.run(ctx, "", 1, g.Next/2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := u.forCaller(0); r.Granted || u.at+r.Delay.Microseconds() != next {
		t.Fatalf("a wait ending before the next place named: %+v at %d; want refused with the place %d", r, u.at, next)
	}
	// A wait that reaches it (and not the pace after the last place, 2 s
	// after it).
	u, err = b.run(ctx, "", 1, g.Next+200*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := u.forCaller(0); !d.Granted || u.at+d.Delay.Microseconds() != next {
		t.Fatalf("a wait that reaches the next place named: %+v at %d; want placed at %d", d, u.at, next)
	}
}

// The schedule lives until its last permit stops counting, also when a
// fleet redeployed with a longer interval merges a permit into its last
// entry.
func TestTokenBucketScheduleOutlivesItsLastPermit(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	const limit, interval = 50, 2560 * time.Millisecond // paced 51.2 ms apart, slots of 10 ms
	b := newTB(t, rdb, "outlives", limit, interval)
	key := b.rootKeys[0]
	check := func(when string, interval time.Duration) {
		t.Helper()
		list, err := rdb.LRange(ctx, key, 0, -1).Result()
		if err != nil || len(list) < 2 {
			t.Fatalf("%s: schedule %q, %v", when, list, err)
		}
		var end, n int64
		if _, err := fmt.Sscanf(list[len(list)-1], "%d %d", &end, &n); err != nil {
			t.Fatal(err)
		}
		expires, err := rdb.PExpireTime(ctx, key).Result() // since the epoch, on the server's clock
		if err != nil {
			t.Fatal(err)
		}
		if counts := time.Duration(end)*time.Microsecond + interval; expires <= counts {
			t.Fatalf("%s: the schedule expires at %v, before its last permit stops counting (%v), since the epoch", when, expires, counts)
		}
	}
	for range 8 {
		if p := takePlaces(t, b, "", -1, throttle.Forever); len(p.places) != 1 {
			t.Fatalf("placed %v, want one place", p.places)
		}
	}
	check("8 paced takes", interval)
	longer := newTB(t, rdb, "outlives", limit, 10*interval)
	if p := takePlaces(t, longer, "", 1, 0); len(p.places) != 1 {
		t.Fatalf("placed %v, want one place now", p.places)
	}
	check("a take with a longer interval", 10*interval)
}

// TestTokenBucketGivesBackAPermitThatWillNotBeSent: a permit given back
// (its Decision.Cancel) is taken off the schedule, once, and the next take
// can have its room; giving back twice takes nothing more.
func TestTokenBucketGivesBackAPermitThatWillNotBeSent(t *testing.T) {
	srv := redisenv.New(t)
	b := newTB(t, srv.Client(), "giveback", 3, time.Minute)
	ctx := context.Background()
	var last throttle.Decision
	for range 3 {
		d, err := b.Take(ctx, "", 1, 0)
		if err != nil || !d.Granted || d.Cancel == nil {
			t.Fatalf("%+v, %v", d, err)
		}
		last = d
	}
	if d, err := b.Take(ctx, "", 1, 0); err != nil || d.Granted {
		t.Fatalf("a fourth permit of 3 a minute: %+v, %v", d, err)
	}
	for range 2 {
		if err := last.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if d, err := b.Take(ctx, "", 1, 0); err != nil || !d.Granted {
		t.Fatalf("after one permit given back: %+v, %v", d, err)
	}
	if d, err := b.Take(ctx, "", 1, 0); err != nil || d.Granted {
		t.Fatalf("after one permit given back, twice: %+v, %v; want only one more", d, err)
	}
	st, err := b.State(ctx, "")
	if err != nil || st.Used != 3 {
		t.Fatalf("State %+v, %v; want 3 counting", st, err)
	}
}

// TestTokenBucketGiveBackAfterALostScheduleTakesNothingOfTheNewOne: a
// permit given back after Redis lost the schedule it was placed in (an
// empty restart, a failover) is not in the schedule begun since; taking it
// off an entry there, of the same slot, would uncount another instance's
// permit, and the key would place one more than the limit.
func TestTokenBucketGiveBackAfterALostScheduleTakesNothingOfTheNewOne(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	const limit, interval = 2, time.Minute // a slot of 234 ms: the two instances' ends share one
	ctx := context.Background()
	a := newTB(t, rdb, "giveback-lost", limit, interval)
	d, err := a.Take(ctx, "", 1, 0)
	if err != nil || !d.Granted || d.Cancel == nil {
		t.Fatalf("%+v, %v", d, err)
	}
	if err := rdb.Del(ctx, a.rootKeys[0]).Err(); err != nil {
		t.Fatal(err)
	}
	b := newTB(t, srv.Client(), "giveback-lost", limit, interval)
	if d, err := b.Take(ctx, "", limit, 0); err != nil || !d.Granted {
		t.Fatalf("the whole limit at the schedule begun again: %+v, %v", d, err)
	}
	if err := d.Cancel(ctx); err != nil { // a's caller leaves before its time
		t.Fatal(err)
	}
	if d, err := b.Take(ctx, "", 1, 0); err != nil || d.Granted {
		t.Fatalf("a third permit within the minute, limit %d: %+v, %v", limit, d, err)
	}
}

// TestTokenBucketMarginLosesTheRoundTripAndCoversTheNextOnes: a permit's
// margin counts from when Take returns, less what the answer took beyond
// the round trips counted in its place: a store that answers later than
// the margin gives a permit with next to no margin (its time may have
// passed by a round trip), and the following takes, counting that round
// trip in their places, get their margin back. Judged with the round trips
// the bucket counted and those the test measured around each Take, not
// with how steady the machine keeps them.
func TestTokenBucketMarginLosesTheRoundTripAndCoversTheNextOnes(t *testing.T) {
	srv := redisenv.New(t)
	p, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr()})
	defer rdb.Close()
	const margin, latency = 10 * time.Millisecond, 15 * time.Millisecond
	b := newTB(t, rdb, "slow", 1000, time.Second, WithArrivalMargin(margin))
	ctx := context.Background()
	if d, err := b.Take(ctx, "", 1, 0); err != nil || !d.Granted { // the connection and the script, at loopback speed
		t.Fatalf("%+v, %v", d, err)
	}
	p.SetLatency(latency) // each way: a round trip of 30 ms or more
	counted := time.Duration(b.rtt.Load()) * time.Microsecond
	began := time.Now()
	d, err := b.Take(ctx, "", 1, 0)
	took := time.Since(began)
	// Its place counted the loopback round trips; the answer took at
	// least 2×latency, and what it took beyond them came off the margin.
	if most := max(margin+counted-2*latency, 1); err != nil || !d.Granted || d.Margin > most {
		t.Fatalf("answered %v or more after it was sent, with a %v margin and %v of round trip counted: %+v, %v; want a margin of at most %v", 2*latency, margin, counted, d, err, most)
	}
	// A round trip longer than the interval is not counted (noteRTT).
	counted = time.Duration(b.rtt.Load()) * time.Microsecond
	if counted < 2*latency && took < time.Second {
		t.Fatalf("after a round trip of %v, the round trip counted is %v", took, counted)
	}
	// The next take's margin loses only what its answer took beyond the
	// round trip counted. Judged on a take whose answer came within half
	// the margin of that (up to 5 tries: on a busy machine one can take
	// longer, which leaves nothing to judge).
	for try := 1; ; try++ {
		counted = time.Duration(b.rtt.Load()) * time.Microsecond
		began = time.Now()
		d, err = b.Take(ctx, "", 1, 0)
		took = time.Since(began) // at least what the bucket measured
		if err != nil || !d.Granted {
			t.Fatalf("take %d: %+v, %v", try, d, err)
		}
		if took-counted >= margin/2 && try < 5 {
			continue
		}
		if least := margin + counted - took; d.Margin < least {
			t.Fatalf("the next take, its place counting the %v round trip, answered in %v: %+v; want a margin of at least %v", counted, took, d, least)
		}
		return
	}
}

// TestTokenBucketNoteRTT: the recent round trips follow a longer one at
// once and a shorter one by a sixteenth of the difference; a round trip
// longer than the interval (a stalled store) is not kept, as noteRTT's
// doc says: its permits come late whatever they count, and kept, it would
// make every following permit count an interval more.
func TestTokenBucketNoteRTT(t *testing.T) {
	b := &TokenBucket{intervalUs: time.Second.Microseconds()}
	b.noteRTT(2 * time.Millisecond)
	if got := b.rtt.Load(); got != 2000 {
		t.Fatalf("after 2 ms: %d µs", got)
	}
	b.noteRTT(400 * time.Microsecond)
	if got := b.rtt.Load(); got != 2000-1600/16 {
		t.Fatalf("after 0.4 ms: %d µs, want a sixteenth of the way down", got)
	}
	b.noteRTT(3 * time.Second)
	if got := b.rtt.Load(); got != 1900 {
		t.Fatalf("after a round trip of 3 s on a 1 s interval: %d µs, want it not kept (1900)", got)
	}
}

// TestTokenBucketKeepsTheBoundThroughGiveBacksAndPruning: several
// instances on one key, mixed takes (one permit, several at one place, up
// to k) and waits, a third of the permits given back at once (not sent:
// their places are not judged), on short intervals and margins up to
// nearly the interval, so that entries are pruned, merged and given back
// while the searches' cursors point past them: the places kept hold at
// most the limit in any span of the interval and the margin.
func TestTokenBucketKeepsTheBoundThroughGiveBacksAndPruning(t *testing.T) {
	srv := redisenv.New(t)
	for _, c := range []struct {
		limit    int64
		interval time.Duration
		margin   time.Duration
	}{
		{5, 50 * time.Millisecond, 2 * time.Millisecond},
		{20, 100 * time.Millisecond, 5 * time.Millisecond},
		{3, 20 * time.Millisecond, 19 * time.Millisecond},
		{1, 10 * time.Millisecond, time.Millisecond},
		{3, time.Millisecond, 500 * time.Microsecond},
	} {
		key := "givebacks-" + c.interval.String()
		var buckets []*TokenBucket
		for range 3 {
			buckets = append(buckets, newTB(t, srv.Client(), key, c.limit, c.interval, WithArrivalMargin(c.margin)))
		}
		waits := []time.Duration{0, time.Millisecond, c.interval / 3, c.interval, 3 * c.interval, throttle.Forever}
		var mu sync.Mutex
		var all []int64
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(g), 41))
				b := buckets[g%3]
				for range 200 {
					n := int64(1 + rng.IntN(int(min(c.limit, 3))))
					if rng.IntN(2) == 0 {
						n = -(1 + rng.Int64N(5))
					}
					wait := waits[rng.IntN(len(waits))]
					var each []time.Duration // an up-to take's callers' own waits, half the time
					if n < -1 && rng.IntN(2) == 0 {
						for range -n {
							each = append(each, waits[rng.IntN(len(waits))])
						}
						slices.Sort(each)
						wait = each[0]
					}
					u, err := b.run(context.Background(), "", n, wait, each)
					if err != nil {
						t.Error(err)
						return
					}
					var kept []int64
					for i := range max(-n, 1) {
						d := u.forCaller(i)
						if !d.Granted {
							continue
						}
						if each != nil && d.Delay > each[i] {
							t.Errorf("caller %d placed in %v, beyond its wait %v", i, d.Delay, each[i])
						}
						reps := int64(1)
						if n > 0 {
							reps = n
						}
						if rng.IntN(3) == 0 && d.Cancel != nil {
							if err := d.Cancel(context.Background()); err != nil {
								t.Error(err)
							}
							continue
						}
						for range reps {
							kept = append(kept, u.at+d.Delay.Microseconds())
						}
					}
					mu.Lock()
					all = append(all, kept...)
					mu.Unlock()
					if rng.IntN(4) == 0 {
						time.Sleep(time.Duration(rng.IntN(int(c.interval / 2))))
					}
				}
			}()
		}
		wg.Wait()
		t.Logf("%d/%v: %d places", c.limit, c.interval, len(all))
		judgePlaces(t, all, c.limit, c.interval+c.margin)
	}
}
