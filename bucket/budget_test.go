package bucket

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// A Budget's guarantee is judged, where it can be, on the places
// budget.lua gives, exactly, on the Redis server's clock (as a
// TokenBucket's in tokenbucket_test.go): a take's reply names the server's
// time, and Decision.Delay the place from it.

// llmDims are an LLM API's limits: requests and tokens per interval.
func llmDims(requests, tokens int64, iv time.Duration) []Dimension {
	return []Dimension{{Name: "requests", Limit: requests, Interval: iv}, {Name: "tokens", Limit: tokens, Interval: iv}}
}

func newBudget(t testing.TB, rdb redis.UniversalClient, key string, dims []Dimension, opts ...BudgetOption) *Budget {
	t.Helper()
	b, err := NewBudget(rdb, key, dims, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func takeCost(t testing.TB, b *Budget, key string, c throttle.Cost) throttle.Decision {
	t.Helper()
	d, err := b.TakeCost(context.Background(), key, c, 0)
	if err != nil {
		t.Fatalf("TakeCost(%v) = %v", c, err)
	}
	return d
}

// settle corrects the grant d by c.
func settle(t testing.TB, d throttle.Decision, c throttle.Cost) {
	t.Helper()
	if d.Settle == nil {
		t.Fatalf("Settle(%v) of %+v: the decision has no Settle", c, d)
	}
	if err := d.Settle(context.Background(), c); err != nil {
		t.Fatalf("Settle(%v) = %v", c, err)
	}
}

// costPlace is one take of a cost: its decision, its place (µs on the
// server's clock; refused, the earliest place it could have had or the
// end of a pause), the server's clock when it was decided, and where
// each dimension recorded it (the end of its entry; 0: not taken).
type costPlace struct {
	d       throttle.Decision
	at, now int64
	ends    []int64
}

// placeCost takes c under key through b within maxWait.
func placeCost(t testing.TB, b *Budget, key string, c throttle.Cost, maxWait time.Duration) costPlace {
	t.Helper()
	d, u, err := b.take(context.Background(), key, c, maxWait)
	if err != nil {
		t.Fatalf("TakeCost(%v, %v) = %v", c, maxWait, err)
	}
	return costPlace{d: d, at: u.now + d.Delay.Microseconds(), now: u.now, ends: u.ends}
}

// unit is what one grant holds of one dimension at its place (µs on the
// server's clock): its take net of what it gave back.
type unit struct{ at, n int64 }

// judgeUnits fails t unless units hold at most limit in any span of
// window.
func judgeUnits(t testing.TB, what string, units []unit, limit int64, window time.Duration) {
	t.Helper()
	u := slices.Clone(units)
	slices.SortFunc(u, func(a, b unit) int { return int(a.at - b.at) })
	w := window.Microseconds()
	sum, j := int64(0), 0
	for i, x := range u {
		sum += x.n
		for x.at-u[j].at >= w {
			sum -= u[j].n
			j++
		}
		if sum > limit {
			t.Fatalf("%s: %d in the %v from %d to %d (places %d to %d of %d), limit %d", what, sum, window, u[j].at, x.at, j, i, len(u), limit)
		}
	}
}

// budgetCalls counts the budget script's calls a client sends.
type budgetCalls struct{ n atomic.Int64 }

func (h *budgetCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *budgetCalls) count(cmd redis.Cmder) {
	if a := cmd.Args(); len(a) > 1 && strings.EqualFold(cmd.Name(), "evalsha") && a[1] == scriptBudget.Hash() {
		h.n.Add(1)
	}
}
func (h *budgetCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.count(cmd); return next(ctx, cmd) }
}
func (h *budgetCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.count(c)
		}
		return next(ctx, cmds)
	}
}

// TestBudgetAllOrNothing: a cost one dimension cannot pay takes nothing
// from the other, and the refusal names the earliest place, when the
// short dimension has room.
func TestBudgetAllOrNothing(t *testing.T) {
	srv := redisenv.New(t)
	const margin = 10 * time.Millisecond
	b := newBudget(t, srv.Client(), "aon", llmDims(10, 100, time.Minute), WithArrivalMargin(margin))
	first := placeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 80}, 0)
	if d := first.d; !d.Granted || d.Delay != 0 || d.Margin != margin || d.Remaining != 20 || d.Limit != 100 {
		t.Fatalf("first take = %+v, want granted now, tokens binding with 20 left of 100", d)
	}
	r := placeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 30}, 0)
	if d := r.d; d.Granted || r.at != first.at+(time.Minute+margin).Microseconds() || d.Limit != 100 || d.Remaining != 20 {
		t.Fatalf("take beyond the tokens = %+v, want refused until the first take's place plus the interval and the margin, tokens binding with 20 left", d)
	}
	// The refused take charged no request: 9 are left, all of them.
	if d := takeCost(t, b, "", throttle.Cost{"requests": 9}); !d.Granted || d.Remaining != 0 {
		t.Fatalf("take of the 9 requests left = %+v, want granted with 0 left", d)
	}
	if d := takeCost(t, b, "", throttle.Cost{"requests": 1}); d.Granted || d.Limit != 10 {
		t.Fatalf("an 11th request = %+v, want refused, the requests binding", d)
	}
	// A cost that does not name the tokens does not check them.
	if d := takeCost(t, b, "other", throttle.Cost{"requests": 1}); !d.Granted || d.Limit != 10 {
		t.Fatalf("another key's take = %+v, want granted, its own budget", d)
	}
}

