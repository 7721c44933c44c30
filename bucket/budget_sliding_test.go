package bucket

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/capability"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// slidingDims are an LLM API's limits counted over a sliding window.
func slidingDims(requests, tokens int64, iv time.Duration) []Dimension {
	return []Dimension{{Name: "requests", Limit: requests, Interval: iv, Sliding: true}, {Name: "tokens", Limit: tokens, Interval: iv, Sliding: true}}
}

// TestBudgetSlidingDimensionHoldsEverySpan: a dimension counted over a
// sliding window grants at most its limit in any span of one interval,
// however the grants fall: a few early in a period, the rest at its end,
// then the next burst. (By periods, the burst at the second period's
// start came right after the first period's late grants: 11 and more
// within 970 ms against 10 per second.)
func TestBudgetSlidingDimensionHoldsEverySpan(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	const iv = time.Second
	b := newBudget(t, srv.Client(), "slidespan", slidingDims(10, 1000, iv))
	lim := throttle.New(b)
	t.Cleanup(func() { lim.Close() })
	var grants []time.Time
	take := func(n int) {
		for range n {
			if _, err := lim.AcquireCost(ctx, throttle.Cost{"requests": 1}, 3*iv); err != nil {
				t.Fatal(err)
			}
			grants = append(grants, time.Now())
		}
	}
	take(1)
	time.Sleep(iv * 8 / 10) // the server's clock: late in the first interval
	take(9)
	take(10) // the next ten: a period-counting budget grants them at the first's end
	// Grants are timed on this side, within a round trip of the server's
	// clock: count each span of the interval less a margin for that.
	span := iv - 30*time.Millisecond
	for i, g := range grants {
		n := 0
		for _, h := range grants[:i+1] {
			if g.Sub(h) < span {
				n++
			}
		}
		if n > 10 {
			t.Fatalf("%d requests granted within %v (by grant %d), limit 10 per %v", n, span, i, iv)
		}
	}
}

// TestBudgetSlidingGiveBackGoesToItsGrantsSlot: an estimate settled down
// while its grant still counts in the window can be granted again; a
// charge beyond it counts in the window too; a give-back once the grant
// has left the window gives nothing (what it took no longer counts).
func TestBudgetSlidingGiveBackGoesToItsGrantsSlot(t *testing.T) {
	srv := redisenv.New(t)
	b := newBudget(t, srv.Client(), "slidegive", slidingDims(100, 100, time.Minute))
	g := takeCost(t, b, "", throttle.Cost{"tokens": 100})
	if !g.Granted {
		t.Fatalf("first take refused: %+v", g)
	}
	if d := takeCost(t, b, "", throttle.Cost{"tokens": 1}); d.Granted {
		t.Fatalf("a token beyond the limit was granted: %+v", d)
	}
	settle(t, g, throttle.Cost{"tokens": -60}) // it used 40
	if d := takeCost(t, b, "", throttle.Cost{"tokens": 60}); !d.Granted {
		t.Fatalf("the 60 given back were not granted again: %+v", d)
	}
	if d := takeCost(t, b, "", throttle.Cost{"tokens": 1}); d.Granted {
		t.Fatalf("more than the 60 given back were granted again: %+v", d)
	}
	h := takeCost(t, b, "", throttle.Cost{"requests": 1})
	settle(t, h, throttle.Cost{"requests": 9}) // charged 10 requests in all
	if d := takeCost(t, b, "", throttle.Cost{"requests": 91}); d.Granted {
		t.Fatalf("the charge beyond the estimate did not count: %+v", d)
	}
	if d := takeCost(t, b, "", throttle.Cost{"requests": 90}); !d.Granted {
		t.Fatalf("the rest of the requests were refused: %+v", d)
	}
}

// TestBudgetSlidingLateGiveBackGivesNothing: a give-back of a grant that
// has left the window frees nothing in it.
func TestBudgetSlidingLateGiveBackGivesNothing(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	const iv = 400 * time.Millisecond
	b := newBudget(t, srv.Client(), "slidelate", slidingDims(10, 100, iv))
	lim := throttle.New(b)
	t.Cleanup(func() { lim.Close() })
	old := takeCost(t, b, "", throttle.Cost{"tokens": 100})
	if !old.Granted {
		t.Fatal(old)
	}
	// The next grant comes once the first left the window.
	if _, err := lim.AcquireCost(ctx, throttle.Cost{"tokens": 100}, 3*iv); err != nil {
		t.Fatal(err)
	}
	settle(t, old, throttle.Cost{"tokens": -100})
	if d := takeCost(t, b, "", throttle.Cost{"tokens": 1}); d.Granted {
		t.Fatalf("a give-back of a grant out of the window was granted again: %+v", d)
	}
}

