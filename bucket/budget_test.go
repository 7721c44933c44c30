package bucket

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"
)

// llmDims are an LLM API's limits: requests and tokens per interval.
func llmDims(requests, tokens int64, iv time.Duration) []Dimension {
	return []Dimension{{Name: "requests", Limit: requests, Interval: iv}, {Name: "tokens", Limit: tokens, Interval: iv}}
}

func newBudget(t *testing.T, rdb redis.UniversalClient, key string, dims []Dimension) *Budget {
	t.Helper()
	b, err := NewBudget(rdb, key, dims)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func takeCost(t *testing.T, b *Budget, key string, c throttle.Cost) throttle.Decision {
	t.Helper()
	d, err := b.TakeCost(context.Background(), key, c, 0)
	if err != nil {
		t.Fatalf("TakeCost(%v) = %v", c, err)
	}
	return d
}

// settle corrects the grant d by c.
func settle(t *testing.T, d throttle.Decision, c throttle.Cost) {
	t.Helper()
	if d.Settle == nil {
		t.Fatalf("Settle(%v) of %+v: the decision has no Settle", c, d)
	}
	if err := d.Settle(context.Background(), c); err != nil {
		t.Fatalf("Settle(%v) = %v", c, err)
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
// from the other, and the refusal names the short dimension's refill.
func TestBudgetAllOrNothing(t *testing.T) {
	srv := redisenv.New(t)
	b := newBudget(t, srv.Client(), "aon", llmDims(10, 100, time.Minute))
	if d := takeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 80}); !d.Granted || d.Remaining != 20 || d.Limit != 100 {
		t.Fatalf("first take = %+v, want granted, tokens binding with 20 left of 100", d)
	}
	d := takeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 30})
	if d.Granted || d.Delay < 59*time.Second || d.Delay > time.Minute || d.Limit != 100 || d.Remaining != 20 {
		t.Fatalf("take beyond the tokens = %+v, want refused until the period's end (~1m), tokens binding with 20 left", d)
	}
	// The refused take charged no request: 9 are left, all of them.
	if d := takeCost(t, b, "", throttle.Cost{"requests": 9}); !d.Granted || d.Remaining != 0 {
		t.Fatalf("take of the 9 requests left = %+v, want granted with 0 left", d)
	}
	if d := takeCost(t, b, "", throttle.Cost{"requests": 1}); d.Granted {
		t.Fatalf("an 11th request was granted: %+v", d)
	}
	// A cost that does not name the tokens does not check them.
	if d := takeCost(t, b, "other", throttle.Cost{"requests": 1}); !d.Granted || d.Limit != 10 {
		t.Fatalf("another key's take = %+v, want granted, its own budget", d)
	}
}

// TestBudgetSettleUpDelaysNextGrant: a charge beyond what is left is a
// debt; the next grant waits for the refills that pay it (one limit per
// period), no longer.
func TestBudgetSettleUpDelaysNextGrant(t *testing.T) {
	srv := redisenv.New(t)
	b := newBudget(t, srv.Client(), "debt", llmDims(10, 100, time.Second))
	d := takeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 100})
	settle(t, d, throttle.Cost{"tokens": 150}) // used 250: 150 owed
	// Tokens at -150: the refill at the period's end brings -50, the next
	// one 50, so a grant of 1 comes one period after the period's end.
	d = takeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 1})
	if d.Granted || d.Delay <= time.Second || d.Delay > 2*time.Second {
		t.Fatalf("take after a debt of 150 = %+v, want refused for (1s, 2s]", d)
	}
	// Idle periods pay a debt too: at 250 owed and 100 per period, a grant
	// of 60 comes three periods after the period's end, at the first
	// call then, with no call in between to start those periods.
	rdb := srv.Client()
	calls := &budgetCalls{}
	rdb.AddHook(calls)
	b2 := newBudget(t, rdb, "debt-idle", llmDims(10, 100, 100*time.Millisecond))
	settle(t, takeCost(t, b2, "", throttle.Cost{"tokens": 100}), throttle.Cost{"tokens": 250})
	lim := throttle.New(b2)
	t.Cleanup(func() { lim.Close() })
	before := calls.n.Load()
	if _, err := lim.AcquireCost(context.Background(), throttle.Cost{"tokens": 60}, 2*time.Second); err != nil {
		t.Fatalf("AcquireCost after the debt's refills = %v", err)
	}
	if n := calls.n.Load() - before; n != 2 {
		t.Fatalf("AcquireCost made %d script calls, want 2 (refused with the debt's end, then granted)", n)
	}
}