// TestBudgetPlacesWhereEveryDimensionHasRoom: a cost is placed at the
// earliest time at which every dimension it names has room for its
// amount, just in time: a caller that can wait longer is told that time,
// nothing taken, and placed when it asks then; the dimensions bind in
// turn, each refusal naming the one that binds and the time it leaves,
// exactly on the server's clock (set by the test).
func TestBudgetPlacesWhereEveryDimensionHasRoom(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	const iv, margin = time.Second, 10 * time.Millisecond
	b := newBudget(t, rdb, "room", llmDims(2, 100, iv), WithArrivalMargin(margin))
	f := onFakeClock(t, rdb, b)
	f.set(start)
	span := (iv + margin).Microseconds()
	first := placeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 90}, 0)
	if !first.d.Granted || first.at != start {
		t.Fatalf("first take = %+v, want granted now", first)
	}
	// The tokens bind: 20 more fit once the 90 stop counting. A caller
	// that can wait is told that time, not placed ahead.
	if told := placeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 20}, throttle.Forever); told.d.Granted || told.at != start+span {
		t.Fatalf("second take = %+v, want told an interval and the margin after the first (%d), nothing placed", told, start+span)
	}
	f.set(start + span)
	second := placeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 20}, throttle.Forever)
	if !second.d.Granted || second.at != start+span || second.d.Margin != margin {
		t.Fatalf("second take, asked again then = %+v, want placed now (%d)", second, start+span)
	}
	// Then the requests: both taken until the second stops counting.
	if r := placeCost(t, b, "", throttle.Cost{"requests": 2, "tokens": 1}, 0); r.d.Granted || r.d.Limit != 2 || r.at != second.at+span {
		t.Fatalf("2 requests with one counting = %+v, want refused until %d, the requests binding", r, second.at+span)
	}
	if r := placeCost(t, b, "", throttle.Cost{"tokens": 95}, 0); r.d.Granted || r.d.Limit != 100 || r.at != second.at+span {
		t.Fatalf("95 tokens with 20 counting = %+v, want refused until %d, the tokens binding", r, second.at+span)
	}
	f.set(second.at + span)
	third := placeCost(t, b, "", throttle.Cost{"requests": 2, "tokens": 1}, throttle.Forever)
	if !third.d.Granted || third.at != second.at+span {
		t.Fatalf("third take = %+v, want placed when the second stops counting (%d)", third, second.at+span)
	}
	judgeUnits(t, "requests", []unit{{first.at, 1}, {second.at, 1}, {third.at, 2}}, 2, iv+margin)
	judgeUnits(t, "tokens", []unit{{first.at, 90}, {second.at, 20}, {third.at, 1}}, 100, iv+margin)
}

// TestBudgetPlacesCostsJustInTimeUnpaced: costs are placed now while
// every dimension has room, not paced (paced by estimates above the real
// costs, a fleet would go slower than its limits); a cost that would come
// later than the margin is refused, told the earliest time it could have,
// nothing taken, however long its caller can wait; a give-back makes room
// at once.
func TestBudgetPlacesCostsJustInTimeUnpaced(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	const iv, margin = 10 * time.Second, 10 * time.Millisecond
	b := newBudget(t, rdb, "jit", llmDims(3, 1000, iv), WithArrivalMargin(margin))
	f := onFakeClock(t, rdb, b)
	f.set(start)
	var big costPlace
	for i, c := range []throttle.Cost{{"requests": 1}, {"requests": 1, "tokens": 600}, {"tokens": 400}} {
		p := placeCost(t, b, "", c, throttle.Forever)
		if !p.d.Granted || p.at != start {
			t.Fatalf("take %d at an idle key = %+v, want placed now", i+1, p)
		}
		if i == 1 {
			big = p
		}
	}
	// The tokens are spent: a cost of tokens is told when the first of
	// them stop counting, nothing taken, however long it can wait.
	want := start + (iv + margin).Microseconds()
	if p := placeCost(t, b, "", throttle.Cost{"tokens": 100}, throttle.Forever); p.d.Granted || p.at != want {
		t.Fatalf("100 tokens with the tokens spent = %+v, want told %d, nothing placed", p, want)
	}
	if p := placeCost(t, b, "", throttle.Cost{"requests": 1}, 0); !p.d.Granted || p.at != start {
		t.Fatalf("a request, the refusals having taken nothing = %+v, want placed now", p)
	}
	// A give-back makes room at once.
	settle(t, big.d, throttle.Cost{"tokens": -200})
	if p := placeCost(t, b, "", throttle.Cost{"tokens": 200}, 0); !p.d.Granted || p.at != start {
		t.Fatalf("200 tokens after 200 given back = %+v, want placed now", p)
	}
}