// TestBudgetSlidingRefusalNamesWhenRoomComes: a refused take's Delay is
// when enough of the window's grants leave it, at most one interval and
// one slot from the take that filled it.
func TestBudgetSlidingRefusalNamesWhenRoomComes(t *testing.T) {
	srv := redisenv.New(t)
	const iv = 10 * time.Second
	b := newBudget(t, srv.Client(), "slidedelay", slidingDims(10, 100, iv))
	if d := takeCost(t, b, "", throttle.Cost{"requests": 10}); !d.Granted {
		t.Fatal(d)
	}
	d := takeCost(t, b, "", throttle.Cost{"requests": 1})
	if d.Granted || d.Delay < iv-time.Second || d.Delay > iv+iv/slidingSlots+10*time.Millisecond {
		t.Fatalf("refused take = %+v, want a Delay of about %v", d, iv)
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
	if err := b.pauseDimensions(ctx, "", []capability.Exhausted{{Dimension: "tokens", RetryAfter: 5 * time.Second}}); err != nil {
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
	if err := b.pauseDimensions(ctx, "", []capability.Exhausted{{Dimension: "tokens", RetryAfter: time.Second}}); err != nil {
		t.Fatal(err)
	}
	if d := takeCost(t, b, "", throttle.Cost{"tokens": 1}); d.Granted || d.Delay < 4*time.Second {
		t.Fatalf("a shorter pause shortened the longer: %+v", d)
	}
	if err := b.pauseDimensions(ctx, "other", []capability.Exhausted{{Dimension: "input-tokens", RetryAfter: 5 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	if d := takeCost(t, b, "other", throttle.Cost{"requests": 1}); d.Granted || d.Delay < 4*time.Second {
		t.Fatalf("a pause of a dimension the budget does not know = %+v, want the whole key paused", d)
	}
	if err := b.pauseDimensions(ctx, "", []capability.Exhausted{{Dimension: "tokens", RetryAfter: -time.Second}}); err != nil {
		t.Fatalf("a pause of 0 or less = %v, want nothing done", err)
	}
	var bad error = b.pauseDimensions(ctx, string(make([]byte, 600)), []capability.Exhausted{{Dimension: "tokens", RetryAfter: time.Second}})
	if !errors.Is(bad, throttle.ErrInvalid) {
		t.Fatalf("PauseDimensions with a bad key = %v, want ErrInvalid", bad)
	}
}

// slidingFullThenFlushed starts a Redis server and an instance of a
// sliding Budget under key (10 requests and 100 tokens per iv), has the
// instance granted the whole requests limit, then FLUSHALLs the server.
// It returns the instance, and newInstance, which makes another instance
// of the same Budget on the same server.
func slidingFullThenFlushed(t *testing.T, key string, iv time.Duration) (b *Budget, newInstance func() *Budget) {
	t.Helper()
	rdb := redisenv.New(t).Client()
	newInstance = func() *Budget { return newBudget(t, rdb, key, slidingDims(10, 100, iv)) }
	b = newInstance()
	if d := takeCost(t, b, "", throttle.Cost{"requests": 10}); !d.Granted {
		t.Fatal(d)
	}
	if err := rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	return b, newInstance
}

// TestBudgetSlidingRestartedEmptyHoldsTheWindow: after FLUSHALL, an
// instance that was granted in the window holds the dimension until the
// window it knows of is empty: no second limit inside it.
func TestBudgetSlidingRestartedEmptyHoldsTheWindow(t *testing.T) {
	const iv = 10 * time.Second
	b, newInstance := slidingFullThenFlushed(t, "slideflush", iv)
	d := takeCost(t, b, "", throttle.Cost{"requests": 1})
	if d.Granted || d.Delay < iv-time.Second {
		t.Fatalf("after the flush = %+v, want refused until the known window is empty (~%v)", d, iv)
	}
	other := newInstance()
	if d := takeCost(t, other, "", throttle.Cost{"requests": 1}); d.Granted {
		t.Fatalf("another instance was granted in the held window: %+v", d)
	}
}

// TestBudgetSlidingRestartedEmptyHoldsAfterAnotherInstancesTake: after
// FLUSHALL, an instance that knew nothing of the window takes first and
// is granted (it cannot know); the instance that was granted the whole
// limit in the window still holds it full until its known end, for
// every instance, as periods do: the only second grants inside the lost
// window are those made before it came.
func TestBudgetSlidingRestartedEmptyHoldsAfterAnotherInstancesTake(t *testing.T) {
	const iv = 10 * time.Second
	knew, newInstance := slidingFullThenFlushed(t, "slideflush2", iv)
	fresh := newInstance()
	if d := takeCost(t, fresh, "", throttle.Cost{"requests": 1}); !d.Granted {
		t.Fatalf("the instance that knew nothing was refused: %+v", d)
	}
	if d := takeCost(t, knew, "", throttle.Cost{"requests": 1}); d.Granted || d.Delay < iv-time.Second {
		t.Fatalf("the instance that knew of the full window = %+v, want refused until it is empty (~%v)", d, iv)
	}
	if d := takeCost(t, fresh, "", throttle.Cost{"requests": 1}); d.Granted {
		t.Fatalf("after the hold, the other instance was granted in the held window: %+v", d)
	}
}
