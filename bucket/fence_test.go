package bucket

import (
	"context"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/headway-go/headway/internal/redisenv"
)

// TestTokenBucketRedsyncHolderExcludesRefill: another Redsync user holding
// the bucket's refill mutex (same key, Redsync's own format) keeps every
// take from refilling; once it unlocks, the next take refills, exactly
// one period's worth.
func TestTokenBucketRedsyncHolderExcludesRefill(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	const limit = 5
	b, err := NewTokenBucket(rdb, "fence", limit, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	m := redsync.New(goredis.NewPool(rdb)).NewMutex(b.rootKeys[2], redsync.WithTries(1), redsync.WithExpiry(10*time.Second))
	if err := m.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		d, err := b.Take(ctx, "", 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		if d.Granted || d.Delay != defaultRetry {
			t.Fatalf("take while another Redsync user holds the mutex: %+v, want refused with the retry delay", d)
		}
	}
	if n, _ := rdb.Exists(ctx, b.rootKeys[0]).Result(); n != 0 {
		t.Fatal("the bucket refilled while the mutex was held")
	}
	if ok, err := m.UnlockContext(ctx); !ok || err != nil {
		t.Fatalf("unlock: %v %v", ok, err)
	}
	granted := 0
	for range 3 * limit {
		d, err := b.Take(ctx, "", 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		if d.Granted {
			granted++
		}
	}
	if granted != limit {
		t.Fatalf("%d grants after the unlock, want one period's %d", granted, limit)
	}
}

// TestTokenBucketRefillScript checks the fence at the script level: a take
// that finds the period over refills and takes in one call; takes in the
// running period never refill again; a take asking "up to k" gets what is
// left and no more.
func TestTokenBucketRefillScript(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	keys := tbKeys("t:{x}")
	for i, want := range []int64{1, 1, 1} {
		r, err := scriptTBTake.Run(ctx, rdb, keys, 1, 10, 1000).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		if r[0] != want || r[2] != int64(9-i) {
			t.Fatalf("take %d: %v, want status %d and %d left", i, r, want, 9-i)
		}
	}
	r, err := scriptTBTake.Run(ctx, rdb, keys, -100, 10, 1000).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	if r[0] != 1 || r[5] != 7 || r[2] != 0 {
		t.Fatalf("take up to 100 with 7 left: %v, want status 1, 7 taken, 0 left", r)
	}
	r, err = scriptTBTake.Run(ctx, rdb, keys, -100, 10, 1000).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	if r[0] != 0 || r[5] != 0 || r[1] <= 0 {
		t.Fatalf("take up to 100 with none left: %v, want refused until the period ends", r)
	}
	if v, _ := rdb.Get(ctx, keys[0]).Int64(); v != 0 {
		t.Fatalf("tokens = %d, want 0 (10 refilled once, all taken)", v)
	}
}

// TestTokenBucketDeniedTakeKeepsNextPeriod: denied takes at the end of a
// period leave nothing behind, so the next period starts full.
func TestTokenBucketDeniedTakeKeepsNextPeriod(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b, err := NewTokenBucket(srv.Client(), "denied", 3, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	count := func() (granted int, delay time.Duration) {
		for range 10 {
			d, err := b.Take(ctx, "", 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			if d.Granted {
				granted++
			} else {
				delay = d.Delay
			}
		}
		return granted, delay
	}
	g, delay := count()
	if g != 3 || delay <= 0 || delay > 101*time.Millisecond {
		t.Fatalf("first period: %d granted, delay %v; want 3 and a delay ≤ 101ms", g, delay)
	}
	time.Sleep(delay)
	if g, _ := count(); g != 3 {
		t.Fatalf("second period: %d granted, want 3", g)
	}
	// n > 1 is all or nothing: 2 of 3 left, asking 3 fails and takes none.
	time.Sleep(110 * time.Millisecond)
	if d, _ := b.Take(ctx, "", 1, 0); !d.Granted || d.Remaining != 2 {
		t.Fatalf("take 1: %+v", d)
	}
	if d, _ := b.Take(ctx, "", 3, 0); d.Granted || d.Remaining != 2 {
		t.Fatalf("take 3 of 2: %+v, want denied with 2 left", d)
	}
	if d, _ := b.Take(ctx, "", 2, 0); !d.Granted || d.Remaining != 0 || d.Limit != 3 || d.Reset <= 0 {
		t.Fatalf("take 2 of 2: %+v", d)
	}
}
