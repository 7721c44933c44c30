package bucket

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
)

// TestTokenBucketFence: instance A takes the refill mutex and stalls past
// the mutex's expiry; meanwhile B takes the mutex, refills and drains the
// period. When A resumes and runs its refill, the fence (the period has not
// ended) makes it a no-op: the period never gives more than one refill's
// worth.
func TestTokenBucketFence(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	const limit = 5
	const lockExpiry = 30 * time.Millisecond
	a, err := NewTokenBucket(rdb, "fence", limit, time.Second, WithLockExpiry(lockExpiry))
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewTokenBucket(srv.Client(), "fence", limit, time.Second, WithLockExpiry(lockExpiry))
	if err != nil {
		t.Fatal(err)
	}
	stalled, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	a.afterLock = func() {
		once.Do(func() {
			close(stalled)
			<-resume
		})
	}
	type result struct {
		granted bool
		err     error
	}
	resA := make(chan result, 1)
	go func() {
		d, err := a.Take(ctx, "", 1, 0)
		resA <- result{d.Granted, err}
	}()
	<-stalled
	// A's mutex expires on the server while A is stalled (A does not know).
	lockKey := a.rootKeys[2]
	deadline := time.Now().Add(5 * time.Second)
	for srv.Client().Exists(ctx, lockKey).Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the refill mutex %s did not expire", lockKey)
		}
		time.Sleep(lockExpiry / 10) // polls the server's state, bounded
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
		t.Fatalf("B was granted %d, want the whole period's %d", granted, limit)
	}

	close(resume) // A runs its refill now, inside B's period
	r := <-resA
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.granted {
		granted++
	}
	for range 3 * limit {
		for _, x := range []*TokenBucket{a, b} {
			d, err := x.Take(ctx, "", 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			if d.Granted {
				granted++
			}
		}
	}
	if granted != limit {
		t.Fatalf("%d grants in one period, want %d: the stalled refill was not fenced", granted, limit)
	}
}

// TestTokenBucketRefillScript checks the fence at the script level: a
// second refill in a running period does nothing.
func TestTokenBucketRefillScript(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	keys := []string{"t:{x}:tb", "t:{x}:pause"}
	for i, want := range []int64{1, 0, 0} {
		r, err := scriptTBRefill.Run(ctx, rdb, keys, 10, 1000, 1).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		if r[0] != want {
			t.Fatalf("refill %d: status %d, want %d", i, r[0], want)
		}
	}
	if v, _ := rdb.Get(ctx, keys[0]).Int64(); v != 9 {
		t.Fatalf("tokens = %d, want 9 (10 refilled, 1 taken, once)", v)
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
