package bucket

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/guarantee"
	"github.com/headway-go/headway/internal/redisenv"
)

// TestTokenBucketSlidingBoundKeepsGrantsOfThePeriodBeforeAShortenedOne:
// a period cut short (its tokens key deleted by hand, a caller that was
// told of no period asking next) lasts less than an interval, so a span
// of one interval reaches into the period before it. The next refill must
// not forget that earlier period's grants while they are less than an
// interval old: period 0's nine late grants, period 1's one, then period
// 2 may grant nothing until the nine leave the window.
func TestTokenBucketSlidingBoundKeepsGrantsOfThePeriodBeforeAShortenedOne(t *testing.T) {
	srv := redisenv.New(t)
	retryWhenSlow(t, func(attempt int) (slow bool) {
		return keepsGrantsOfThePeriodBeforeAShortenedOne(t, srv, attempt)
	})
}

// keepsGrantsOfThePeriodBeforeAShortenedOne is one attempt of
// TestTokenBucketSlidingBoundKeepsGrantsOfThePeriodBeforeAShortenedOne on
// a fresh key; slow reports that the machine was too slow for its timing.
func keepsGrantsOfThePeriodBeforeAShortenedOne(t *testing.T, srv *redisenv.Server, attempt int) (slow bool) {
	ctx := context.Background()
	const limit, period = 10, 600 // ms
	b, _, keys := caseBucket(t, srv.Client(), fmt.Sprintf("slide-short-%d", attempt), period*time.Millisecond, 0)

	r := runTBTake(t, b, keys, 1, limit, period)
	if r.status != 1 {
		t.Fatalf("period 0's first take: %+v, want granted", r)
	}
	time.Sleep(time.Duration(r.reset-period/2+period/10) * time.Millisecond) // to 0.6 of period 0 (a boundary on the server's clock)
	r = runTBTake(t, b, keys, limit-1, limit, period)
	if r.status != 1 {
		t.Fatalf("period 0's late take: %+v, want %d granted", r, limit-1)
	}
	late := r.now
	time.Sleep(time.Duration(r.reset+1) * time.Millisecond) // to period 0's end
	r = runTBTake(t, b, keys, 1, limit, period)
	if r.status != 1 {
		t.Fatalf("period 1's first token: %+v, want granted", r)
	}
	// The operator deletes the tokens key; a caller told of no period asks.
	if err := srv.Client().Del(ctx, keys[0]).Err(); err != nil {
		t.Fatal(err)
	}
	r = runTBTake(t, b, keys, limit-1, limit, period)
	if r.now >= late+period {
		t.Logf("attempt %d: the take came %d ms after the late grants, past their interval: too slow to check", attempt, r.now-late)
		return true
	}
	if r.status == 1 {
		t.Fatalf("after period 1 was cut short: %d more granted %d ms after period 0's %d late grants and period 1's 1: %d in one interval, limit %d", r.taken, r.now-late, limit-1, limit-1+1+r.taken, limit)
	}
	if r.delay <= 0 || r.delay > late+period-r.now {
		t.Fatalf("refused take told to wait %d ms, want (0, %d]: when period 0's late grants leave the window", r.delay, late+period-r.now)
	}
	return false
}

// TestTokenBucketFleetKeepsSlidingBoundWhileTokensKeyIsDeleted: three
// callers take from one budget (all-or-nothing and coalesced takes, paced
// and not) while an operator deletes the tokens key again and again, each
// deletion cutting a period short; judged on the server's clock (each
// grant's now_ms), no span of one interval holds more than the limit,
// and every refusal names a positive wait.
func TestTokenBucketFleetKeepsSlidingBoundWhileTokensKeyIsDeleted(t *testing.T) {
	srv := redisenv.New(t)
	for _, c := range []struct{ limit, period int64 }{{3, 19}, {7, 50}, {10, 19}} {
		t.Run(fmt.Sprintf("%d_per_%dms", c.limit, c.period), func(t *testing.T) {
			b, _, keys := caseBucket(t, srv.Client(), fmt.Sprintf("fleet-del-%d-%d", c.limit, c.period), time.Duration(c.period)*time.Millisecond, 0)
			ctx := context.Background()
			var mu sync.Mutex
			var times []time.Time
			var wg sync.WaitGroup
			stop := time.Now().Add(time.Second)
			for g := range 3 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 7))
					for time.Now().Before(stop) {
						n := rng.Int64N(c.limit) + 1
						if rng.IntN(2) == 0 {
							n = -n // coalesced: up to -n
						}
						pace := int64(0)
						if rng.IntN(2) == 0 {
							pace = 9500
						}
						r, err := scriptTBTake.Run(ctx, b.rdb, keys, n, c.limit, c.period, 0, 0, pace).Int64Slice()
						if err != nil {
							t.Error(err)
							return
						}
						switch {
						case r[0] == 1:
							mu.Lock()
							for range r[5] {
								times = append(times, time.UnixMilli(r[6]))
							}
							mu.Unlock()
						case r[0] == 0 && r[3] > 0 && r[1] <= 0:
							t.Errorf("refused with a wait of %d ms: %v", r[1], r)
						}
						if rng.IntN(4) == 0 { // load pacing, not a sync
							time.Sleep(time.Duration(rng.Int64N(c.period*1000)) * time.Microsecond)
						}
					}
				})
			}
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(99, 7))
				for time.Now().Before(stop) {
					time.Sleep(time.Duration(rng.Int64N(c.period*2000)) * time.Microsecond) // the operator's pace
					if err := srv.Client().Del(ctx, keys[0]).Err(); err != nil {
						t.Error(err)
						return
					}
				}
			})
			wg.Wait()
			rep := guarantee.Sliding(times, c.limit, time.Duration(c.period)*time.Millisecond, 0)
			if rep.Violations > 0 {
				t.Fatalf("on the server's clock: %s", rep.Detail)
			}
			if len(times) == 0 {
				t.Fatal("no grants")
			}
		})
	}
}