// TestBudgetPlacesAtMostEachLimitInAnySpan: three instances (each its own
// client, as processes would have) take costs of one key with mixed waits
// (none, short, long, Forever), the requests binding at times and the
// tokens at others (their intervals differ), and settle many of their
// grants at once: giving back part of the tokens or the request, or
// charging more tokens. A caller told a time within its wait moves the
// server's clock (set by the test) there and asks again, as a Limiter's
// caller sleeps until then. Every place lies within its take's wait and
// the margin, and in each dimension the places hold at most the limit,
// net of what their grants gave back, in any span of its interval plus
// the margin, exactly; the charges come on top.
func TestBudgetPlacesAtMostEachLimitInAnySpan(t *testing.T) {
	srv := redisenv.New(t)
	const margin = 5 * time.Millisecond
	dims := []Dimension{{Name: "requests", Limit: 10, Interval: 200 * time.Millisecond}, {Name: "tokens", Limit: 100, Interval: 300 * time.Millisecond}}
	var budgets []*Budget
	var clock fakeClock
	for range 3 {
		b := newBudget(t, srv.Client(), "places", dims, WithArrivalMargin(margin))
		clock = onFakeClock(t, srv.Client(), b)
		budgets = append(budgets, b)
	}
	waits := []time.Duration{0, 20 * time.Millisecond, 150 * time.Millisecond, time.Second, throttle.Forever}
	var mu sync.Mutex
	now := start // the server's clock, moved forward only
	clock.set(now)
	// wait moves the clock to at, a time a caller was told, if it is
	// later than the clock's.
	wait := func(at int64) {
		mu.Lock()
		defer mu.Unlock()
		if at > now {
			now = at
			clock.set(now)
		}
	}
	var reqs, toks []unit
	bound := map[int64]int{} // refusals by the limit that bound
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 40 {
				c := throttle.Cost{"requests": 1, "tokens": rng.Int64N(6)}
				if rng.IntN(5) == 0 {
					c = throttle.Cost{"tokens": 1 + rng.Int64N(60)}
				}
				w := waits[rng.IntN(len(waits))]
				p := placeCost(t, budgets[g%3], "", c, w)
				if !p.d.Granted {
					mu.Lock()
					bound[p.d.Limit]++
					mu.Unlock()
					if p.d.Remaining < 0 || w != throttle.Forever && p.at-p.now > w.Microseconds() {
						continue
					}
					wait(p.at) // told a time within the wait: asks again then
					if p = placeCost(t, budgets[g%3], "", c, w); !p.d.Granted {
						continue
					}
				}
				if p.at-p.now > margin.Microseconds() || w != throttle.Forever && p.at-p.now > w.Microseconds() {
					t.Errorf("a place %v after the take, beyond the margin or its wait %v", time.Duration(p.at-p.now)*time.Microsecond, w)
				}
				back := throttle.Cost{}
				switch rng.IntN(6) {
				case 0, 1:
					back["tokens"] = -rng.Int64N(c["tokens"] + 1)
				case 2:
					back["tokens"] = 1 + rng.Int64N(10) // charged: on top
				case 3:
					back["requests"] = -c["requests"]
				}
				if len(back) > 0 {
					settle(t, p.d, back)
				}
				mu.Lock()
				if n := c["requests"] + min(back["requests"], 0); c["requests"] > 0 {
					reqs = append(reqs, unit{p.at, n})
				}
				toks = append(toks, unit{p.at, c["tokens"] + min(back["tokens"], 0)})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(reqs) < 30 || bound[10] == 0 || bound[100] == 0 {
		t.Fatalf("%d costs placed, refusals by the limit that bound %v: the test asked too little to judge both dimensions", len(toks), bound)
	}
	judgeUnits(t, "requests", reqs, 10, dims[0].Interval+margin)
	judgeUnits(t, "tokens", toks, 100, dims[1].Interval+margin)
}

// TestBudgetSettleUpDelaysNextGrant: a charge beyond the estimate counts
// in its grant's entry: the next place waits until that entry stops
// counting, an interval and the margin after the grant's place (however
// large the charge, one interval: a provider counting a window of the
// interval sees it leave then). A Limiter's caller that can wait is told
// that time, sleeps it out and is placed then: two script calls, no
// polling.
func TestBudgetSettleUpDelaysNextGrant(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	const iv, margin = time.Second, 10 * time.Millisecond
	b := newBudget(t, rdb, "debt", llmDims(10, 100, iv), WithArrivalMargin(margin))
	g := placeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 100}, 0)
	settle(t, g.d, throttle.Cost{"tokens": 150}) // used 250
	if r := placeCost(t, b, "", throttle.Cost{"tokens": 1}, 0); r.d.Granted || r.d.Remaining != 0 || r.at != g.at+(iv+margin).Microseconds() {
		t.Fatalf("a token after a charge of 150 = %+v, want refused until %d, 0 left", r, g.at+(iv+margin).Microseconds())
	}
	next := placeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 1}, throttle.Forever)
	if next.d.Granted || next.at != g.at+(iv+margin).Microseconds() {
		t.Fatalf("take after a charge of 150 = %+v, want told when the charged entry stops counting (%d)", next, g.at+(iv+margin).Microseconds())
	}
	calls := &budgetCalls{}
	rdb.AddHook(calls)
	// A margin wide enough for a loaded machine's wake-up after the sleep.
	b2 := newBudget(t, rdb, "debt-wait", llmDims(10, 100, 100*time.Millisecond), WithArrivalMargin(50*time.Millisecond))
	settle(t, takeCost(t, b2, "", throttle.Cost{"tokens": 100}), throttle.Cost{"tokens": 250})
	lim := throttle.New(b2)
	t.Cleanup(func() { lim.Close() })
	before := calls.n.Load()
	if _, err := lim.AcquireCost(context.Background(), throttle.Cost{"tokens": 60}, 2*time.Second); err != nil {
		t.Fatalf("AcquireCost after the charge = %v", err)
	}
	if n := calls.n.Load() - before; n != 2 {
		t.Fatalf("AcquireCost made %d script calls, want 2 (told when the charge stops counting, slept out, placed then)", n)
	}
}

// TestBudgetSettleDownGivesBackToItsEntry: what an over-estimate did not
// use can be taken again at once while its grant still counts, never
// above the limit.
func TestBudgetSettleDownGivesBackToItsEntry(t *testing.T) {
	srv := redisenv.New(t)
	b := newBudget(t, srv.Client(), "down", llmDims(10, 100, time.Minute))
	first := takeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 100})
	if d := takeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 50}); d.Granted {
		t.Fatalf("take with no tokens left = %+v", d)
	}
	settle(t, first, throttle.Cost{"tokens": -60}) // used 40 of 100
	d := takeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 50})
	if !d.Granted || d.Remaining != 10 {
		t.Fatalf("take after giving back 60 = %+v, want granted with 10 tokens left", d)
	}
	// A give-back never returns more than its grant took (1 request, 50
	// tokens): 9 requests and 60 tokens are left.
	settle(t, d, throttle.Cost{"tokens": -1000, "requests": -1000})
	if d := takeCost(t, b, "", throttle.Cost{"requests": 9, "tokens": 60}); !d.Granted || d.Remaining != 0 {
		t.Fatalf("take of what is left after a large give-back = %+v, want granted with 0 left", d)
	}
	if d := takeCost(t, b, "", throttle.Cost{"tokens": 1}); d.Granted {
		t.Fatalf("a token beyond the limit was granted: %+v", d)
	}
	// The grant's Settle charges actual-estimated: here it gives back.
	lim := throttle.New(b)
	t.Cleanup(func() { lim.Close() })
	ctx := context.Background()
	k := lim.Key("lim")
	g, err := k.AcquireCost(ctx, throttle.Cost{"requests": 1, "tokens": 30}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.AcquireCost(ctx, throttle.Cost{"tokens": 70}, 0); err != nil {
		t.Fatal(err)
	}
	if err := g.Settle(ctx, throttle.Cost{"requests": 1, "tokens": 5}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.AcquireCost(ctx, throttle.Cost{"tokens": 25}, 0); err != nil {
		t.Fatalf("AcquireCost of the 25 given back = %v", err)
	}
	if _, err := k.AcquireCost(ctx, throttle.Cost{"tokens": 1}, 0); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("AcquireCost beyond = %v, want ErrTimeout", err)
	}
}

// TestBudgetClusterOneSlotPerKey: a budget's keys share one slot, and
// takes and settles run on a real cluster without CROSSSLOT.
func TestBudgetClusterOneSlotPerKey(t *testing.T) {
	t.Parallel()
	cl := redisenv.NewCluster(t)
	rdb := cl.Client()
	ctx := context.Background()
	b := newBudget(t, rdb, "cluster{x}", llmDims(5, 50, time.Minute))
	for _, key := range []string{"", "tenant-1", "tenant-2", "{t}"} {
		keys, err := b.keys(key)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys[1:] {
			if s0, s := rdb.ClusterKeySlot(ctx, keys[0]).Val(), rdb.ClusterKeySlot(ctx, k).Val(); s0 != s {
				t.Errorf("key %q: %s in slot %d, %s in slot %d", key, keys[0], s0, k, s)
			}
		}
		d := takeCost(t, b, key, throttle.Cost{"requests": 5, "tokens": 50})
		if !d.Granted {
			t.Fatalf("key %q: take = %+v", key, d)
		}
		settle(t, d, throttle.Cost{"tokens": -10})
		if d := takeCost(t, b, key, throttle.Cost{"requests": 1}); d.Granted {
			t.Errorf("key %q: a 6th request was granted", key)
		}
	}
}

