package bucket

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// fakeTimeKey holds, for budget.lua run through fakeTimeBudget, the time
// its TIME answers (µs).
const fakeTimeKey = "headway-test:faketime"

// fakeTimeBudget is budget.lua with its TIME read from fakeTimeKey, so
// that a test sets the server's clock to the microsecond (an entry's
// last one, a step back) on a real redis-server. The scripts' own lines
// are unchanged: a local redis shadows the global for TIME, and for
// PEXPIRE, whose TTLs run on the real clock: they get a minute more.
var fakeTimeBudget = redis.NewScript(`
local real = redis
local redis = setmetatable({call = function(cmd, ...)
  if cmd == 'TIME' then
    local us = tonumber(real.call('GET', '` + fakeTimeKey + `'))
    return {string.format('%d', math.floor(us / 1000000)), string.format('%d', us % 1000000)}
  end
  if cmd == 'PEXPIRE' then
    local k, ms = ...
    return real.call(cmd, k, ms + 60000)
  end
  return real.call(cmd, ...)
end}, {__index = real})
` + srcSchedule + srcBudget)

// fakeClock runs a Budget's script on a server clock set by hand.
type fakeClock struct {
	t   *testing.T
	rdb redis.UniversalClient
}

// onFakeClock makes b run its script on a clock of the test's own on
// rdb, a single server.
func onFakeClock(t *testing.T, rdb redis.UniversalClient, b *Budget) fakeClock {
	b.script = fakeTimeBudget
	return fakeClock{t, rdb}
}

// set sets the server's clock to now (µs).
func (f fakeClock) set(now int64) {
	f.t.Helper()
	if err := f.rdb.Set(context.Background(), fakeTimeKey, now, 0).Err(); err != nil {
		f.t.Fatal(err)
	}
}

// start is where the fake clocks begin, µs.
const start = int64(1_700_000_000_000_000)

// TestBudgetPlacesHoldEveryLimitAtEntryEdges: on the server's clock, to
// the microsecond, the places hold at most each limit, net of what their
// grants gave back, in any span of the interval plus the margin, for
// intervals that are and are not a multiple of the schedule's 256 slots
// (down to 1 ms, a slot of 3 µs), with takes on a slot's first and last
// microsecond, waits of every length, and give-backs and charges to
// grants of every age (still counting or not).
func TestBudgetPlacesHoldEveryLimitAtEntryEdges(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	for _, iv := range []time.Duration{time.Second, 1013 * time.Millisecond, 37 * time.Millisecond, time.Millisecond} {
		t.Run(iv.String(), func(t *testing.T) {
			const reqs, toks = 5, 50
			margin := iv / 10
			dims := []Dimension{{Name: "requests", Limit: reqs, Interval: iv}, {Name: "tokens", Limit: toks, Interval: iv * 3 / 2}}
			b := newBudget(t, rdb, fmt.Sprintf("edges-%v", iv), dims, WithArrivalMargin(margin))
			f := onFakeClock(t, rdb, b)
			rng := rand.New(rand.NewPCG(uint64(iv), 7))
			grid := max(iv.Microseconds()/256, 1)
			now := start
			// A grant's units in each dimension, and what its Settle may
			// still give back (its take and charges, less its give-backs:
			// Decision.Settle cuts a give-back to that).
			type held struct {
				u         *unit
				took, end int64 // end: its entry's, where it was recorded
			}
			type grant struct {
				d    throttle.Decision
				dims [2]held
			}
			var grants []grant
			immediate := 0 // grants placed at once
			var units [2][]*unit
			for n := range 3000 {
				// Phases of demand well above the limits (schedules full
				// and deep, searches long) and about at them.
				step := 2 * iv.Microseconds()
				if n/300%2 == 0 {
					step /= 8
				}
				switch rng.IntN(4) {
				case 0:
					now = (now/grid+1)*grid - 1 // a slot's last µs
				case 1:
					now = (now/grid + 1) * grid // the next slot's first
				case 2:
					now += rng.Int64N(step + 1)
				}
				f.set(now)
				if len(grants) > 0 && rng.IntN(3) == 0 {
					g := &grants[rng.IntN(len(grants))]
					delta := throttle.Cost{}
					for i, h := range g.dims {
						back := -rng.Int64N(h.took + 1)
						if rng.IntN(6) == 0 {
							back = 1 + rng.Int64N(dims[i].Limit/2) // a charge: on top
						}
						delta[dims[i].Name] = back
						// An entry counts until an interval after its end.
						if back < 0 && h.end+dims[i].Interval.Microseconds() > now {
							h.u.n += back
						}
						g.dims[i].took += back
					}
					settle(t, g.d, delta)
					continue
				}
				c := throttle.Cost{"requests": rng.Int64N(3), "tokens": rng.Int64N(toks / 2)}
				if c["requests"]+c["tokens"] == 0 {
					c["requests"] = 1
				}
				// Callers that wait for ever come seldom: each is paced
				// after the last, ahead of a clock that moves in steps.
				wait := []time.Duration{0, 0, iv / 3, iv / 3, 2 * iv, 2 * iv, throttle.Forever}[rng.IntN(7)]
				p := placeCost(t, b, "", c, wait)
				if !p.d.Granted {
					continue
				}
				if p.at == now {
					immediate++
				}
				if p.now != now || wait != throttle.Forever && p.at-now > wait.Microseconds() {
					t.Fatalf("placed at %d, %d after %d: beyond the wait %v", p.at, p.at-now, now, wait)
				}
				g := grant{d: p.d}
				for i, d := range dims {
					g.dims[i] = held{&unit{p.at, c[d.Name]}, c[d.Name], p.ends[i]}
					units[i] = append(units[i], g.dims[i].u)
				}
				grants = append(grants, g)
			}
			t.Logf("%d grants, %d placed at once", len(grants), immediate)
			if len(grants) < 200 || immediate < 50 {
				t.Fatalf("%d grants, %d of them placed at once: the test asked too little", len(grants), immediate)
			}
			judge := func(what string, us []*unit, limit int64, window time.Duration) {
				t.Helper()
				var flat []unit
				for _, u := range us {
					flat = append(flat, *u)
				}
				judgeUnits(t, what, flat, limit, window)
			}
			judge("requests", units[0], reqs, dims[0].Interval+margin)
			judge("tokens", units[1], toks, dims[1].Interval+margin)
		})
	}
}

