package bucket

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// fakeTimeKey holds, for budget.lua run through fakeTimeBudget, the time
// its TIME answers (ms).
const fakeTimeKey = "headway-test:faketime"

// fakeTimeBudget is budget.lua with its TIME read from fakeTimeKey, so
// that a test sets the server's clock to the millisecond (a slot's last
// one, a step back) on a real redis-server. The script's own lines are
// unchanged: a local redis shadows the global for TIME, and for PEXPIRE,
// whose TTLs run on the real clock: they get a minute more.
var fakeTimeBudget = redis.NewScript(`
local real = redis
local redis = setmetatable({call = function(cmd, ...)
  if cmd == 'TIME' then
    local ms = tonumber(real.call('GET', '` + fakeTimeKey + `'))
    return {string.format('%.0f', math.floor(ms / 1000)), string.format('%.0f', (ms % 1000) * 1000)}
  end
  if cmd == 'PEXPIRE' then
    -- the keys' TTLs run on the real clock, which this one does not follow
    local k, ms = ...
    return real.call(cmd, k, ms + 60000)
  end
  return real.call(cmd, ...)
end}, {__index = real})
` + srcBudget)

// fakeClock runs b's script on rdb with the server's clock set by hand.
type fakeClock struct {
	t   *testing.T
	rdb redis.UniversalClient
	b   *Budget
}

// run sets the clock to now (ms) and runs the script with mode, mark and
// the amounts of c, telling it the ends b knows.
func (f fakeClock) run(now int64, mode string, mark int64, c throttle.Cost) []int64 {
	f.t.Helper()
	ctx := context.Background()
	if err := f.rdb.Set(ctx, fakeTimeKey, now, 0).Err(); err != nil {
		f.t.Fatal(err)
	}
	args, _, err := f.b.amounts("cost", c, mode == "take", mark, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	args[0] = mode
	f.b.withKnown(args, "")
	keys, err := f.b.keys("")
	if err != nil {
		f.t.Fatal(err)
	}
	r, err := fakeTimeBudget.Run(ctx, f.rdb, keys, args...).Int64Slice()
	if err != nil {
		f.t.Fatalf("budget.lua %s %v at %d: %v", mode, c, now, err)
	}
	if mode == "take" {
		f.b.noteEnds("", r[7:], r[6])
	} else {
		f.b.noteEnds("", r[2:], r[1])
	}
	return r
}

// take asks c at now; it returns whether it was granted and the grant's
// mark (the script's now).
func (f fakeClock) take(now int64, c throttle.Cost) (bool, int64) {
	r := f.run(now, "take", 0, c)
	return r[0] == 1, r[6]
}

// TestBudgetSlidingHoldsEverySpanAtSlotEdges: on the server's clock, to
// the millisecond, a sliding dimension grants at most its limit in every
// span of one interval, aligned to its slots or not, for intervals that
// are and are not a multiple of the 20 slots, with takes falling on a
// slot's first and last millisecond.
func TestBudgetSlidingHoldsEverySpanAtSlotEdges(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	for _, iv := range []int64{1000, 1013, 1019, 37, 20, 7, 1} {
		t.Run(strconv.FormatInt(iv, 10), func(t *testing.T) {
			const limit = 10
			b := newBudget(t, rdb, fmt.Sprintf("edges%d", iv), []Dimension{{Name: "requests", Limit: limit, Interval: time.Duration(iv) * time.Millisecond, Sliding: true}})
			f := fakeClock{t, rdb, b}
			rng := rand.New(rand.NewPCG(uint64(iv), 7))
			width := max(1, iv/slidingSlots)
			now := int64(1_700_000_000_000)
			type grant struct{ at, n int64 }
			var grants []grant
			for range 3000 {
				switch rng.IntN(4) {
				case 0: // the last ms of the slot
					now = (now/width+1)*width - 1
				case 1: // the first ms of the next slot
					now = (now/width + 1) * width
				case 2:
					now += rng.Int64N(iv/4 + 1)
				}
				n := 1 + rng.Int64N(3)
				if ok, _ := f.take(now, throttle.Cost{"requests": n}); ok {
					grants = append(grants, grant{now, n})
				}
			}
			if len(grants) < 50 {
				t.Fatalf("only %d grants: the test asked too little", len(grants))
			}
			for i, g := range grants {
				sum := int64(0)
				for _, h := range grants[:i+1] {
					if g.at-h.at <= iv-1 { // the span [g.at-iv+1, g.at]: iv ms
						sum += h.n
					}
				}
				if sum > limit {
					t.Fatalf("%d granted in the %d ms ending at %d (grant %d), limit %d", sum, iv, g.at, i, limit)
				}
			}
		})
	}
}

// TestBudgetSlidingClockStepBackForgetsNoGrant: when the server's clock
// steps back (an NTP step; a failover to a replica whose clock is
// behind), the grants made on the clock before the step still count: the
// window is not emptied, so the fleet is not granted a second limit
// within one interval.
func TestBudgetSlidingClockStepBackForgetsNoGrant(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	b := newBudget(t, rdb, "stepback", slidingDims(10, 1000, time.Second))
	f := fakeClock{t, rdb, b}
	now := int64(1_700_000_000_000)
	if ok, _ := f.take(now, throttle.Cost{"requests": 10}); !ok {
		t.Fatal("the first take was refused")
	}
	for _, back := range []int64{1, 60, 300, 999, 1500} {
		if ok, _ := f.take(now-back, throttle.Cost{"requests": 1}); ok {
			t.Fatalf("after the clock stepped back %d ms, a request beyond the 10 granted within the interval was granted", back)
		}
	}
	// The clock goes on from where it was, not stopped there: an
	// interval after the grant (on the clock stepped back), room comes
	// back.
	if ok, _ := f.take(now-1500+1100, throttle.Cost{"requests": 10}); !ok {
		t.Fatal("an interval after the grant, on the clock stepped back, the take was refused")
	}
	if ok, _ := f.take(now-1500+1200, throttle.Cost{"requests": 1}); ok {
		t.Fatal("the grant after the step was forgotten")
	}
}
