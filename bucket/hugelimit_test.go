package bucket

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// TestHugeLimitWorksOrIsRefused: a limit a constructor accepts must work
// at the first calls. The scripts compute in Lua doubles and Redis formats
// a double of 10^17 or more with an exponent, so a TokenBucket of such a
// limit refilled its tokens as "1e+17" and every later take failed with
// "value is not an integer", and larger limits came back as negative
// Remaining. Such limits are refused at construction, with ErrInvalid.
func TestHugeLimitWorksOrIsRefused(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	for _, limit := range []int64{1e17, 1 << 62, math.MaxInt64} {
		builds := map[string]func() (throttle.Bucket, error){
			"TokenBucket": func() (throttle.Bucket, error) { return NewTokenBucket(rdb, "huge-tb", limit, time.Hour) },
			"FixedWindow": func() (throttle.Bucket, error) { return NewFixedWindow(rdb, "huge-fw", limit, time.Hour) },
			"SlidingLog": func() (throttle.Bucket, error) {
				return NewSlidingLog(rdb, "huge-sl", []throttle.Tier{{Limit: limit, Period: time.Hour}})
			},
			"Tiers": func() (throttle.Bucket, error) {
				return NewTiers(rdb, "huge-tiers", []throttle.Tier{{Limit: limit, Period: time.Hour}})
			},
			"Counter": func() (throttle.Bucket, error) {
				c, err := NewCounter(rdb, "huge-ctr", limit, time.Hour)
				if err == nil {
					err = scriptCounterReset.Run(ctx, rdb, []string{c.ks.root + ":ctr"}, time.Hour.Milliseconds()).Err()
				}
				return c, err
			},
		}
		for name, build := range builds {
			b, err := build()
			if err != nil {
				if !errors.Is(err, throttle.ErrInvalid) {
					t.Fatalf("%s(limit %d): %v, want ErrInvalid", name, limit, err)
				}
				continue
			}
			for i := range 3 {
				d, err := b.Take(ctx, "", 1, 0)
				if err != nil || !d.Granted || d.Remaining < 0 || d.Remaining > limit {
					t.Errorf("%s(limit %d) accepted, take %d: %+v, %v; want granted with 0 ≤ Remaining ≤ limit", name, limit, i, d, err)
					break
				}
			}
		}
	}
}