// TestBudgetClockStepBackKeepsGrantsCounting: when the server's clock
// steps back (an NTP step; a failover to a replica whose clock is
// behind), the places given before the step keep counting until an
// interval after their ends, which the clock stepped back reaches later:
// no place comes before that, so the places before and after the step
// are an interval and the margin apart on the clock they were given on,
// and further apart in real time.
func TestBudgetClockStepBackKeepsGrantsCounting(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	const iv, margin = time.Second, 10 * time.Millisecond
	span := (iv + margin).Microseconds()
	for _, back := range []time.Duration{time.Microsecond, 60 * time.Millisecond, 999 * time.Millisecond, iv + margin, 5 * time.Second} {
		t.Run(back.String(), func(t *testing.T) {
			b := newBudget(t, rdb, "stepback-"+back.String(), llmDims(10, 1000, iv), WithArrivalMargin(margin))
			f := onFakeClock(t, rdb, b)
			f.set(start)
			if p := placeCost(t, b, "", throttle.Cost{"requests": 10, "tokens": 10}, 0); !p.d.Granted || p.at != start {
				t.Fatalf("the first take = %+v, want placed now", p)
			}
			f.set(start - back.Microseconds())
			if p := placeCost(t, b, "", throttle.Cost{"requests": 1}, 0); p.d.Granted || p.at != start+span {
				t.Fatalf("after the clock stepped back %v, a request beyond the 10 placed = %+v, want refused until %d", back, p, start+span)
			}
			if p := placeCost(t, b, "", throttle.Cost{"requests": 1}, throttle.Forever); p.d.Granted || p.at != start+span {
				t.Fatalf("after the clock stepped back %v, a caller that can wait = %+v, want told %d", back, p, start+span)
			}
		})
	}
}