// TestBudgetSettleDownGivesBackInPeriod: what an over-estimate did not
// use is granted again in the same period, never above the limit.
func TestBudgetSettleDownGivesBackInPeriod(t *testing.T) {
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

// TestBudgetClusterOneSlotPerKey: a budget's keys share one slot, and
// takes and settles run on a real cluster without CROSSSLOT.
func TestBudgetClusterOneSlotPerKey(t *testing.T) {
	cl := redisenv.NewCluster(t)
	rdb := cl.Client()
	ctx := context.Background()
	b := newBudget(t, rdb, "cluster{x}", llmDims(5, 50, time.Minute))
	for _, key := range []string{"", "tenant-1", "tenant-2", "{t}"} {
		keys, err := b.keys(key)
		if err != nil {
			t.Fatal(err)
		}
		if s0, s1 := rdb.ClusterKeySlot(ctx, keys[0]).Val(), rdb.ClusterKeySlot(ctx, keys[1]).Val(); s0 != s1 {
			t.Errorf("key %q: state in slot %d, pause in slot %d", key, s0, s1)
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
	nb := func(dims []Dimension) error { _, err := NewBudget(rdb, "bad", dims); return err }
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
		{"empty cost", take(throttle.Cost{}), "cost"},
		{"zero cost", take(throttle.Cost{"tokens": 0}), "cost"},
		{"negative amount", take(throttle.Cost{"tokens": -1, "requests": 1}), `cost["tokens"]`},
		{"unknown dimension", take(throttle.Cost{"tokenz": 1}), `cost["tokenz"]`},
		{"unknown in settle", b.settle(ctx, "", 1, throttle.Cost{"tokenz": 1}), `delta["tokenz"]`},
		{"huge settle", b.settle(ctx, "", 1, throttle.Cost{"tokens": 1 << 51}), `delta["tokens"]`},
		{"settle-up of more than ten periods' limits", b.settle(ctx, "", 1, throttle.Cost{"tokens": 501}), `delta["tokens"]`},
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
	if err := b.settle(ctx, "", 1, throttle.Cost{"tokens": 0}); err != nil {
		t.Errorf("Settle of nothing = %v", err)
	}
	if n := calls.n.Load(); n != 0 {
		t.Errorf("%d script calls sent for bad input, want 0", n)
	}
}

// TestBudgetAcquireCostSleepsWithoutPolling: refused, AcquireCost sleeps
// on the Limiter's clock until the time the budget named, and asks once
// more then; no script call in between.
func TestBudgetAcquireCostSleepsWithoutPolling(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	// Loaded first, so that no NOSCRIPT reload adds to the count.
	if err := scriptBudget.Load(context.Background(), rdb).Err(); err != nil {
		t.Fatal(err)
	}
	calls := &budgetCalls{}
	rdb.AddHook(calls)
	b := newBudget(t, rdb, "nopoll", llmDims(1, 100, time.Minute))
	clock := clockwork.NewFakeClock()
	lim := throttle.New(b, throttle.WithClock(clock))
	t.Cleanup(func() { lim.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cost := throttle.Cost{"requests": 1, "tokens": 10}
	g, err := lim.AcquireCost(ctx, cost, 0)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	// No deadline on this one: Forever waits on the Limiter's clock alone.
	go func() { _, err := lim.AcquireCost(context.Background(), cost, throttle.Forever); done <- err }()
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if n := calls.n.Load(); n != 2 {
		t.Fatalf("%d script calls before the sleep, want 2", n)
	}
	select {
	case err := <-done:
		t.Fatalf("AcquireCost returned %v while the budget was spent", err)
	default:
	}
	// Give the request back, then let the Limiter's clock reach the end
	// it was told: one more call, granted.
	if err := g.Settle(ctx, throttle.Cost{"requests": 0, "tokens": 0}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	if err := <-done; err != nil {
		t.Fatalf("AcquireCost after the wait = %v", err)
	}
	if n := calls.n.Load(); n != 4 {
		t.Fatalf("%d script calls in all, want 4 (take, refusal, settle, grant)", n)
	}
	// Beyond the wait: ErrTimeout at once, without sleeping.
	if _, err := lim.AcquireCost(ctx, cost, time.Second); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("AcquireCost with a wait shorter than the refill = %v, want ErrTimeout", err)
	}
}

// TestBudgetPauseHoldsEveryDimension: a pause refuses every cost of the
// key until it ends, and AcquireCost waits it out.
func TestBudgetPauseHoldsEveryDimension(t *testing.T) {
	srv := redisenv.New(t)
	b := newBudget(t, srv.Client(), "pause", llmDims(10, 100, time.Minute))
	ctx := context.Background()
	if err := b.pause(ctx, "", 10*time.Second); err != nil {
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
	if _, err := b.TakeCost(ctx, "", cost, 0); !errors.As(err, &be) || be.Op != "take" || !strings.HasSuffix(be.Key, ":budget") {
		t.Errorf("TakeCost with the store down = %v, want a *throttle.BackendError of op take on the budget's key", err)
	}
	if err := b.settle(ctx, "", 1, throttle.Cost{"tokens": 5}); !errors.As(err, &be) || be.Op != "settle" {
		t.Errorf("Settle with the store down = %v, want a *throttle.BackendError of op settle", err)
	}
}

// TestBudgetTakeChargesRequests: Take and Refund, the plain Bucket's
// methods, use the dimension named "requests", else the first.
func TestBudgetTakeChargesRequests(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b := newBudget(t, srv.Client(), "plain", []Dimension{{Name: "tokens", Limit: 100, Interval: time.Minute}, {Name: "requests", Limit: 5, Interval: time.Minute}})
	if d, err := b.Take(ctx, "", 3, 0); err != nil || !d.Granted || d.Limit != 5 || d.Remaining != 2 {
		t.Fatalf("Take(3) = %+v, %v; want 3 of the 5 requests", d, err)
	}
	// Refund does not know the grant's period: it only lessens an
	// inherited debt (there is none), so the period still has 2.
	if err := b.refund(ctx, "", 1); err != nil {
		t.Fatal(err)
	}
	lim := throttle.New(b)
	t.Cleanup(func() { lim.Close() })
	if err := lim.AcquireN(ctx, 3, 0); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("AcquireN(3) after a refund of 1 = %v, want ErrTimeout: a refund of an unknown period adds nothing to this one", err)
	}
	if err := lim.AcquireN(ctx, 2, 0); err != nil {
		t.Fatalf("AcquireN(2) = %v", err)
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

// TestBudgetGiveBackAfterThePeriodOnlyPaysDebt: once a period has ended,
// a give-back reduces what is owed and adds nothing to the next period.
func TestBudgetGiveBackAfterThePeriodOnlyPaysDebt(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b := newBudget(t, srv.Client(), "late", []Dimension{{Name: "requests", Limit: 1, Interval: time.Second}, {Name: "tokens", Limit: 100, Interval: time.Second}})
	first := takeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 100})
	settle(t, first, throttle.Cost{"tokens": 50}) // 50 owed
	// Wait for the end of both periods (they began together): the next
	// request comes then, and takes no token.
	lim := throttle.New(b)
	t.Cleanup(func() { lim.Close() })
	if _, err := lim.AcquireCost(ctx, throttle.Cost{"requests": 1}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	settle(t, first, throttle.Cost{"tokens": -30}) // 20 owed
	// The refill brings 100 less the 20 owed.
	d := takeCost(t, b, "", throttle.Cost{"tokens": 80})
	if !d.Granted || d.Remaining != 0 {
		t.Fatalf("take of 80 after the debt was reduced to 20 = %+v, want granted with 0 left", d)
	}
	// A give-back in the running period is capped at its limit less the
	// debt it inherited.
	settle(t, d, throttle.Cost{"tokens": -1000})
	if d := takeCost(t, b, "", throttle.Cost{"tokens": 80}); !d.Granted || d.Remaining != 0 {
		t.Fatalf("take of the limit less the debt = %+v, want granted with 0 left", d)
	}
	if d := takeCost(t, b, "", throttle.Cost{"tokens": 1}); d.Granted {
		t.Fatalf("a token beyond the limit less the debt was granted: %+v", d)
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
		"Pause":       tb.pause(ctx, long, time.Second),
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

// TestBudgetLateGiveBackStaysInItsPeriod: a call granted in one period
// that settles down after the next began gives nothing to the next: its
// unused estimate belonged to the period that ended. (It gave 100 tokens
// back into the next period, which then granted 200 against 100.)
func TestBudgetLateGiveBackStaysInItsPeriod(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b := newBudget(t, srv.Client(), "lategive", llmDims(10, 100, time.Second))
	lim := throttle.New(b)
	t.Cleanup(func() { lim.Close() })
	est := throttle.Cost{"requests": 1, "tokens": 100}
	g, err := lim.AcquireCost(ctx, est, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The next period: a call waits for it, and is granted in it.
	if _, err := lim.AcquireCost(ctx, throttle.Cost{"tokens": 1}, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	granted := int64(1)
	take := func(n int64) {
		if d := takeCost(t, b, "", throttle.Cost{"tokens": n}); d.Granted {
			granted += n
		}
	}
	take(99)
	// The first call ends now, having used nothing.
	if err := g.Settle(ctx, throttle.Cost{"requests": 1, "tokens": 0}); err != nil {
		t.Fatal(err)
	}
	take(50)
	take(50)
	if granted > 100 {
		t.Fatalf("%d tokens granted in the second period, limit 100: the late give-back went to it", granted)
	}
}

// TestBudgetRestartedEmptyHoldsThePeriod: after FLUSHALL (what a restart
// without persistence leaves), the period the fleet was told of is held
// at 0 until its end: no refill with no period on record grants a second
// limit inside it. The next period starts where the lost one ended.
func TestBudgetRestartedEmptyHoldsThePeriod(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	const period = time.Second
	b := newBudget(t, rdb, "flushed", llmDims(10, 100, period))
	d := takeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 100})
	end := time.Now().Add(d.Reset)
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	d = takeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 100})
	if d.Granted {
		t.Fatalf("after the flush, a second limit of tokens was granted in the lost period: %+v", d)
	}
	if until := time.Until(end); d.Delay > until+5*time.Millisecond || d.Delay < until-250*time.Millisecond {
		t.Fatalf("refused for %v, but the lost period ends in %v", d.Delay, until)
	}
	// Every instance, knowing nothing, finds the period held.
	other := newBudget(t, rdb, "flushed", llmDims(10, 100, period))
	if d := takeCost(t, other, "", throttle.Cost{"tokens": 1}); d.Granted {
		t.Fatalf("another instance was granted in the held period: %+v", d)
	}
	time.Sleep(d.Delay) // the server's clock: the held period must end
	var granted throttle.Decision
	for range 50 { // a retry or two if the sleep ended an instant early
		if granted = takeCost(t, b, "", throttle.Cost{"tokens": 100}); granted.Granted {
			break
		}
		time.Sleep(granted.Delay)
	}
	if !granted.Granted {
		t.Fatalf("after the lost period: %+v; want a fresh period", granted)
	}
	if got := time.Until(end.Add(period)) - granted.Reset; got < -50*time.Millisecond || got > 30*time.Millisecond {
		t.Fatalf("the new period ends %v off the lost period's phase", got)
	}
}

// TestBudgetKeepsALostPeriod: a call from an instance that was told of a
// period still running on the server's clock, meeting a record without
// it, holds the dimension at 0 until that end, for every instance (or,
// when the record's period started inside the lost one, until the
// record's end); a charge holds it too, as a debt. Without a loss (the record has the
// period, or the end the call carries has passed: it was delayed on its
// way) nothing is held. The instance's knowledge and the record are set
// by hand, on the server's clock, so no case waits on it.
func TestBudgetKeepsALostPeriod(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	const period = time.Second
	const none = time.Duration(-1 << 62)
	cases := []struct {
		name     string
		known    time.Duration // the end the instance knows, from the server's now; 0: none
		recorded time.Duration // the end on record, from now; none: no record
		hold     time.Duration // 0: a usual refill
	}{
		{"restarted empty", 600 * time.Millisecond, none, 600 * time.Millisecond},
		{"refill lost", 700 * time.Millisecond, -300 * time.Millisecond, 700 * time.Millisecond},
		{"a call delayed past the end it knew", -20 * time.Millisecond, -20 * time.Millisecond, 0},
		{"a call delayed past the end, restarted empty", -20 * time.Millisecond, none, 0},
		{"the known end within the clock's rounding", time.Millisecond, none, 0},
		{"the record within half a period of the known end", 400 * time.Millisecond, -90 * time.Millisecond, 0},
		{"nothing known", 0, none, 0},
		{"an end further ahead than any period", time.Hour, none, period},
		// An instance that knew nothing refilled after the loss: its
		// period started inside the lost one, and grants nothing more.
		{"a period started inside the lost one", 600 * time.Millisecond, 900 * time.Millisecond, 900 * time.Millisecond},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newBudget(t, rdb, fmt.Sprintf("lost-%d", i), llmDims(10, 100, period))
			keys, err := b.keys("")
			if err != nil {
				t.Fatal(err)
			}
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			at := now.UnixMilli()
			if tc.recorded != none {
				end := at + tc.recorded.Milliseconds()
				if err := rdb.HSet(ctx, keys[0], "t:requests", 3, "e:requests", end, "t:tokens", 30, "e:tokens", end).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if tc.known != 0 {
				end := at + tc.known.Milliseconds()
				b.ends.note("", []int64{end, end}, at)
			}
			d := takeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 20})
			if tc.hold == 0 {
				if !d.Granted || d.Remaining != 80 || d.Reset < period-50*time.Millisecond {
					t.Fatalf("want a usual refill (granted, 80 tokens left, a whole period), got %+v", d)
				}
				return
			}
			// The server's clock moved on since it was read.
			if d.Granted || d.Remaining != 0 || d.Delay > tc.hold+time.Millisecond || d.Delay < tc.hold-250*time.Millisecond {
				t.Fatalf("want a refusal until the lost period's end (%v), got %+v", tc.hold, d)
			}
			// Every instance, knowing nothing, finds the period held.
			other := newBudget(t, rdb, fmt.Sprintf("lost-%d", i), llmDims(10, 100, period))
			if d := takeCost(t, other, "", throttle.Cost{"requests": 1}); d.Granted {
				t.Fatalf("another instance: %+v; want a refusal", d)
			}
		})
	}
	// A charge (a late settle-up) meeting a lost period holds it, and
	// its debt comes on top: paid by the next period's refill.
	b := newBudget(t, rdb, "lost-charge", llmDims(10, 100, period))
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	at := now.UnixMilli()
	b.ends.note("", []int64{at + 500, at + 500}, at)
	if err := b.settle(ctx, "", at-100, throttle.Cost{"tokens": 40}); err != nil {
		t.Fatal(err)
	}
	d := takeCost(t, b, "", throttle.Cost{"tokens": 61})
	if d.Granted || d.Delay < period || d.Delay > period+500*time.Millisecond {
		t.Fatalf("61 tokens after a charge of 40 in a lost period = %+v, want refused until the refill after the next (it brings 60)", d)
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
