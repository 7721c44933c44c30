package bucket

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
)

// TestConcurrencyGenerationFromTheFutureClosesTheCapNoLongerThanASpan: a
// generation that the server's clock puts in the future (created on a
// master whose clock was ahead, then a failover to this one; or a
// garbage value) closes the cap for at most a span
// (lease/3 + min(lease/3, 1 s)) for an instance that remembers another
// one, never until the server's clock catches up with it.
func TestConcurrencyGenerationFromTheFutureClosesTheCapNoLongerThanASpan(t *testing.T) {
	srv := redisenv.New(t)
	const lease = 300 * time.Millisecond
	rdb := srv.Client()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		gen  func(now time.Time) string
	}{
		{"an hour ahead", func(now time.Time) string {
			return strconv.FormatInt(now.Add(time.Hour).UnixMicro(), 10) + ".7"
		}},
		{"garbage", func(time.Time) string { return "99999999999999999999999999.1" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSlots(t, rdb, "future-gen-"+tc.name, 1, WithLease(lease))
			rel, err := s.Hold(ctx, "", 0) // s now remembers the generation
			if err != nil {
				t.Fatal(err)
			}
			rel()
			keys, err := s.keys("")
			if err != nil {
				t.Fatal(err)
			}
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if err := rdb.HSet(ctx, keys[5], "g", tc.gen(now)).Err(); err != nil {
				t.Fatal(err)
			}
			rel, err = s.Hold(ctx, "", 3*time.Second)
			if err != nil {
				t.Fatalf("Hold(3s) after a generation %s replaced the remembered one, span %v = %v, want the slot once the span is over", tc.name, lease/3+min(lease/3, time.Second), err)
			}
			rel()
		})
	}
}
