package bucket

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
)

// TestGCRARemainingNeverAboveLimit: with a burst above the limit, a
// decision's Remaining is capped at its Limit, for a take alone and for
// coalesced takes (it once reported 14 left of a limit of 10, for
// rate-limit headers).
func TestGCRARemainingNeverAboveLimit(t *testing.T) {
	srv := redisenv.New(t)
	b, err := NewGCRA(srv.Client(), "remaining", 10, time.Second, WithBurst(30))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d, err := b.Take(ctx, "", 1, 0)
	if err != nil || !d.Granted || d.Remaining != 10 {
		t.Fatalf("first Take = %+v, %v; want granted with Remaining 10 (the limit; 29 are free)", d, err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := b.Take(ctx, "", 1, 0)
			if err != nil || d.Remaining > d.Limit {
				t.Errorf("concurrent Take = %+v, %v; want Remaining ≤ Limit", d, err)
			}
		}()
	}
	wg.Wait()
}