// TestBudgetRefusesBadInput: bad dimensions, costs and deltas are refused
// with an error naming the field, before anything is sent.
func TestBudgetRefusesBadInput(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	calls := &budgetCalls{}
	rdb.AddHook(calls)
	sec := time.Second
	nb := func(dims []Dimension, opts ...BudgetOption) error {
		_, err := NewBudget(rdb, "bad", dims, opts...)
		return err
	}
	b := newBudget(t, rdb, "bad", llmDims(5, 50, sec))
	ctx := context.Background()
	take := func(c throttle.Cost) error { _, err := b.TakeCost(ctx, "", c, 0); return err }
	many := make([]Dimension, maxDimensions+1)
	for i := range many {
		many[i] = Dimension{Name: strings.Repeat("d", i+1), Limit: 1, Interval: sec}
	}
	tests := []struct {
		name  string
		err   error
		field string
	}{
		{"no dimensions", nb(nil), "dims"},
		{"too many", nb(many), "dims"},
		{"empty name", nb([]Dimension{{Name: "", Limit: 1, Interval: sec}}), "dims[0].Name"},
		{"long name", nb([]Dimension{{Name: strings.Repeat("n", 65), Limit: 1, Interval: sec}}), "dims[0].Name"},
		{"duplicate name", nb([]Dimension{{Name: "a", Limit: 1, Interval: sec}, {Name: "a", Limit: 2, Interval: sec}}), "dims[1].Name"},
		{"zero limit", nb([]Dimension{{Name: "a", Limit: 0, Interval: sec}}), "dims[0].Limit"},
		{"huge limit", nb([]Dimension{{Name: "a", Limit: 1 << 51, Interval: sec}}), "dims[0].Limit"},
		{"zero interval", nb([]Dimension{{Name: "a", Limit: 1, Interval: 0}}), "dims[0].Interval"},
		{"Forever interval", nb([]Dimension{{Name: "a", Limit: 1, Interval: throttle.Forever}}), "dims[0].Interval"},
		{"margin not below the shortest interval", nb([]Dimension{{Name: "a", Limit: 1, Interval: sec}, {Name: "b", Limit: 1, Interval: 10 * time.Millisecond}}, WithArrivalMargin(10*time.Millisecond)), "WithArrivalMargin"},
		{"negative margin", nb(llmDims(1, 1, sec), WithArrivalMargin(-time.Millisecond)), "WithArrivalMargin"},
		{"empty cost", take(throttle.Cost{}), "cost"},
		{"zero cost", take(throttle.Cost{"tokens": 0}), "cost"},
		{"negative amount", take(throttle.Cost{"tokens": -1, "requests": 1}), `cost["tokens"]`},
		{"unknown dimension", take(throttle.Cost{"tokenz": 1}), `cost["tokenz"]`},
		{"unknown in settle", b.settle(ctx, "", nil, throttle.Cost{"tokenz": 1}), `delta["tokenz"]`},
		{"huge settle", b.settle(ctx, "", nil, throttle.Cost{"tokens": 1 << 51}), `delta["tokens"]`},
		{"settle-up of more than ten limits", b.settle(ctx, "", nil, throttle.Cost{"tokens": 501}), `delta["tokens"]`},
		{"long key", func() error {
			_, err := b.TakeCost(ctx, strings.Repeat("k", MaxKeyLen+1), throttle.Cost{"tokens": 1}, 0)
			return err
		}(), "key"},
		{"Take of 0", func() error { _, err := b.Take(ctx, "", 0, 0); return err }(), "n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !errors.Is(tt.err, throttle.ErrInvalid) {
				t.Fatalf("err = %v, want one wrapping throttle.ErrInvalid", tt.err)
			}
			if !strings.Contains(tt.err.Error(), tt.field+" = ") {
				t.Fatalf("err = %q, want it to name %q", tt.err, tt.field)
			}
		})
	}
	if err := take(throttle.Cost{"tokens": 51}); !errors.Is(err, throttle.ErrExceedsLimit) || !strings.Contains(err.Error(), `"tokens"`) {
		t.Errorf("take above a limit = %v, want ErrExceedsLimit naming the dimension", err)
	}
	if err := b.settle(ctx, "", nil, throttle.Cost{"tokens": 0}); err != nil {
		t.Errorf("Settle of nothing = %v", err)
	}
	if n := calls.n.Load(); n != 0 {
		t.Errorf("%d script calls sent for bad input, want 0", n)
	}
}

// TestBudgetRefusedTakeTakesNothing: a take whose earliest place is
// beyond its wait leaves every dimension's schedule as it was.
func TestBudgetRefusedTakeTakesNothing(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	b := newBudget(t, rdb, "refused", llmDims(3, 100, time.Minute))
	for range 3 {
		takeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 10})
	}
	lists := func() [][]string {
		var out [][]string
		for _, k := range b.rootKeys[2:] {
			l, err := rdb.LRange(ctx, k, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, l)
		}
		return out
	}
	before := lists()
	for _, c := range []throttle.Cost{{"requests": 1}, {"requests": 1, "tokens": 1}, {"tokens": 71}} {
		if p := placeCost(t, b, "", c, time.Second); p.d.Granted {
			t.Fatalf("take of %v placed at %d with the key full for a minute", c, p.at)
		}
	}
	if after := lists(); !slices.EqualFunc(before, after, slices.Equal) {
		t.Fatalf("refused takes changed the schedules: %q, then %q", before, after)
	}
}

// answeredCosts is a Budget that records each TakeCost's decision, when
// it was asked and when answered.
type answeredCosts struct {
	*Budget
	mu  sync.Mutex
	ans []answeredCost
}

type answeredCost struct {
	d         throttle.Decision
	asked, at time.Time
}

func (b *answeredCosts) TakeCost(ctx context.Context, key string, c throttle.Cost, maxWait time.Duration) (throttle.Decision, error) {
	asked := time.Now()
	d, err := b.Budget.TakeCost(ctx, key, c, maxWait)
	b.mu.Lock()
	b.ans = append(b.ans, answeredCost{d, asked, time.Now()})
	b.mu.Unlock()
	return d, err
}

