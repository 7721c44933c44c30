package bucket

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/faultproxy"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
)

// coalescing gives a test control of one bucket's coalescer: it holds a
// key's line as if a call were in flight, queues callers behind it in a
// known order, and releases the line so that one coalesced call serves
// them.
type coalescing struct {
	t    *testing.T
	c    *common
	many roundTrip
	key  string
}

// coalescingOf returns the coalescer controls of b (one of package
// bucket's buckets) for key.
func coalescingOf(t *testing.T, b throttle.Bucket, key string) *coalescing {
	t.Helper()
	switch x := b.(type) {
	case *TokenBucket:
		return &coalescing{t, &x.common, x.run, key}
	case *GCRA:
		return &coalescing{t, &x.common, x.run, key}
	case *SlidingLog:
		return &coalescing{t, &x.common, x.run, key}
	case *FixedWindow:
		return &coalescing{t, &x.windows.common, x.windows.run, key}
	case *Tiers:
		return &coalescing{t, &x.windows.common, x.windows.run, key}
	case *Counter:
		return &coalescing{t, &x.common, x.run, key}
	}
	t.Fatalf("no coalescer in %T", b)
	return nil
}

// hold marks a call for the key as in flight: later takes queue.
func (h *coalescing) hold() {
	s := h.c.co.shard(h.key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lines == nil {
		s.lines = make(map[string]*line)
	}
	if s.lines[h.key] != nil {
		h.t.Fatal("line already held")
	}
	h.c.co.stallAfter = time.Hour // the test decides when the line moves
	s.lines[h.key] = &line{since: time.Now()}
}

// queued is how many callers wait in the key's line.
func (h *coalescing) queued() int {
	s := h.c.co.shard(h.key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if ln := s.lines[h.key]; ln != nil {
		return len(ln.q)
	}
	return 0
}

// waiting is how many queued callers still wait for an answer.
func (h *coalescing) waiting() int {
	s := h.c.co.shard(h.key)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	if ln := s.lines[h.key]; ln != nil {
		for _, w := range ln.q {
			if w.state.Load() == waiting {
				n++
			}
		}
	}
	return n
}

// watching reports whether the key's line has its stall watch set.
func (h *coalescing) watching() bool {
	s := h.c.co.shard(h.key)
	s.mu.Lock()
	defer s.mu.Unlock()
	ln := s.lines[h.key]
	return ln != nil && ln.watching
}

// waitQueued waits (bounded) until n callers are queued.
func (h *coalescing) waitQueued(n int) {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for h.queued() != n {
		if time.Now().After(deadline) {
			h.t.Fatalf("%d callers queued, want %d", h.queued(), n)
		}
		time.Sleep(time.Millisecond) // a goroutine reaching the queue: no channel to wait on
	}
}

// release ends the held call: the queued callers are served.
func (h *coalescing) release() {
	h.c.handOff(h.c.co.shard(h.key), h.key, h.many)
}

type takeResult struct {
	d   throttle.Decision
	err error
	// place is when the grant is the caller's (d.Delay from Take's
	// return): callers woken apart on a busy machine have Delays that
	// differ by as much, and places that do not.
	place time.Time
}

// queue starts a Take of one permit and waits until it is queued, so that
// callers queue in the order this is called.
func (h *coalescing) queue(ctx context.Context, b throttle.Bucket, maxWait time.Duration) <-chan takeResult {
	h.t.Helper()
	n := h.queued()
	ch := make(chan takeResult, 1)
	go func() {
		d, err := b.Take(ctx, h.key, 1, maxWait)
		ch <- takeResult{d, err, time.Now().Add(d.Delay)}
	}()
	h.waitQueued(n + 1)
	return ch
}

// coalescedBuckets builds one of each Redis bucket with limit per hour
// (no period ends during a test), the Counter reset once.
func coalescedBuckets(t *testing.T, rdb redis.UniversalClient, key string, limit int64) map[string]throttle.Bucket {
	t.Helper()
	bs := allBuckets(t, rdb, key, limit, time.Hour)
	c := bs["Counter"].(*Counter)
	if err := scriptCounterReset.Run(context.Background(), rdb, []string{c.ks.root + ":ctr"}, time.Hour.Milliseconds()).Err(); err != nil {
		t.Fatal(err)
	}
	return bs
}

// TestCoalescedPartialGrant: with 3 permits left, one coalesced call for 6
// queued callers grants exactly 3, to the first 3 in arrival order; the
// other 3 are refused with a delay (they wait as uncoalesced callers do),
// and the bucket is then empty: nothing taken ahead, nothing refunded.
func TestCoalescedPartialGrant(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	for name, b := range coalescedBuckets(t, rdb, "partial", 10) {
		t.Run(name, func(t *testing.T) {
			for i := range 7 {
				if d, err := b.Take(ctx, "", 1, 0); err != nil || !d.Granted {
					t.Fatalf("take %d: %+v, %v", i, d, err)
				}
			}
			h := coalescingOf(t, b, "")
			var ks []int64
			h.c.co.beforeBatch = func(k int64) { ks = append(ks, k) }
			defer func() { h.c.co.beforeBatch = nil }()
			h.hold()
			var res []<-chan takeResult
			for range 6 {
				res = append(res, h.queue(ctx, b, 0))
			}
			h.release()
			for i, ch := range res {
				r := <-ch
				if r.err != nil {
					t.Fatalf("caller %d: %v", i, r.err)
				}
				if r.d.Granted != (i < 3) {
					t.Fatalf("caller %d: %+v; want the first 3 in arrival order granted", i, r.d)
				}
				if !r.d.Granted && r.d.Delay <= 0 {
					t.Fatalf("caller %d refused without a delay: %+v", i, r.d)
				}
			}
			waitInflight(t, h.c)
			if len(ks) != 1 || ks[0] != 6 {
				t.Fatalf("coalesced calls asked for %v, want one call for 6", ks)
			}
			if left := drain(t, b); left != 0 {
				t.Fatalf("%d permits left after a partial grant, want 0", left)
			}
		})
	}
}

// TestCoalescedWaiterCancelledInFlight: a caller whose context ends while
// its batch is in flight returns at once; the permit the batch took for it
// goes to the next caller in line, so it is neither lost nor granted
// twice. A token bucket's permit carries its place and goes to a caller
// that queued while the call was in flight too; a fixed window's counts
// from when the store decided it, and goes only to a caller queued before
// the call was sent (one who came later gets a permit of its own). With
// nobody such in line, the permit is counted as stranded.
func TestCoalescedWaiterCancelledInFlight(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	for _, c := range []struct {
		name string
		// fourth: when a fourth caller queues, if at all: "before" the
		// call is sent, or "after" its answer came.
		fourth string
		// want, for the token bucket and the fixed window: callers
		// granted, permits stranded, and permits the store was charged.
		granted, stranded, charged [2]int
	}{
		{"queued before the call", "before", [2]int{3, 3}, [2]int{0, 0}, [2]int{3, 3}},
		{"queued after the call was sent", "after", [2]int{3, 3}, [2]int{0, 1}, [2]int{3, 4}},
		{"nobody queued", "", [2]int{2, 2}, [2]int{1, 1}, [2]int{3, 3}},
	} {
		for k, kind := range []string{"TokenBucket", "FixedWindow"} {
			t.Run(c.name+"/"+kind, func(t *testing.T) {
				key := "cancel-" + kind + "-" + c.fourth
				var b throttle.Bucket
				var err error
				if kind == "TokenBucket" {
					b, err = NewTokenBucket(rdb, key, 10, time.Hour)
				} else {
					b, err = NewFixedWindow(rdb, key, 10, time.Hour)
				}
				if err != nil {
					t.Fatal(err)
				}
				h := coalescingOf(t, b, "")
				inFlight, proceed := make(chan struct{}), make(chan struct{})
				h.c.co.beforeBatch = func(int64) {
					h.c.co.beforeBatch = nil
					close(inFlight)
					<-proceed
				}
				var fourth <-chan takeResult
				if c.fourth == "after" {
					h.c.co.afterBatch = func() {
						h.c.co.afterBatch = nil
						fourth = h.queue(context.Background(), b, 0)
					}
				}
				h.hold()
				cctx, cancel := context.WithCancel(context.Background())
				first := h.queue(cctx, b, 0)
				second := h.queue(context.Background(), b, 0)
				third := h.queue(context.Background(), b, 0)
				h.release()
				<-inFlight
				cancel()
				r := <-first
				var be *throttle.BackendError
				if !errors.As(r.err, &be) || !errors.Is(r.err, context.Canceled) {
					t.Fatalf("cancelled caller: %+v, %v; want a BackendError wrapping context.Canceled", r.d, r.err)
				}
				if c.fourth == "before" {
					fourth = h.queue(context.Background(), b, 0) // queued for the next batch
				}
				close(proceed)
				granted := 0
				for _, ch := range []<-chan takeResult{second, third} {
					r := <-ch
					if r.err != nil || !r.d.Granted {
						t.Fatalf("%+v, %v; want granted", r.d, r.err)
					}
					granted++
				}
				if c.fourth != "" {
					if r := <-fourth; r.err != nil || !r.d.Granted {
						t.Fatalf("fourth caller: %+v, %v; want granted", r.d, r.err)
					}
					granted++
				}
				waitInflight(t, h.c)
				stranded := h.c.co.stranded.Load()
				if left := drain(t, b); left != 10-c.charged[k] {
					t.Fatalf("%d left, want %d: the store was charged %d", left, 10-c.charged[k], 10-left)
				}
				if granted != c.granted[k] || stranded != int64(c.stranded[k]) {
					t.Fatalf("%d granted, %d stranded; want %d and %d", granted, stranded, c.granted[k], c.stranded[k])
				}
			})
		}
	}
}

// TestCoalescedTakeGrantsTheLimitInArrivalOrder: a coalesced call of
// callers that cannot wait, reaching Redis once the last limit's permits
// have stopped counting, grants the limit, in arrival order; the rest are
// told when the first of those stops counting, an interval and the margin
// on.
func TestCoalescedTakeGrantsTheLimitInArrivalOrder(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	const limit, period = 3, 200 * time.Millisecond
	b, err := NewTokenBucket(rdb, "cross", limit, period)
	if err != nil {
		t.Fatal(err)
	}
	for range limit {
		if d, err := b.Take(ctx, "", 1, 0); err != nil || !d.Granted {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	// The round trips the batch's permits count: the bucket's estimate
	// after the last take, which nothing changes before the batch runs.
	trips := us(b.rtt.Load())
	h := coalescingOf(t, b, "")
	h.c.co.beforeBatch = func(int64) {
		// The permits stop counting while the batch is on its way: the
		// schedule expires with the last of them.
		deadline := time.Now().Add(5 * time.Second)
		for rdb.Exists(ctx, b.rootKeys[0]).Val() != 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // polls the server's clock, bounded
		}
	}
	h.hold()
	var res []<-chan takeResult
	for range 5 {
		res = append(res, h.queue(ctx, b, 0))
	}
	h.release()
	for i, ch := range res {
		r := <-ch
		if r.err != nil || r.d.Granted != (i < limit) {
			t.Fatalf("caller %d: %+v, %v; want the first %d granted", i, r.d, r.err, limit)
		}
		if most := period + DefaultArrivalMargin(period) + trips; !r.d.Granted && (r.d.Delay <= period/2 || r.d.Delay > most) {
			t.Fatalf("caller %d: delay %v, want when the first grant stops counting (about %v)", i, r.d.Delay, most)
		}
	}
	waitInflight(t, h.c)
	h.c.co.beforeBatch = nil
	if left := drain(t, b); left != 0 {
		t.Fatalf("%d left in the new period, want 0", left)
	}
}

// A coalesced token bucket call places each caller's permit within that
// caller's own wait: at the limit, the callers that cannot wait are
// refused and those that can are placed, in the same round trip, the
// least wait first. (Within the smallest wait among them, as a call for
// the batch as a whole would be, all four were refused.)
func TestCoalescedTokenBucketRefusesOnlyTheCallersItsPlacesDoNotFit(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	hook := &countingHook{}
	rdb.AddHook(hook)
	ctx := context.Background()
	const limit, period = 10, time.Second // paced 100 ms apart
	b, err := NewTokenBucket(rdb, "each-wait", limit, period)
	if err != nil {
		t.Fatal(err)
	}
	for range limit {
		if d, err := b.Take(ctx, "", 1, 0); err != nil || !d.Granted {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	const long = 5 * time.Second
	waits := []time.Duration{long, 0, long + time.Second, 0} // in the order they queue
	got, places, calls := coalescedBatch(t, b, hook, waits)
	checkOnlyThoseThatCanWaitPlaced(t, got, waits, calls, period/2)
	// The least wait first: the caller that queued first waits less than
	// the third, and has the earlier place, one pace (100 ms) before it.
	if gap := places[2].Sub(places[0]); gap < 90*time.Millisecond || gap > 110*time.Millisecond {
		t.Fatalf("places in %v and %v: %v apart, want the earlier for the shorter wait, one pace apart", got[0].Delay, got[2].Delay, gap)
	}
}

// Above 1,000 permits a second (unpaced), a batch none of whose callers
// fits at once places each caller in turn within its own wait, as a paced
// one does: a caller without a wait left is refused alone, not with the
// batch.
func TestCoalescedUnpacedTokenBucketPlacesTheCallersThatCanWait(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	hook := &countingHook{}
	rdb.AddHook(hook)
	const limit = 2000
	b, err := NewTokenBucket(rdb, "unpaced-each-wait", limit, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := b.Take(context.Background(), "", limit, 0); err != nil || !d.Granted {
		t.Fatalf("%+v, %v", d, err)
	}
	waits := []time.Duration{0, throttle.Forever, 0, 5 * time.Second}
	got, places, calls := coalescedBatch(t, b, hook, waits)
	checkOnlyThoseThatCanWaitPlaced(t, got, waits, calls, time.Second/2)
	if gap := places[1].Sub(places[3]).Abs(); gap > 10*time.Millisecond {
		t.Fatalf("places %v apart, want the same (unpaced, both when the first permits stop counting)", gap)
	}
}

// Unpaced, a batch only some of whose callers fit at once gives those one
// place at once and places the others each in turn within its own wait,
// in the same call.
func TestCoalescedUnpacedTokenBucketPlacesTheCallersRoomLeavesOut(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	hook := &countingHook{}
	rdb.AddHook(hook)
	const limit = 2000
	b, err := NewTokenBucket(rdb, "unpaced-partial", limit, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := b.Take(context.Background(), "", limit-2, 0); err != nil || !d.Granted {
		t.Fatalf("%+v, %v", d, err)
	}
	waits := []time.Duration{5 * time.Second, 5 * time.Second, 0, 5 * time.Second, 5 * time.Second}
	got, _, calls := coalescedBatch(t, b, hook, waits)
	if calls != 1 {
		t.Fatalf("%d calls to Redis for the batch, want 1", calls)
	}
	// The least wait first: the caller without a wait and one other at
	// once, the three others when the first permits stop counting.
	var now, later int
	for i, d := range got {
		switch {
		case !d.Granted:
			t.Fatalf("caller %d (wait %v) refused: %+v", i, waits[i], d)
		case d.Delay < time.Second/2:
			now++
		case d.Delay <= waits[i]:
			later++
		default:
			t.Fatalf("caller %d: placed in %v, beyond its wait %v", i, d.Delay, waits[i])
		}
	}
	if now != 2 || later != 3 || got[2].Delay >= time.Second/2 {
		t.Fatalf("%d placed at once and %d when the first permits stop counting (the caller without a wait in %v), want 2 and 3, and it at once", now, later, got[2].Delay)
	}
	if count := scheduleConsistent(t, rdb, b.rootKeys[0], time.Second); count != limit+3 {
		t.Fatalf("the schedule counts %d permits, want %d", count, limit+3)
	}
}

// Unpaced, a take is placed as early as the limit allows: permits given
// back free room at once, whatever the places given before (only a paced
// key's places follow the last one given).
func TestUnpacedTokenBucketPlacesAtOnceWhenPermitsAreGivenBack(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	const limit = 2000
	b, err := NewTokenBucket(srv.Client(), "unpaced-given-back", limit, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	all, err := b.Take(ctx, "", limit, 0)
	if err != nil || !all.Granted || all.Cancel == nil {
		t.Fatalf("%+v, %v", all, err)
	}
	u, err := b.run(ctx, "", -2, throttle.Forever, nil)
	if err != nil || u.forCaller(1).Delay < time.Second/2 {
		t.Fatalf("two callers when the limit's permits stop counting: %+v, %v", u, err)
	}
	if err := all.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := b.Take(ctx, "", 1, 5*time.Second); err != nil || !d.Granted || d.Delay > time.Second/2 {
		t.Fatalf("a take once the limit's permits are given back: %+v, %v; want a place at once", d, err)
	}
}

// One call places thousands of permits, each in a slot of its own (a
// crowd on a paced key that can wait): the schedule's new entries are
// written in chunks (Lua's unpack() takes at most 8,000 values).
func TestTokenBucketPlacesThousandsInOneCall(t *testing.T) {
	srv := redisenv.New(t)
	b, err := NewTokenBucket(srv.Client(), "thousands", 100, time.Second) // a place every 10 ms, a slot every 3.9 ms
	if err != nil {
		t.Fatal(err)
	}
	const k = 8500
	u, err := b.run(context.Background(), "", -k, throttle.Forever, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := u.forCaller(k - 1); !got.Granted || got.Delay < 80*time.Second {
		t.Fatalf("the last of %d: %+v; want placed about 85 s ahead", k, got)
	}
}

// A crowd queued on one key goes in calls of at most maxBatch callers.
func TestCoalescedCrowdGoesInBatchesOfAtMostMaxBatch(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b, err := NewTokenBucket(srv.Client(), "batches", 1<<30, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	h := coalescingOf(t, b, "")
	var ks []int64
	h.c.co.beforeBatch = func(k int64) { ks = append(ks, k) } // the runner's goroutine alone
	h.hold()
	const crowd = maxBatch + maxBatch/2
	errs := make(chan error, crowd)
	for range crowd {
		go func() {
			d, err := b.Take(ctx, "", 1, time.Minute)
			if err == nil && !d.Granted {
				err = fmt.Errorf("refused: %+v", d)
			}
			errs <- err
		}()
	}
	h.waitQueued(crowd)
	h.release()
	for range crowd {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	waitInflight(t, h.c)
	h.c.co.beforeBatch = nil
	sum := int64(0)
	for _, k := range ks {
		if k > maxBatch {
			t.Fatalf("a call for %d callers, want at most %d", k, maxBatch)
		}
		sum += k
	}
	if sum != crowd || len(ks) < 2 {
		t.Fatalf("calls for %v callers, want %d in all, in at least 2", ks, crowd)
	}
}

// A batch's callers are told the limit's room left after their own place,
// as a take of their own would be, never the places given after theirs
// beyond the limit.
func TestTokenBucketBatchRemainingCountsWhatIsFreeAfterEachPlace(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	for _, c := range []struct {
		limit, taken int64
		k            int
		want         []int64
	}{
		{2000, 2000, 3, []int64{0, 0, 0}}, // unpaced: none fit at once, all a second ahead
		{100, 98, 3, []int64{1, 0, 0}},    // paced: all ahead, the first within the limit's room
	} {
		b, err := NewTokenBucket(srv.Client(), fmt.Sprint("remaining-", c.limit), c.limit, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := b.Take(ctx, "", c.taken, 0); err != nil || !d.Granted {
			t.Fatalf("%+v, %v", d, err)
		}
		u, err := b.run(ctx, "", int64(-c.k), 5*time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for i := range c.k {
			d := u.forCaller(int64(i))
			if !d.Granted {
				t.Fatalf("limit %d, caller %d refused: %+v", c.limit, i, d)
			}
			got = append(got, d.Remaining)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("limit %d: Remaining %v, want %v", c.limit, got, c.want)
		}
	}
}

// checkOnlyThoseThatCanWaitPlaced checks a batch at its limit, answered in
// one call: the callers with a wait placed within it, no earlier than
// from (when the first permits stop counting), the others refused with
// the time of the next place.
func checkOnlyThoseThatCanWaitPlaced(t *testing.T, got []throttle.Decision, waits []time.Duration, calls int64, from time.Duration) {
	t.Helper()
	if calls != 1 {
		t.Fatalf("%d calls to Redis for the batch, want 1", calls)
	}
	for i, d := range got {
		if d.Granted != (waits[i] > 0) {
			t.Fatalf("caller %d (wait %v): %+v; want only the callers that can wait placed", i, waits[i], d)
		}
		if d.Granted && (d.Delay < from || d.Delay > waits[i]) {
			t.Fatalf("caller %d: placed in %v, want once the first permits stop counting (%v on), within its wait %v", i, d.Delay, from, waits[i])
		}
		if !d.Granted && d.Delay <= 0 {
			t.Fatalf("caller %d refused with delay %v, want the time of the next place", i, d.Delay)
		}
	}
}

// coalescedBatch queues callers of b's key "" with waits, in that order,
// behind a call held in flight, lets them go as one batch, and returns
// each caller's decision and place, and the commands hook counted for
// the batch.
func coalescedBatch(t *testing.T, b throttle.Bucket, hook *countingHook, waits []time.Duration) ([]throttle.Decision, []time.Time, int64) {
	t.Helper()
	h := coalescingOf(t, b, "")
	h.hold()
	var res []<-chan takeResult
	for _, w := range waits {
		res = append(res, h.queue(context.Background(), b, w))
	}
	before := hook.n.Load()
	h.release()
	got := make([]throttle.Decision, len(res))
	places := make([]time.Time, len(res))
	for i, ch := range res {
		r := <-ch
		if r.err != nil {
			t.Fatalf("caller %d: %v", i, r.err)
		}
		got[i], places[i] = r.d, r.place
	}
	waitInflight(t, h.c)
	return got, places, hook.n.Load() - before
}

// gcraTaken is a GCRA of 10 per 10 s (a slot every second, burst 10)
// under key, taken permits of its burst taken at once.
func gcraTaken(t *testing.T, rdb redis.UniversalClient, key string, taken int) *GCRA {
	t.Helper()
	b, err := NewGCRA(rdb, key, 10, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for range taken {
		if d, err := b.Take(context.Background(), "", 1, 0); err != nil || !d.Granted || d.Delay != 0 {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	return b
}

// TestCoalescedGCRAReservesWithinEachWait: a coalesced GCRA call reserves
// one slot per caller, in arrival order, one emission interval apart,
// each within the callers' wait; callers whose slot would come later are
// refused with the time of the next slot.
func TestCoalescedGCRAReservesWithinEachWait(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b := gcraTaken(t, srv.Client(), "gcra-co", 10)
	h := coalescingOf(t, b, "")
	h.hold()
	const maxWait = 2500 * time.Millisecond // slots in about 1 s and 2 s fit; 3 s does not
	var res []<-chan takeResult
	for range 4 {
		res = append(res, h.queue(ctx, b, maxWait))
	}
	h.release()
	var slots []time.Time
	for i, ch := range res {
		r := <-ch
		if r.err != nil || r.d.Granted != (i < 2) {
			t.Fatalf("caller %d: %+v, %v; want the first 2 reserved", i, r.d, r.err)
		}
		if r.d.Granted {
			if r.d.Delay <= 0 || r.d.Delay > maxWait {
				t.Fatalf("caller %d: slot in %v, want within (0, %v]", i, r.d.Delay, maxWait)
			}
			slots = append(slots, r.place)
		} else if r.d.Delay <= maxWait {
			t.Fatalf("caller %d refused with delay %v, want the next slot beyond %v", i, r.d.Delay, maxWait)
		}
	}
	// Each delay counts from when its caller's Take returned, which may be
	// far apart on a busy machine: the slots' times are compared.
	if gap := slots[1].Sub(slots[0]); gap < time.Second-10*time.Millisecond || gap > time.Second+10*time.Millisecond {
		t.Fatalf("slots %v apart, want one emission interval (1s)", gap)
	}
	waitInflight(t, h.c)
}

// A coalesced GCRA call reserves each caller's slot within that caller's
// own wait, the least wait first: at the limit, the callers that cannot
// wait are refused and those that can get the next slots, in the same
// round trip. (A call bounded by the batch's least wait would refuse all
// five.)
func TestCoalescedGCRARefusesOnlyTheCallersItsSlotsDoNotFit(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	hook := &countingHook{}
	rdb.AddHook(hook)
	b := gcraTaken(t, rdb, "gcra-each-wait", 10)
	waits := []time.Duration{5 * time.Second, 0, 1500 * time.Millisecond, 0, 1500 * time.Millisecond} // in the order they queue
	got, slots, calls := coalescedBatch(t, b, hook, waits)
	if calls != 1 {
		t.Fatalf("%d calls to Redis for the batch, want 1", calls)
	}
	// Slots in about 1 s and 2 s: the first to the first 1.5 s caller,
	// the second to the 5 s caller; the other 1.5 s caller and the
	// callers without a wait refused, with the time of the next slot.
	for i, want := range []bool{true, false, true, false, false} {
		d := got[i]
		if d.Granted != want {
			t.Fatalf("caller %d (wait %v): %+v; want granted %v", i, waits[i], d, want)
		}
		if d.Granted && (d.Delay <= 0 || d.Delay > waits[i]) {
			t.Fatalf("caller %d: slot in %v, want within (0, %v]", i, d.Delay, waits[i])
		}
		if !d.Granted && d.Delay <= 1500*time.Millisecond {
			t.Fatalf("caller %d refused with delay %v, want the slot after those given (about 3 s)", i, d.Delay)
		}
	}
	if gap := slots[0].Sub(slots[2]); gap < time.Second-10*time.Millisecond || gap > time.Second+10*time.Millisecond {
		t.Fatalf("slots %v apart, want the earlier for the shorter wait, one emission interval (1s) apart", gap)
	}
}

// A coalesced GCRA call gives its callers as many slots as their waits
// fit, beyond the burst: each slot is one permit, as k takes of one each
// would be, so WithBurst(1) still serves a batch in one round trip.
func TestCoalescedGCRAGivesSlotsBeyondTheBurst(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b, err := NewGCRA(srv.Client(), "gcra-beyond-burst", 10, time.Second, WithBurst(1)) // a slot every 100 ms
	if err != nil {
		t.Fatal(err)
	}
	h := coalescingOf(t, b, "")
	h.hold()
	var res []<-chan takeResult
	for _, w := range []time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second, 3 * time.Second} {
		res = append(res, h.queue(ctx, b, w))
	}
	h.release()
	var slots []time.Time
	for i, ch := range res {
		r := <-ch
		if r.err != nil || !r.d.Granted {
			t.Fatalf("caller %d: %+v, %v; want a slot (at most 300 ms ahead)", i, r.d, r.err)
		}
		if r.d.Remaining != 0 {
			t.Fatalf("caller %d: Remaining %d, want 0 (a burst of 1, taken)", i, r.d.Remaining)
		}
		slots = append(slots, r.place)
	}
	waitInflight(t, h.c)
	for i := 1; i < len(slots); i++ {
		if gap := slots[i].Sub(slots[i-1]); gap < 90*time.Millisecond || gap > 110*time.Millisecond {
			t.Fatalf("slots %d and %d %v apart, want one emission interval (100 ms)", i-1, i, gap)
		}
	}
}

// A batch's callers are told the permits free at once after their own
// slot, as a take of their own would be: none while the slots are ahead.
func TestCoalescedGCRARemainingCountsNothingFreeWhileSlotsAreAhead(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b := gcraTaken(t, srv.Client(), "gcra-remaining", 7)
	for _, waits := range [][]time.Duration{
		{0, 0, 5 * time.Second, 6 * time.Second, 7 * time.Second}, // each caller's wait sent
		{7 * time.Second, 7 * time.Second, 7 * time.Second, 7 * time.Second, 7 * time.Second},
	} {
		h := coalescingOf(t, b, "")
		h.hold()
		var res []<-chan takeResult
		for _, w := range waits {
			res = append(res, h.queue(ctx, b, w))
		}
		h.release()
		for i, ch := range res {
			r := <-ch
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.d.Granted && r.d.Delay > 0 && r.d.Remaining != 0 {
				t.Errorf("waits %v, caller %d, slot in %v: Remaining %d, want 0", waits, i, r.d.Delay, r.d.Remaining)
			}
			if r.d.Granted && r.d.Delay == 0 && (i >= 3 || r.d.Remaining != int64(2-i)) {
				t.Errorf("waits %v, caller %d, free at once: Remaining %d, want %d", waits, i, r.d.Remaining, 2-i)
			}
		}
		waitInflight(t, h.c)
	}
}

// TestWeightedTakeNotCoalesced: a take of n > 1 never joins a line (it
// could be split across grants): it goes to Redis at once, all or nothing,
// even while a call for its key is in flight.
func TestWeightedTakeNotCoalesced(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	for name, b := range coalescedBuckets(t, srv.Client(), "weighted", 10) {
		h := coalescingOf(t, b, "")
		h.hold()
		if d, err := b.Take(ctx, "", 4, 0); err != nil || !d.Granted {
			t.Fatalf("%s: take 4 while a call is in flight: %+v, %v", name, d, err)
		}
		if h.queued() != 0 {
			t.Fatalf("%s: a weighted take joined the line", name)
		}
		h.release()
		if left := drain(t, b); left != 6 {
			t.Fatalf("%s: %d left, want 6", name, left)
		}
	}
}

// TestCoalescedStuckCallBypassed: a call in flight that does not return
// (a stalled store, a dead connection) holds up the callers of its key for
// at most stallAfter: a caller queued behind it then asks on its own, and
// a caller arriving later does not queue at all.
func TestCoalescedStuckCallBypassed(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b, err := NewTokenBucket(srv.Client(), "stuck", 10, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	h := coalescingOf(t, b, "")
	h.hold() // never released: the call in flight is stuck
	h.c.co.stallAfter = 30 * time.Millisecond
	start := time.Now()
	queued := h.queue(ctx, b, 0)
	r := <-queued
	if r.err != nil || !r.d.Granted {
		t.Fatalf("caller queued behind a stuck call: %+v, %v; want granted on its own", r.d, r.err)
	}
	if took := time.Since(start); took < 30*time.Millisecond {
		t.Fatalf("left the line after %v, before stallAfter", took)
	}
	if d, err := b.Take(ctx, "", 1, 0); err != nil || !d.Granted || h.waiting() != 0 {
		t.Fatalf("caller arriving after the stall: %+v, %v, %d waiting; want granted at once, not queued", d, err, h.waiting())
	}
	if left := drain(t, b); left != 8 {
		t.Fatalf("%d left, want 8", left)
	}
	// With nobody waiting behind the stuck call, its line stops looking.
	deadline := time.Now().Add(5 * time.Second)
	for h.watching() {
		if time.Now().After(deadline) {
			t.Fatalf("the line's stall watch still set 5 s after its last caller left (%d queued)", h.queued())
		}
		time.Sleep(time.Millisecond) // a timer firing: no channel to wait on
	}
}

// TestRefillUnlockStalledAcquireInTime: with Redis stalled right after the
// reply that grants a refill's permit, Acquire returns with the permit as
// soon as the reply is in: no call (an unlock, a second command) runs
// after the reply to hold it. Judged from the reply, not from the call:
// the wait is long enough for a proxied round trip on a busy machine.
func TestRefillUnlockStalledAcquireInTime(t *testing.T) {
	srv := redisenv.New(t)
	p, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	defer p.Resume()
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := NewTokenBucket(rdb, "unlock-stall", 10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Load the scripts and beat once on another budget, so that the
	// measured Acquire is the refill alone.
	if _, err := b.Take(context.Background(), "warm", 1, 0); err != nil {
		t.Fatal(err)
	}
	hook := &stallAfterGrant{p: p}
	rdb.AddHook(hook)
	lim := throttle.New(b)
	stall := startStallMeter(t)
	err = lim.Acquire(context.Background(), 5*time.Second)
	returned := time.Now()
	stalled := stall.Stop()
	if err != nil {
		t.Fatalf("Acquire: %v, want the refill's permit", err)
	}
	if after := returned.Sub(hook.at()); after > overshootBound+stalled {
		t.Fatalf("Acquire returned %v after the refill's reply (the process's worst stall %v): a call after the reply held it", after, stalled)
	}
	p.Resume()
	waitInflight(t, &b.common)
}

// stallAfterGrant stalls the proxy as soon as a script's reply grants
// (status 1), so that any command sent after it hangs, and notes when.
type stallAfterGrant struct {
	p       *faultproxy.Proxy
	stalled atomic.Int64 // UnixNano of the stall; 0 before
}

// at is when the proxy was stalled; the zero time before.
func (h *stallAfterGrant) at() time.Time {
	if ns := h.stalled.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

func (*stallAfterGrant) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *stallAfterGrant) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.check(cmd)
		return err
	}
}

func (h *stallAfterGrant) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.check(c)
		}
		return err
	}
}

func (h *stallAfterGrant) check(cmd redis.Cmder) {
	if cmd.Name() != "evalsha" {
		return
	}
	c, ok := cmd.(interface{ Int64Slice() ([]int64, error) })
	if !ok {
		return
	}
	if r, err := c.Int64Slice(); err == nil && len(r) > 0 && r[0] == 1 {
		h.stalled.CompareAndSwap(0, time.Now().UnixNano())
		h.p.Stall()
	}
}

// TestCrowdOnOneKey: 10,000 goroutines ask for one permit of one key in the
// same instant, through one Limiter, with a binding limit. No error: every caller is granted; and the crowd costs fewer
// Redis commands than grants, because each batch serves many callers.
// The callers wait without a bound of their own (how long 10,000
// goroutines take under the race detector is the machine's speed: beside
// two busy loops they outlasted a 10 s wait); a context of two minutes
// bounds the test.
func TestCrowdOnOneKey(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 goroutines over about a second of real time")
	}
	srv := redisenv.New(t)
	// The stand-in runs a batch's script of a few thousand places in
	// interpreted Lua under the race detector: the crowd took longer than
	// 10 s there (on one core too), while Redis serves it in 2 s.
	redisenv.NeedReal(t, srv, "a crowd of 10,000 served in a few seconds")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 512, ContextTimeoutEnabled: true})
	defer rdb.Close()
	hook := &countingHook{}
	rdb.AddHook(hook)
	const crowd, limit, period = 10_000, 2_000, 100 * time.Millisecond
	b, err := NewTokenBucket(rdb, "crowd", limit, period)
	if err != nil {
		t.Fatal(err)
	}
	lim := throttle.New(b)
	start := make(chan struct{})
	errs := make(chan error, crowd)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for range crowd {
		wg.Go(func() {
			<-start
			errs <- lim.Acquire(ctx, throttle.Forever)
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	close(errs)
	t.Logf("the crowd was served in %v", time.Since(began).Round(time.Millisecond))
	for err := range errs {
		if err != nil {
			t.Fatalf("an Acquire of the crowd: %v", err)
		}
	}
	cmds := hook.n.Load()
	t.Logf("%d grants, %d Redis commands", crowd, cmds)
	if cmds >= crowd {
		t.Fatalf("%d commands for %d grants: the crowd's takes did not coalesce", cmds, crowd)
	}
	waitInflight(t, &b.common)
}

// TestCoalescedGrantCountsFromWhenTakeReturns: a grant's Delay and Margin
// count from when Take returns (throttle.Decision), so the time a
// coalesced answer takes to reach its caller (a runner descheduled on a
// busy machine, a stalled process) is taken from them, as the round trip
// is: a permit handed over later than its margin allows must say so, for
// the Limiter to take another instead of sending late.
func TestCoalescedGrantCountsFromWhenTakeReturns(t *testing.T) {
	srv := redisenv.New(t)
	const margin, late = 10 * time.Millisecond, 30 * time.Millisecond
	b, err := NewTokenBucket(srv.Client(), "handed-late", 100, time.Minute, WithArrivalMargin(margin))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h := coalescingOf(t, b, "")
	h.c.co.afterBatch = func() { time.Sleep(late) }
	h.hold()
	var res []<-chan takeResult
	for range 3 {
		res = append(res, h.queue(ctx, b, 0)) // placed at once: the key is idle
	}
	h.release()
	for i, ch := range res {
		r := <-ch
		if r.err != nil || !r.d.Granted {
			t.Fatalf("caller %d: %+v, %v", i, r.d, r.err)
		}
		if r.d.Delay+r.d.Margin > time.Millisecond {
			t.Errorf("caller %d: handed its permit %v after the answer came, with delay %v and margin %v left: its time and margin had passed", i, late, r.d.Delay, r.d.Margin)
		}
	}
	waitInflight(t, h.c)
	h.c.co.afterBatch = nil
}

// TestFreshKeepsARefusalsDelay: the time a coalesced answer took to reach
// its caller comes off a grant's time, never off a refusal's Delay: a
// refusal must name a positive time after which asking again can succeed
// (buckettest's "refusal without a delay"; the stand-in's slow answers
// made GCRA's refusals come with none), and naming it a little late only
// makes the caller ask a little later.
func TestFreshKeepsARefusalsDelay(t *testing.T) {
	late := time.Now().Add(-10 * time.Millisecond)
	if d := fresh(throttle.Decision{Delay: 5 * time.Millisecond}, late); d.Delay != 5*time.Millisecond {
		t.Fatalf("a refusal's delay of 5 ms, handed 10 ms late: %v", d.Delay)
	}
	d := fresh(throttle.Decision{Granted: true, Delay: 4 * time.Millisecond, Margin: 10 * time.Millisecond}, late)
	if d.Delay != 0 || d.Margin > 4*time.Millisecond {
		t.Fatalf("a grant 4 ms ahead with a 10 ms margin, handed 10 ms late: %+v; want its time passed, at most 4 ms of margin left", d)
	}
}

// A batch's waits go to a script in groups of one span of the grid (a
// millisecond for places closer than that, else a microsecond), each its
// least wait, exact, and how many callers it has; not at all when there is
// one group: under load they differ by microseconds, and sent one each
// they cost a third of the throughput.
func TestWaitGroupsSendEachGroupsLeastWait(t *testing.T) {
	us := func(d time.Duration) int64 { return int64(d / time.Microsecond) }
	ms, micro := time.Millisecond, time.Microsecond
	for _, c := range []struct {
		grid  time.Duration
		waits []time.Duration
		want  []any
	}{
		{ms, nil, nil},
		{ms, []time.Duration{time.Second}, nil},
		{ms, []time.Duration{time.Second, time.Second + 300*micro, time.Second + 999*micro}, nil},
		{ms, []time.Duration{0, 900 * micro, time.Second, time.Second + ms}, []any{int64(0), int64(2), int64(1_000_000), int64(1), int64(1_001_000), int64(1)}},
		{ms, []time.Duration{5500 * micro, 5900 * micro, 7200 * micro}, []any{int64(5500), int64(2), int64(7200), int64(1)}},
		{ms, []time.Duration{5 * ms, throttle.Forever, throttle.Forever}, []any{int64(5000), int64(1), us(throttle.Forever), int64(2)}},
		{micro, []time.Duration{time.Second, time.Second + 300*micro, time.Second + 300*micro + 999}, []any{int64(1_000_000), int64(1), int64(1_000_300), int64(2)}},
		{micro, []time.Duration{time.Second, time.Second + 999}, nil},
	} {
		if got := waitGroups(c.waits, c.grid, us); !slices.Equal(got, c.want) {
			t.Errorf("waitGroups(%v, grid %v) = %v, want %v", c.waits, c.grid, got, c.want)
		}
	}
	if waitGrid(999*micro) != ms || waitGrid(ms) != micro {
		t.Errorf("waitGrid: %v for places 999µs apart, %v for 1ms; want 1ms, 1µs", waitGrid(999*micro), waitGrid(ms))
	}
}