// TestBudgetLateSettles: on the server's clock, to the microsecond, a
// give-back takes from its grant's entry until the last microsecond that
// entry counts, and does nothing from then on (what the grant took no
// longer counts, and giving it to later calls would count it twice); a
// charge adds to the grant's entry while it counts (the next place waits
// until it stops), and counts from the settle's time once it has stopped.
func TestBudgetLateSettles(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	const iv, margin = time.Second, 10 * time.Millisecond
	span := (iv + margin).Microseconds()
	b := newBudget(t, rdb, "late", llmDims(10, 100, iv), WithArrivalMargin(margin))
	f := onFakeClock(t, rdb, b)
	f.set(start)
	g := placeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 100}, 0)
	if !g.d.Granted || g.at != start {
		t.Fatalf("first take = %+v, want placed now", g)
	}
	// Its last microsecond: 30 given back, placed again at once.
	t1 := start + span - 1
	f.set(t1)
	settle(t, g.d, throttle.Cost{"tokens": -30})
	h := placeCost(t, b, "", throttle.Cost{"tokens": 30}, 0)
	if !h.d.Granted || h.at != t1 {
		t.Fatalf("30 tokens given back while their entry counts = %+v, want placed now", h)
	}
	// From then on a give-back does nothing: 70 tokens are left, not 100.
	t2 := start + span + 10_000 // a few slots on
	f.set(t2)
	settle(t, g.d, throttle.Cost{"tokens": -70})
	k := placeCost(t, b, "", throttle.Cost{"tokens": 70}, 0)
	if !k.d.Granted || k.d.Remaining != 0 {
		t.Fatalf("70 tokens after a give-back to an entry that stopped counting = %+v, want placed with 0 left", k)
	}
	// A charge to a grant whose entry counts: the next place waits until
	// that entry stops.
	settle(t, h.d, throttle.Cost{"tokens": 50})
	if p := placeCost(t, b, "", throttle.Cost{"tokens": 1}, throttle.Forever); p.d.Granted || p.at != t1+span {
		t.Fatalf("a token after a charge to a counting entry = %+v, want told when it stops (%d)", p, t1+span)
	}
	// A charge to the first grant, whose entry stopped counting: counted
	// from now, a whole interval.
	settle(t, g.d, throttle.Cost{"requests": 10})
	if p := placeCost(t, b, "", throttle.Cost{"requests": 1}, throttle.Forever); p.d.Granted || p.at != t2+iv.Microseconds() {
		t.Fatalf("a request after a charge of 10 to an entry that stopped counting = %+v, want told an interval after the charge (%d)", p, t2+iv.Microseconds())
	}
}

// TestBudgetLostSchedule: a take that finds a dimension's schedule
// without the latest end its instance was given there (Redis lost it)
// counts the dimension's limit at that end, so nothing more is placed in
// it until an interval after that end; the other dimensions are not held.
// Without a loss (the schedule has the end, or the end stopped counting:
// the instance's knowledge is old) nothing is held. The instance's
// knowledge and the schedules are set by hand, on the server's clock.
func TestBudgetLostSchedule(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	const iv, margin = time.Second, 10 * time.Millisecond
	ivUs := iv.Microseconds()
	cases := []struct {
		name  string
		known int64 // the end of the tokens the instance knows, from now; 0: none
		lost  bool  // the tokens' schedule deleted after the take
		hold  int64 // the place of 1 token, from now: 0 when not held
	}{
		{"restarted empty", -300_000, true, ivUs - 300_000},
		{"nothing known", 0, true, 0},
		{"the known end stopped counting", -ivUs, true, 0},
		{"the known end on record", -300_000, false, 0},
		{"an end further ahead than the record's", 400_000, false, ivUs + 400_000},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newBudget(t, rdb, fmt.Sprintf("lost-%d", i), llmDims(10, 100, iv), WithArrivalMargin(margin))
			f := onFakeClock(t, rdb, b)
			f.set(start - 300_000 - margin.Microseconds())
			if p := placeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 10}, 0); !p.d.Granted {
				t.Fatal(p)
			}
			b.ends = latestEnds{} // what the instance knows is set below
			if tc.known != 0 {
				b.ends.note(endsKey("", 1), start+tc.known, 0, 0)
			}
			if tc.lost {
				if err := rdb.Del(ctx, b.rootKeys[3]).Err(); err != nil {
					t.Fatal(err)
				}
			}
			f.set(start)
			p := placeCost(t, b, "", throttle.Cost{"requests": 1, "tokens": 1}, throttle.Forever)
			if want := start + tc.hold; p.at != want || p.d.Granted != (tc.hold == 0) {
				t.Fatalf("a token = %+v, want placed now or told %d (now + %d)", p, want, tc.hold)
			}
			if tc.hold != 0 {
				if r := placeCost(t, b, "", throttle.Cost{"requests": 1}, 0); !r.d.Granted {
					t.Fatalf("the requests were held too: %+v", r)
				}
			}
		})
	}
}