// TestBudgetAcquireCostSleepsWithoutPolling: a caller that can wait is
// told the time its cost fits, sleeps until then with no script call in
// between, and is placed when it asks again; one whose wait ends first
// fails at once. One call more is the Limiter's rule, not polling, when
// a grant's caller ran again past the grant's time and margin (a busy
// machine): such a grant is not used, and the caller asks anew.
func TestBudgetAcquireCostSleepsWithoutPolling(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	// Loaded first, so that no NOSCRIPT reload adds to the count.
	if err := scriptBudget.Load(context.Background(), rdb).Err(); err != nil {
		t.Fatal(err)
	}
	calls := &budgetCalls{}
	rdb.AddHook(calls)
	const iv, margin = 100 * time.Millisecond, 10 * time.Millisecond
	b := &answeredCosts{Budget: newBudget(t, rdb, "nopoll", llmDims(1, 100, iv), WithArrivalMargin(margin))}
	lim := throttle.New(b)
	t.Cleanup(func() { lim.Close() })
	ctx := context.Background()
	cost := throttle.Cost{"requests": 1, "tokens": 10}
	if _, err := lim.AcquireCost(ctx, cost, 0); err != nil {
		t.Fatal(err)
	}
	// Beyond the wait: ErrTimeout at once, without sleeping.
	if _, err := lim.AcquireCost(ctx, cost, time.Millisecond); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("AcquireCost with a wait shorter than the time its cost fits = %v, want ErrTimeout", err)
	}
	before, from := calls.n.Load(), len(b.ans)
	if _, err := lim.AcquireCost(ctx, cost, throttle.Forever); err != nil {
		t.Fatalf("AcquireCost that can wait = %v", err)
	}
	n := calls.n.Load() - before
	late := 0 // grants whose caller asked again past their time and margin
	for i := from; i+1 < len(b.ans); i++ {
		if a := b.ans[i]; a.d.Granted && !b.ans[i+1].asked.Before(a.at.Add(a.d.Delay+a.d.Margin)) {
			late++
		}
	}
	if late > 0 {
		t.Logf("%d grant(s) whose caller asked again past their time and margin: %+v", late, b.ans[from:])
	}
	if n != 2+int64(late) {
		t.Fatalf("%d script calls for a cost that waited, want 2 (told its time, placed then) and %d for grants used late: %+v", n, late, b.ans[from:])
	}
}

// TestBudgetFailurePolicy: with the store down, AcquireCost grants under
// FailOpen, refuses under FailClosed and FailLocal, saying why.
func TestBudgetFailurePolicy(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1, DialerRetryTimeout: time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	b := newBudget(t, rdb, "dead", llmDims(10, 100, time.Minute))
	ctx := context.Background()
	cost := throttle.Cost{"requests": 1, "tokens": 10}
	for _, tc := range []struct {
		policy throttle.FailurePolicy
		says   string
	}{{throttle.FailOpen, ""}, {throttle.FailClosed, "FailClosed"}, {throttle.FailLocal, "FailLocal"}} {
		lim := throttle.New(b, throttle.WithFailurePolicy(tc.policy))
		g, err := lim.AcquireCost(ctx, cost, time.Second)
		if err == nil {
			// A FailOpen grant charged nothing: its Settle does nothing.
			if serr := g.Settle(ctx, throttle.Cost{"tokens": 1}); serr != nil {
				t.Errorf("%v: Settle of a grant of the failure policy = %v, want nil", tc.policy, serr)
			}
		}
		lim.Close()
		var be *throttle.BackendError
		switch {
		case tc.says == "" && err != nil:
			t.Errorf("%v: AcquireCost = %v, want granted", tc.policy, err)
		case tc.says != "" && (!errors.As(err, &be) || !strings.Contains(err.Error(), tc.says)):
			t.Errorf("%v: AcquireCost = %v, want a refusal wrapping the BackendError and naming %s", tc.policy, err, tc.says)
		}
	}
	var be *throttle.BackendError
	if _, err := b.TakeCost(ctx, "", cost, 0); !errors.As(err, &be) || be.Op != "take" || !strings.HasSuffix(be.Key, ":budget:requests") {
		t.Errorf("TakeCost with the store down = %v, want a *throttle.BackendError of op take on the budget's key", err)
	}
	if err := b.settle(ctx, "", nil, throttle.Cost{"tokens": 5}); !errors.As(err, &be) || be.Op != "settle" {
		t.Errorf("Settle with the store down = %v, want a *throttle.BackendError of op settle", err)
	}
}

// TestBudgetTakeChargesRequests: Take, the plain Bucket's method, uses the
// dimension named "requests", else the first; its grant's Decision.Cancel
// gives it back (what a Limiter calls for a grant its caller cannot use).
// The Budget takes no refunds: a refund does not say which grant it gives
// back.
func TestBudgetTakeChargesRequests(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b := newBudget(t, srv.Client(), "plain", []Dimension{{Name: "tokens", Limit: 100, Interval: time.Minute}, {Name: "requests", Limit: 5, Interval: time.Minute}})
	if d, err := b.Take(ctx, "", 3, 0); err != nil || !d.Granted || d.Limit != 5 || d.Remaining != 2 {
		t.Fatalf("Take(3) = %+v, %v; want 3 of the 5 requests", d, err)
	}
	d, err := b.Take(ctx, "", 2, 0)
	if err != nil || !d.Granted || d.Remaining != 0 || d.Cancel == nil {
		t.Fatalf("Take(2) = %+v, %v; want the last 2 requests, with a Cancel", d, err)
	}
	if err := d.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := throttle.BucketAs[throttle.Refunder](b); ok {
		t.Fatal("the Budget offers refunds")
	}
	lim := throttle.New(b)
	t.Cleanup(func() { lim.Close() })
	if err := lim.AcquireN(ctx, 3, 0); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("AcquireN(3) with 2 left = %v, want ErrTimeout", err)
	}
	if err := lim.AcquireN(ctx, 2, 0); err != nil {
		t.Fatalf("AcquireN(2) of the 2 cancelled = %v", err)
	}
	if err := lim.Acquire(ctx, 0); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("a 6th request = %v, want ErrTimeout", err)
	}
	if d := takeCost(t, b, "", throttle.Cost{"tokens": 100}); !d.Granted {
		t.Fatalf("the tokens were charged by Take: %+v", d)
	}
	first := newBudget(t, srv.Client(), "plain-first", []Dimension{{Name: "points", Limit: 7, Interval: time.Minute}, {Name: "cost", Limit: 100, Interval: time.Minute}})
	if d, err := first.Take(ctx, "", 1, 0); err != nil || d.Limit != 7 || d.Remaining != 6 {
		t.Fatalf("Take(1) without a requests dimension = %+v, %v; want the first dimension's", d, err)
	}
	if _, err := b.Take(ctx, "", 6, 0); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Fatalf("Take(6) of 5 requests = %v, want ErrExceedsLimit", err)
	}
}

