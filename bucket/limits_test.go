package bucket

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
)

func TestSetLimitRefusesBadLimits(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	tb, err := NewTokenBucket(rdb, "k", 10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	fw, err := NewFixedWindow(rdb, "k", 10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGCRA(rdb, "k", 10, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	gb, err := NewGCRA(rdb, "k", 10, time.Hour, WithBurst(3_000_000))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		err   error
		field string
	}{
		{"tb zero", tb.SetLimit(ctx, "", 0), "limit"},
		{"tb negative", tb.SetLimit(ctx, "", -5), "limit"},
		{"tb above max", tb.SetLimit(ctx, "", MaxLimit+1), "limit"},
		{"tb long key", tb.SetLimit(ctx, strings.Repeat("k", MaxKeyLen+1), 5), "key"},
		{"fw zero", fw.SetLimit(ctx, "t", 0), "limit"},
		{"fw above max", fw.SetLimit(ctx, "t", MaxLimit+1), "limit"},
		{"gcra above 1/µs", g.SetLimit(ctx, "", 1001), "limit"},
		{"gcra burst overflow", gb.SetLimit(ctx, "", 1), "limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !errors.Is(tt.err, throttle.ErrInvalid) {
				t.Fatalf("err = %v, want one wrapping throttle.ErrInvalid", tt.err)
			}
			if !strings.Contains(tt.err.Error(), tt.field+" = ") || !strings.Contains(tt.err.Error(), "SetLimit") {
				t.Fatalf("err = %q, want it to name SetLimit and %q", tt.err, tt.field)
			}
		})
	}
}

