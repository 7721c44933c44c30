package bucket

import (
	"context"
	"testing"
	"time"

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
	ctx := context.Background()
	const limit, period = 10, 600 // ms
	b, _, keys := caseBucket(t, srv.Client(), "slide-short", period*time.Millisecond, 0)

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
		t.Skipf("the machine is too slow for this test's timing: the take came %d ms after the late grants", r.now-late)
	}
	if r.status == 1 {
		t.Fatalf("after period 1 was cut short: %d more granted %d ms after period 0's %d late grants and period 1's 1: %d in one interval, limit %d", r.taken, r.now-late, limit-1, limit-1+1+r.taken, limit)
	}
	if r.delay <= 0 || r.delay > late+period-r.now {
		t.Fatalf("refused take told to wait %d ms, want (0, %d]: when period 0's late grants leave the window", r.delay, late+period-r.now)
	}
}