// TestBudgetCountsALostScheduleFull: after Redis loses a key's schedules
// (FLUSHALL, what an empty restart leaves), or one dimension's alone (its
// key deleted), an instance that was given places there counts each lost
// dimension's limit at the latest end it knows, so the key's next places
// in it come an interval after it: the lost places and the new ones never
// exceed a limit in one span.
func TestBudgetCountsALostScheduleFull(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	const iv, margin = 300 * time.Millisecond, 5 * time.Millisecond
	b := newBudget(t, rdb, "lost", llmDims(4, 100, iv), WithArrivalMargin(margin))
	clock := onFakeClock(t, rdb, b) // the server's clock, set by the test
	now := start
	clock.set(now)
	var reqs, toks []unit
	// take places c, moving the clock to the time it is told, if any, as
	// a caller that can wait sleeps until then and asks again.
	take := func(c throttle.Cost) costPlace {
		t.Helper()
		p := placeCost(t, b, "", c, throttle.Forever)
		if !p.d.Granted {
			now = p.at
			clock.set(now)
			p = placeCost(t, b, "", c, throttle.Forever)
		}
		if !p.d.Granted || p.at != now {
			t.Fatalf("take of %v with no bound on the wait, asked again when told: %+v, want placed now (%d)", c, p, now)
		}
		reqs = append(reqs, unit{p.at, c["requests"]})
		toks = append(toks, unit{p.at, c["tokens"]})
		return p
	}
	for range 4 {
		take(throttle.Cost{"requests": 1, "tokens": 10})
	}
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	clock.set(now) // the flush took the clock too
	for range 8 {
		take(throttle.Cost{"requests": 1, "tokens": 10})
	}
	// The tokens' schedule alone lost: the tokens are held, not the
	// requests.
	last := take(throttle.Cost{"tokens": 90})
	if err := rdb.Del(ctx, b.rootKeys[3]).Err(); err != nil {
		t.Fatal(err)
	}
	if p := placeCost(t, b, "", throttle.Cost{"tokens": 1}, throttle.Forever); p.d.Granted || p.at != last.at+(iv+margin).Microseconds() {
		t.Fatalf("a token after its schedule was lost = %+v, want told when the known end stops counting (%d)", p, last.at+(iv+margin).Microseconds())
	}
	judgeUnits(t, "requests", reqs, 4, iv+margin)
	judgeUnits(t, "tokens", toks, 100, iv+margin)
	// Another instance, which knew nothing, finds the tokens held too.
	other := newBudget(t, rdb, "lost", llmDims(4, 100, iv), WithArrivalMargin(margin))
	onFakeClock(t, rdb, other)
	if p := placeCost(t, other, "", throttle.Cost{"tokens": 1}, 0); p.d.Granted {
		t.Fatalf("another instance was granted a token in the held span: %+v", p)
	}
}

// TestBudgetConcurrentTakersStayWithinLimits: concurrent takers and
// settlers, each counting what it was granted and gave back, never get
// more than each dimension's limit in one period, net of give-backs.
func TestBudgetConcurrentTakersStayWithinLimits(t *testing.T) {
	srv := redisenv.New(t)
	const requests, tokens, maxEst = 60, 1500, 60
	b := newBudget(t, srv.Client(), "concurrent", llmDims(requests, tokens, time.Minute))
	var granted, givenBack [2]atomic.Int64 // requests, tokens
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			refused := 0
			for range 200 { // bounded: the budget runs out long before
				est := 1 + rng.Int64N(maxEst)
				d, err := b.TakeCost(context.Background(), "", throttle.Cost{"requests": 1, "tokens": est}, 0)
				if err != nil {
					t.Error(err)
					return
				}
				if !d.Granted {
					if refused++; refused > 20 {
						return
					}
					continue
				}
				granted[0].Add(1)
				granted[1].Add(est)
				if back := rng.Int64N(est); back > 0 && rng.IntN(2) == 0 {
					if err := d.Settle(context.Background(), throttle.Cost{"tokens": -back}); err != nil {
						t.Error(err)
						return
					}
					givenBack[1].Add(back)
				}
			}
		}()
	}
	wg.Wait()
	net := [2]int64{granted[0].Load() - givenBack[0].Load(), granted[1].Load() - givenBack[1].Load()}
	if net[0] > requests || net[1] > tokens {
		t.Fatalf("net granted %v in one period, limits [%d %d]", net, requests, tokens)
	}
	if net[0] < requests && net[1] <= tokens-maxEst {
		t.Fatalf("net granted %v: neither dimension was spent (limits [%d %d]); the test proves nothing", net, requests, tokens)
	}
}

// TestBudgetPauseHoldsEveryDimension: a pause refuses every cost of the
// key until it ends, and AcquireCost waits it out.
func TestBudgetPauseHoldsEveryDimension(t *testing.T) {
	srv := redisenv.New(t)
	b := newBudget(t, srv.Client(), "pause", llmDims(10, 100, time.Minute))
	ctx := context.Background()
	if err := b.Pause(ctx, "", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	d := takeCost(t, b, "", throttle.Cost{"tokens": 1})
	if d.Granted || d.Delay < 9*time.Second || d.Delay > 10*time.Second {
		t.Fatalf("paused take = %+v, want refused for the pause's ~10s", d)
	}
	if d := takeCost(t, b, "elsewhere", throttle.Cost{"tokens": 1}); !d.Granted {
		t.Fatalf("another key is paused: %+v", d)
	}
	lim := throttle.New(b)
	t.Cleanup(func() { lim.Close() })
	if _, err := lim.AcquireCost(ctx, throttle.Cost{"requests": 1}, 0); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("AcquireCost with no wait during a pause = %v, want ErrTimeout", err)
	}
}