func mustTake(t *testing.T, b throttle.Bucket, key string, n int64) throttle.Decision {
	t.Helper()
	d, err := b.Take(context.Background(), key, n, 0)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestTokenBucketLiveLimit: a live limit applies from the next take, per
// budget, the permits placed before it counting; Decision.Limit and State
// report it; ClearLimit goes back to the default; another instance sees
// it.
func TestTokenBucketLiveLimit(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	b, err := NewTokenBucket(rdb, "live", 5, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	forget := func(key string) { // what an hour does: nothing counts any more
		t.Helper()
		tag, _ := b.ks.tag(b.name, key)
		if err := rdb.Del(ctx, tag+":tb").Err(); err != nil {
			t.Fatal(err)
		}
		sh := b.ends.shard(key) // ... nor does this instance remember a place
		sh.mu.Lock()
		delete(sh.m, key)
		sh.mu.Unlock()
	}
	if d := mustTake(t, b, "", 1); !d.Granted || d.Limit != 5 || d.Remaining != 4 {
		t.Fatalf("first take: %+v, want granted, limit 5, remaining 4", d)
	}
	if err := b.SetLimit(ctx, "", 2); err != nil {
		t.Fatal(err)
	}
	if d := mustTake(t, b, "", 1); !d.Granted || d.Limit != 2 || d.Remaining != 0 {
		t.Fatalf("take after lowering to 2, one placed before: %+v, want granted, limit 2, remaining 0", d)
	}
	if d := mustTake(t, b, "", 1); d.Granted || d.Limit != 2 {
		t.Fatalf("third take under a limit of 2: %+v, want refused", d)
	}
	st, err := b.State(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if st.Limit != 2 || !st.Live || st.Default != 5 || st.Current != 2 || st.Used != 2 || st.Remaining != 0 || !st.Running || st.Reset <= 59*time.Minute || st.Interval != time.Hour {
		t.Fatalf("State = %+v", st)
	}
	// Other budgets keep the default.
	if d := mustTake(t, b, "tenant", 1); d.Limit != 5 || d.Remaining != 4 {
		t.Fatalf("tenant: %+v, want the constructor's limit 5", d)
	}
	// n above the lowered limit can never be granted.
	if _, err := b.Take(ctx, "", 3, 0); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Fatalf("n=3 over a live limit of 2: err = %v, want ErrExceedsLimit", err)
	}
	// Raised above the constructor's limit.
	if err := b.SetLimit(ctx, "", 50); err != nil {
		t.Fatal(err)
	}
	if d := mustTake(t, b, "", 5); !d.Granted || d.Limit != 50 || d.Remaining != 43 {
		t.Fatalf("raised to 50, 2 placed before: %+v", d)
	}
	// Fallback reports the limit of keys without a live one of their own:
	// the constructor's. The live limit of "" is in its decisions.
	if l, _, _ := b.Fallback(); l != 5 {
		t.Fatalf("Fallback limit = %d, want the constructor's 5", l)
	}
	if err := b.ClearLimit(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if st, err := b.State(ctx, ""); err != nil || st.Live || st.Limit != 5 || st.Current != 50 {
		t.Fatalf("after ClearLimit: %+v, %v; want limit 5 (default), the last take's 50 in force until the next", st, err)
	}
	forget("")
	if d := mustTake(t, b, "", 1); d.Limit != 5 || d.Remaining != 4 {
		t.Fatalf("after ClearLimit, nothing counting: %+v, want limit 5", d)
	}
	// Another instance (another client, another TokenBucket) sees it too.
	other, err := NewTokenBucket(srv.Client(), "live", 5, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.SetLimit(ctx, "tenant", 7); err != nil {
		t.Fatal(err)
	}
	if d := mustTake(t, b, "tenant", 1); d.Limit != 7 || d.Remaining != 5 {
		t.Fatalf("tenant after another instance set 7, one placed before: %+v", d)
	}
}

func TestTokenBucketStateIdleAndPaused(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b, err := NewTokenBucket(srv.Client(), "idle", 5, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.State(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	want := State{Limit: 5, Default: 5, Interval: time.Second, Current: 5, Remaining: 5}
	if st != want {
		t.Fatalf("idle State = %+v, want %+v", st, want)
	}
	if err := b.Pause(ctx, "x", time.Minute); err != nil {
		t.Fatal(err)
	}
	if st, err := b.State(ctx, "x"); err != nil || st.Paused <= 59*time.Second || st.Paused > time.Minute {
		t.Fatalf("paused State = %+v, %v", st, err)
	}
	if _, err := b.State(ctx, strings.Repeat("k", MaxKeyLen+1)); !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("long key: %v, want ErrInvalid", err)
	}
}

// TestFixedWindowLiveLimit: a window's limit is fixed by its first grant;
// a live limit applies from the next window.
func TestFixedWindowLiveLimit(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	b, err := NewFixedWindow(rdb, "live", 5, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nextWindow := func() { // what the window's end does
		t.Helper()
		if err := rdb.Del(ctx, b.windows.ks.root+b.windows.kinds[0]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if d := mustTake(t, b, "", 1); d.Limit != 5 || d.Remaining != 4 {
		t.Fatalf("%+v", d)
	}
	if err := b.SetLimit(ctx, "", 2); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if d := mustTake(t, b, "", 1); !d.Granted || d.Limit != 5 {
			t.Fatalf("take %d in the running window: %+v, want granted under its limit 5", i, d)
		}
	}
	if d := mustTake(t, b, "", 1); d.Granted {
		t.Fatalf("6th take in a window of 5: %+v", d)
	}
	st, err := b.State(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if st.Limit != 2 || !st.Live || st.Current != 5 || st.Used != 5 || st.Remaining != 0 || !st.Running || st.Reset <= 0 || st.Reset > time.Hour {
		t.Fatalf("State = %+v", st)
	}
	nextWindow()
	if st, err := b.State(ctx, ""); err != nil || st.Running || st.Current != 2 || st.Remaining != 2 {
		t.Fatalf("State before the new window's first grant = %+v, %v", st, err)
	}
	for i, want := range []int64{1, 0} {
		if d := mustTake(t, b, "", 1); !d.Granted || d.Limit != 2 || d.Remaining != want {
			t.Fatalf("take %d in the new window: %+v", i, d)
		}
	}
	if d := mustTake(t, b, "", 1); d.Granted || d.Limit != 2 {
		t.Fatalf("3rd take in a window of 2: %+v", d)
	}
	if _, err := b.Take(ctx, "", 3, 0); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Fatalf("n=3 over a live limit of 2: %v, want ErrExceedsLimit", err)
	}
	if d := mustTake(t, b, "tenant", 5); !d.Granted || d.Limit != 5 {
		t.Fatalf("tenant keeps the default: %+v", d)
	}
	if err := b.ClearLimit(ctx, ""); err != nil {
		t.Fatal(err)
	}
	nextWindow()
	if d := mustTake(t, b, "", 1); d.Limit != 5 {
		t.Fatalf("after ClearLimit: %+v", d)
	}
}

// TestGCRALiveLimit: a live rate applies at once; the burst follows it
// unless WithBurst fixed it.
func TestGCRALiveLimit(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b, err := NewGCRA(srv.Client(), "live", 10, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.SetLimit(ctx, "", 100); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if d := mustTake(t, b, "", 1); !d.Granted || d.Delay != 0 || d.Limit != 100 {
			t.Fatalf("take %d under a live burst of 100: %+v", i, d)
		}
	}
	if d := mustTake(t, b, "", 1); d.Granted || d.Limit != 100 {
		t.Fatalf("101st: %+v, want refused", d)
	}
	st, err := b.State(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if st.Limit != 100 || !st.Live || st.Current != 100 || st.Remaining != 0 || st.Used != 100 || !st.Running || st.Reset < 59*time.Minute {
		t.Fatalf("State = %+v", st)
	}
	// Lowered: applies at once.
	if err := b.SetLimit(ctx, "tenant", 2); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if d := mustTake(t, b, "tenant", 1); !d.Granted || d.Limit != 2 {
			t.Fatalf("tenant take %d: %+v", i, d)
		}
	}
	if d := mustTake(t, b, "tenant", 1); d.Granted || d.Delay < 29*time.Minute {
		t.Fatalf("3rd tenant take at 2/h: %+v, want refused for about 30 min", d)
	}
	if err := b.ClearLimit(ctx, "tenant"); err != nil {
		t.Fatal(err)
	}
	// The TAT carries over (2 slots of 30 min booked): at the default 10/h
	// the next slot is 6 min away.
	if d := mustTake(t, b, "tenant", 1); d.Granted || d.Limit != 10 || d.Delay < 5*time.Minute || d.Delay > 6*time.Minute {
		t.Fatalf("after ClearLimit, the default rate 10/h: %+v, want refused for about 6 min", d)
	}
}

// TestGCRALoweredLimitBelowN is the regression test for a GCRA whose live
// limit (and so its burst) was lowered below n: the call must fail with
// ErrExceedsLimit, not be granted more than the burst at once nor told to
// wait for a slot that can never come.
func TestGCRALoweredLimitBelowN(t *testing.T) {
	rdb := redisenv.New(t).Client()
	ctx := context.Background()
	b, err := NewGCRA(rdb, "lowered", 10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.SetLimit(ctx, "", 2); err != nil {
		t.Fatal(err)
	}
	for _, maxWait := range []time.Duration{0, 10 * time.Second} {
		d, err := b.Take(ctx, "", 10, maxWait)
		if !errors.Is(err, throttle.ErrExceedsLimit) {
			t.Fatalf("maxWait %v: Take(10) under a live limit of 2 = %+v, %v; want ErrExceedsLimit", maxWait, d, err)
		}
	}
	if d, err := b.Take(ctx, "", 2, 0); err != nil || !d.Granted {
		t.Fatalf("Take(2) under a live limit of 2 = %+v, %v; want granted", d, err)
	}
}