// TestBudgetPauseDimensionsHoldsOnlyThoseNamed: a pause of one dimension
// refuses the costs that need it, until its own end, and leaves the
// others alone; a dimension the budget does not know pauses the whole
// key (the provider's limit is not kept here: hold everything).
func TestBudgetPauseDimensionsHoldsOnlyThoseNamed(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b := newBudget(t, srv.Client(), "dimpause", llmDims(10, 100, time.Minute))
	if err := b.PauseDimensions(ctx, "", []throttle.Exhausted{{Dimension: "tokens", RetryAfter: 5 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	if d := takeCost(t, b, "", throttle.Cost{"requests": 1}); !d.Granted {
		t.Fatalf("a tokens pause held requests: %+v", d)
	}
	d := takeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 1})
	if d.Granted || d.Delay < 4*time.Second || d.Delay > 5*time.Second {
		t.Fatalf("a cost needing tokens during their pause = %+v, want refused for ~5s", d)
	}
	// A shorter pause does not shorten it.
	if err := b.PauseDimensions(ctx, "", []throttle.Exhausted{{Dimension: "tokens", RetryAfter: time.Second}}); err != nil {
		t.Fatal(err)
	}
	if d := takeCost(t, b, "", throttle.Cost{"tokens": 1}); d.Granted || d.Delay < 4*time.Second {
		t.Fatalf("a shorter pause shortened the longer: %+v", d)
	}
	if err := b.PauseDimensions(ctx, "other", []throttle.Exhausted{{Dimension: "input-tokens", RetryAfter: 5 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	if d := takeCost(t, b, "other", throttle.Cost{"requests": 1}); d.Granted || d.Delay < 4*time.Second {
		t.Fatalf("a pause of a dimension the budget does not know = %+v, want the whole key paused", d)
	}
	if err := b.PauseDimensions(ctx, "", []throttle.Exhausted{{Dimension: "tokens", RetryAfter: -time.Second}}); err != nil {
		t.Fatalf("a pause of 0 or less = %v, want nothing done", err)
	}
	var bad error = b.PauseDimensions(ctx, string(make([]byte, 600)), []throttle.Exhausted{{Dimension: "tokens", RetryAfter: time.Second}})
	if !errors.Is(bad, throttle.ErrInvalid) {
		t.Fatalf("PauseDimensions with a bad key = %v, want ErrInvalid", bad)
	}
}

// A dimension the actual cost does not name is left as estimated: a
// Settle of the tokens alone keeps the request charged.
func TestSettleLeavesADimensionActualDoesNotName(t *testing.T) {
	srv := redisenv.New(t)
	b := newBudget(t, srv.Client(), "unnamed", llmDims(1, 100, time.Minute))
	lim := throttle.New(b)
	t.Cleanup(func() { lim.Close() })
	ctx := context.Background()
	est := throttle.Cost{"requests": 1, "tokens": 50}
	g, err := lim.AcquireCost(ctx, est, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Settle(ctx, throttle.Cost{"tokens": 40}); err != nil {
		t.Fatal(err)
	}
	if d := takeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 1}); d.Granted {
		t.Fatalf("a second request against a limit of 1 = %+v, want refused: the request stays charged", d)
	}
	if d := takeCost(t, b, "", throttle.Cost{"tokens": 60}); !d.Granted {
		t.Fatalf("60 tokens after 40 used of 100 = %+v, want granted: the 10 unused were given back", d)
	}
}

func TestBudgetAcquireCostEndsWhenItsWaitsAreStopped(t *testing.T) {
	srv := redisenv.New(t)
	b := newBudget(t, srv.Client(), "stopped", llmDims(1, 100, time.Minute))
	clock := clockwork.NewFakeClock()
	lim := throttle.New(b, throttle.WithClock(clock))
	t.Cleanup(func() { lim.Close() })
	cost := throttle.Cost{"requests": 1, "tokens": 10}
	if _, err := lim.AcquireCost(context.Background(), cost, 0); err != nil {
		t.Fatal(err)
	}
	gone := errors.New("partition gone")
	stop, end := context.WithCancelCause(context.Background())
	ctx := throttle.ContextWithWaitStop(context.Background(), stop)
	done := make(chan error, 1)
	go func() { _, err := lim.AcquireCost(ctx, cost, throttle.Forever); done <- err }()
	bctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clock.BlockUntilContext(bctx, 1); err != nil {
		t.Fatal(err)
	}
	end(gone)
	if err := <-done; !errors.Is(err, context.Canceled) || !errors.Is(err, gone) {
		t.Fatalf("AcquireCost after its waits were stopped = %v, want context.Canceled naming the stop's cause", err)
	}
	if err := ctx.Err(); err != nil {
		t.Fatalf("the caller's context ended too: %v", err)
	}
}

// TestPerCallKeyTooLongIsThatCallsError: a per-call key too long for the
// store is that call's problem (throttle.ErrInvalidKey, still an
// ErrInvalid), told apart from a bad configuration, which a key too long
// given to the constructor is.
func TestPerCallKeyTooLongIsThatCallsError(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	long := strings.Repeat("k", MaxKeyLen+1)
	b := newBudget(t, srv.Client(), "longkey", llmDims(5, 50, time.Minute))
	tb, err := NewTokenBucket(srv.Client(), "longkey", 5, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lb, lt := throttle.New(b), throttle.New(tb)
	t.Cleanup(func() { lb.Close(); lt.Close() })
	for name, err := range map[string]error{
		"AcquireCost": func() error { _, err := lb.Key(long).AcquireCost(ctx, throttle.Cost{"tokens": 1}, 0); return err }(),
		"Acquire":     lt.Key(long).Acquire(ctx, 0),
		"Pause":       tb.Pause(ctx, long, time.Second),
	} {
		if !errors.Is(err, throttle.ErrInvalidKey) || !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s with a key of %d bytes = %v, want an error matching throttle.ErrInvalidKey and throttle.ErrInvalid", name, len(long), err)
		}
	}
	if _, err := NewBudget(srv.Client(), long, llmDims(5, 50, time.Minute)); !errors.Is(err, throttle.ErrInvalid) || errors.Is(err, throttle.ErrInvalidKey) {
		t.Errorf("NewBudget with a key of %d bytes = %v, want a configuration error: ErrInvalid, not ErrInvalidKey", len(long), err)
	}
}

// slowBudget delays the budget script's calls by delay, as a loaded
// network would, Redis itself being fine.
type slowBudget struct{ delay time.Duration }

func (h *slowBudget) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *slowBudget) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 1 && strings.HasPrefix(strings.ToLower(cmd.Name()), "eval") {
			t := time.NewTimer(h.delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
		}
		return next(ctx, cmd)
	}
}
func (h *slowBudget) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestAcquireCostNearItsDeadlineIsATimeout: a store call cut short by the
// caller's own deadline, Redis healthy, is the wait running out
// (ErrTimeout, and the context's DeadlineExceeded), under every failure
// policy that refuses, not a store failure.
func TestAcquireCostNearItsDeadlineIsATimeout(t *testing.T) {
	srv := redisenv.New(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(&slowBudget{delay: 200 * time.Millisecond})
	b := newBudget(t, rdb, "deadline", llmDims(10, 100, time.Minute))
	for _, policy := range []throttle.FailurePolicy{throttle.FailLocal, throttle.FailClosed} {
		lim := throttle.New(b, throttle.WithFailurePolicy(policy))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		_, err := lim.AcquireCost(ctx, throttle.Cost{"requests": 1, "tokens": 10}, time.Minute)
		cancel()
		lim.Close()
		if !errors.Is(err, throttle.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%v: AcquireCost whose deadline ends during the store call = %v, want ErrTimeout matching context.DeadlineExceeded", policy, err)
		}
	}
}

// TestBudgetGrantGivesBackAtMostWhatItTook: a grant's Decision.Settle
// gives back, over all its calls, at most what the grant took of each
// dimension (plus what it was charged since): settled twice, or with a
// give-back beyond its take, it does not hand its period tokens that
// other grants took.
func TestBudgetGrantGivesBackAtMostWhatItTook(t *testing.T) {
	srv := redisenv.New(t)
	b := newBudget(t, srv.Client(), "at-most", llmDims(10, 100, time.Minute))
	a := takeCost(t, b, "", throttle.Cost{"tokens": 50})
	other := takeCost(t, b, "", throttle.Cost{"tokens": 50})
	settle(t, a, throttle.Cost{"tokens": -50})
	settle(t, a, throttle.Cost{"tokens": -50}) // again: nothing more to give back
	if d := takeCost(t, b, "", throttle.Cost{"tokens": 51}); d.Granted {
		t.Fatalf("take of 51 after one grant of 50 gave back 50 (twice) = %+v, want refused", d)
	}
	settle(t, other, throttle.Cost{"tokens": 20})    // charged: it took 70
	settle(t, other, throttle.Cost{"tokens": -1000}) // gives back its 70 only
	if d := takeCost(t, b, "", throttle.Cost{"tokens": 100}); !d.Granted || d.Remaining != 0 {
		t.Fatalf("take of the whole limit once both grants gave back all they took = %+v, want granted with 0 left", d)
	}
	if d := takeCost(t, b, "", throttle.Cost{"tokens": 1}); d.Granted {
		t.Fatalf("a token beyond the limit was granted: %+v", d)
	}
}

// TestCostGrantRefusedSettleCanBeCorrected: a Settle the budget refuses
// as bad input (a settle-up of more than ten limits: the wrong units)
// charged nothing, and the grant can still be settled with the corrected
// cost: its give-back counts.
func TestCostGrantRefusedSettleCanBeCorrected(t *testing.T) {
	srv := redisenv.New(t)
	b := newBudget(t, srv.Client(), "corrected", llmDims(10, 100, time.Minute))
	lim := throttle.New(b)
	t.Cleanup(func() { lim.Close() })
	ctx := context.Background()
	g, err := lim.AcquireCost(ctx, throttle.Cost{"requests": 1, "tokens": 100}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Settle(ctx, throttle.Cost{"requests": 1, "tokens": 40_000}); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("Settle of 400 limits' tokens = %v, want ErrInvalid", err)
	}
	if err := g.Settle(ctx, throttle.Cost{"requests": 1, "tokens": 40}); err != nil {
		t.Fatalf("Settle with the corrected cost after a refused one = %v, want nil", err)
	}
	if _, err := lim.AcquireCost(ctx, throttle.Cost{"tokens": 60}, 0); err != nil {
		t.Fatalf("AcquireCost of the 60 tokens given back = %v", err)
	}
	if err := g.Settle(ctx, throttle.Cost{"requests": 1, "tokens": 0}); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("a third Settle, after one that counted = %v, want ErrInvalid", err)
	}
}

// TestBudgetSchedulesCountEveryChargeTheyHold: through a random mix of
// takes (waits short and long, some with the cost of one dimension only),
// settles (charges beyond the estimate, give-backs, whole cancellations)
// and schedules that lack an end the instance was given (emptied by a
// restart, or rebuilt by other instances since: the take counts the limit
// at that end), on intervals short enough that
// entries stop counting during the run, each dimension's schedule keeps
// its header's count equal to what its entries hold, its entries in order
// of end, one a slot.
func TestBudgetSchedulesCountEveryChargeTheyHold(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	dims := []Dimension{{Name: "requests", Limit: 10, Interval: 30 * time.Millisecond}, {Name: "tokens", Limit: 1000, Interval: 150 * time.Millisecond}}
	b := newBudget(t, rdb, "counted", dims)
	rng := rand.New(rand.NewPCG(5, 6))
	waits := []time.Duration{0, time.Millisecond, 100 * time.Millisecond, throttle.Forever}
	var held []throttle.Decision // grants that may still be settled
	for range 1500 {
		if rng.IntN(15) == 0 {
			// Lost: the instance was given an end, within an interval
			// from now, that the schedule lacks (emptied, or rebuilt by
			// other instances since).
			if rng.IntN(4) == 0 {
				if err := rdb.Del(context.Background(), b.rootKeys[2:]...).Err(); err != nil {
					t.Fatal(err)
				}
			}
			for i, d := range dims {
				b.ends.note(endsKey("", i), time.Now().UnixMicro()+rng.Int64N(d.Interval.Microseconds()), 0, 0)
			}
		} else if len(held) > 0 && rng.IntN(3) == 0 {
			d := held[rng.IntN(len(held))]
			var err error
			switch rng.IntN(3) {
			case 0:
				err = d.Cancel(context.Background())
			case 1:
				err = d.Settle(context.Background(), throttle.Cost{"tokens": rng.Int64N(2000) - 1000})
			default:
				err = d.Settle(context.Background(), throttle.Cost{"requests": rng.Int64N(20) - 10, "tokens": rng.Int64N(2000) - 1000})
			}
			if err != nil {
				t.Fatal(err)
			}
		} else {
			c := throttle.Cost{"requests": 1 + rng.Int64N(10), "tokens": 1 + rng.Int64N(1000)}
			if rng.IntN(5) == 0 {
				delete(c, "requests")
			}
			d, err := b.TakeCost(context.Background(), "", c, waits[rng.IntN(len(waits))])
			if err != nil {
				t.Fatal(err)
			}
			if d.Granted {
				if held = append(held, d); len(held) > 30 {
					held = held[1:]
				}
			}
		}
		for i, d := range dims {
			scheduleConsistent(t, rdb, b.rootKeys[2+i], d.Interval)
		}
	}
}
