package bucket

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

func TestConstructorsRefuseBadInput(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { rdb.Close() })
	var nilClient *redis.Client
	long := strings.Repeat("k", MaxKeyLen+1)
	sec := time.Second
	tb := func(rdb redis.UniversalClient, key string, limit int64, iv time.Duration, opts ...TokenBucketOption) error {
		_, err := NewTokenBucket(rdb, key, limit, iv, opts...)
		return err
	}
	tests := []struct {
		name  string
		err   error
		field string
	}{
		{"nil client", tb(nil, "k", 1, sec), "rdb"},
		{"typed nil client", tb(nilClient, "k", 1, sec), "rdb"},
		{"empty key", tb(rdb, "", 1, sec), "key"},
		{"long key", tb(rdb, long, 1, sec), "key"},
		{"zero limit", tb(rdb, "k", 0, sec), "limit"},
		{"negative limit", tb(rdb, "k", -1, sec), "limit"},
		{"zero interval", tb(rdb, "k", 1, 0), "interval"},
		{"sub-ms interval", tb(rdb, "k", 1, time.Microsecond), "interval"},
		{"empty prefix", tb(rdb, "k", 1, sec, WithPrefix("")), "prefix"},
		{"brace prefix", tb(rdb, "k", 1, sec, WithPrefix("a{b")), "prefix"},
		{"fw zero limit", func() error { _, err := NewFixedWindow(rdb, "k", 0, sec); return err }(), "limit"},
		{"fw zero interval", func() error { _, err := NewFixedWindow(rdb, "k", 1, 0); return err }(), "interval"},
		{"fw nil client", func() error { _, err := NewFixedWindow(nil, "k", 1, sec); return err }(), "rdb"},
		{"gcra zero limit", func() error { _, err := NewGCRA(rdb, "k", 0, sec); return err }(), "limit"},
		{"gcra limit above 1/µs", func() error { _, err := NewGCRA(rdb, "k", 2000, time.Millisecond); return err }(), "limit"},
		{"gcra zero burst", func() error { _, err := NewGCRA(rdb, "k", 1, sec, WithBurst(-1)); return err }(), "burst"},
		{"gcra huge burst", func() error { _, err := NewGCRA(rdb, "k", 1, time.Hour, WithBurst(1<<40)); return err }(), "burst"},
		{"gcra empty key", func() error { _, err := NewGCRA(rdb, "", 1, sec); return err }(), "key"},
		{"counter zero period", func() error { _, err := NewCounter(rdb, "k", 1, 0); return err }(), "period"},
		{"counter zero limit", func() error { _, err := NewCounter(rdb, "k", 0, sec); return err }(), "limit"},
		{"counter short lease", func() error { _, err := NewCounter(rdb, "k", 1, sec, WithLeaderLease(time.Millisecond)); return err }(), "lease"},
		{"tiers none", func() error { _, err := NewTiers(rdb, "k", nil); return err }(), "tiers"},
		{"tiers zero limit", func() error { _, err := NewTiers(rdb, "k", []throttle.Tier{{Limit: 0, Period: sec}}); return err }(), "tiers[0].Limit"},
		{"tiers negative period", func() error {
			_, err := NewTiers(rdb, "k", []throttle.Tier{{Limit: 1, Period: sec}, {Limit: 1, Period: -sec}})
			return err
		}(), "tiers[1].Period"},
		{"tiers duplicate", func() error {
			_, err := NewTiers(rdb, "k", []throttle.Tier{{Limit: 1, Period: sec}, {Limit: 2, Period: sec}})
			return err
		}(), "tiers[1].Period"},
		{"tiers too many", func() error {
			var ts []throttle.Tier
			for i := range maxTiers + 1 {
				ts = append(ts, throttle.Tier{Limit: 1, Period: time.Duration(i+1) * sec})
			}
			_, err := NewTiers(rdb, "k", ts)
			return err
		}(), "tiers"},
		{"sliding none", func() error { _, err := NewSlidingLog(rdb, "k", []throttle.Tier{}); return err }(), "tiers"},
		{"sliding zero period", func() error { _, err := NewSlidingLog(rdb, "k", []throttle.Tier{{Limit: 1, Period: 0}}); return err }(), "tiers[0].Period"},
		{"sliding duplicate", func() error {
			_, err := NewSlidingLog(rdb, "k", []throttle.Tier{{Limit: 1, Period: sec}, {Limit: 1, Period: sec}})
			return err
		}(), "tiers[1].Period"},
		{"sliding negative margin", func() error {
			_, err := NewSlidingLog(rdb, "k", []throttle.Tier{{Limit: 5, Period: sec}}, WithArrivalMargin(-1))
			return err
		}(), "arrival margin"},
		{"sliding margin ≥ period", func() error {
			_, err := NewSlidingLog(rdb, "k", []throttle.Tier{{Limit: 5, Period: sec}}, WithArrivalMargin(sec))
			return err
		}(), "arrival margin"},
		// Intervals whose µs or ms overflow.
		{"tb Forever", tb(rdb, "k", 5, throttle.Forever), "interval"},
		{"tb above a year", tb(rdb, "k", 5, MaxInterval+time.Millisecond), "interval"},
		{"fw Forever", func() error { _, err := NewFixedWindow(rdb, "k", 5, throttle.Forever); return err }(), "interval"},
		{"fw µs overflow", func() error { _, err := NewFixedWindow(rdb, "k", 5, throttle.Forever-500); return err }(), "interval"},
		{"gcra Forever", func() error { _, err := NewGCRA(rdb, "k", 5, throttle.Forever); return err }(), "interval"},
		{"counter Forever", func() error { _, err := NewCounter(rdb, "k", 5, throttle.Forever); return err }(), "period"},
		{"tiers Forever", func() error {
			_, err := NewTiers(rdb, "k", []throttle.Tier{{Limit: 5, Period: sec}, {Limit: 50, Period: throttle.Forever}})
			return err
		}(), "tiers[1].Period"},
		{"sliding Forever", func() error {
			_, err := NewSlidingLog(rdb, "k", []throttle.Tier{{Limit: 5, Period: throttle.Forever}})
			return err
		}(), "tiers[0].Period"},
		{"lease Forever", func() error { _, err := NewCounter(rdb, "k", 1, sec, WithLeaderLease(throttle.Forever)); return err }(), "lease"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !errors.Is(tt.err, throttle.ErrInvalid) {
				t.Fatalf("err = %v, want one wrapping throttle.ErrInvalid", tt.err)
			}
			if !strings.Contains(tt.err.Error(), tt.field+" = ") {
				t.Fatalf("err = %q, want it to name %q", tt.err, tt.field)
			}
		})
	}
}

// countingHook counts the commands a client sends (a pipeline counts each
// command).
type countingHook struct{ n atomic.Int64 }

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(int64(len(cmds))); return next(ctx, cmds) }
}

// allBuckets builds one of each bucket on rdb under key.
func allBuckets(t testing.TB, rdb redis.UniversalClient, key string, limit int64, iv time.Duration) map[string]throttle.Bucket {
	t.Helper()
	must := func(b throttle.Bucket, err error) throttle.Bucket {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return map[string]throttle.Bucket{
		"TokenBucket": must(NewTokenBucket(rdb, key, limit, iv)),
		"GCRA":        must(NewGCRA(rdb, key, limit, iv)),
		"FixedWindow": must(NewFixedWindow(rdb, key, limit, iv)),
		"SlidingLog":  must(NewSlidingLog(rdb, key, []throttle.Tier{{Limit: limit, Period: iv}, {Limit: limit * 3, Period: 3 * iv}})),
		"Tiers":       must(NewTiers(rdb, key, []throttle.Tier{{Limit: limit, Period: iv}, {Limit: limit * 3, Period: 3 * iv}})),
		"Counter":     must(NewCounter(rdb, key, limit, iv)),
	}
}

// TestTakeRefusesWithoutRoundTrip: n above the capacity, n < 1 and a key
// too long are refused before anything is sent.
func TestTakeRefusesWithoutRoundTrip(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	hook := &countingHook{}
	rdb.AddHook(hook)
	ctx := context.Background()
	for name, b := range allBuckets(t, rdb, "refuse", 5, time.Second) {
		if _, err := b.Take(ctx, "", 6, 0); !errors.Is(err, throttle.ErrExceedsLimit) {
			t.Errorf("%s: Take(6) = %v, want ErrExceedsLimit", name, err)
		}
		if _, err := b.Take(ctx, "", 0, 0); !errors.Is(err, throttle.ErrInvalid) {
			t.Errorf("%s: Take(0) = %v, want ErrInvalid", name, err)
		}
		if _, err := b.Take(ctx, strings.Repeat("x", MaxKeyLen+1), 1, 0); !errors.Is(err, throttle.ErrInvalid) || !errors.Is(err, throttle.ErrInvalidKey) {
			t.Errorf("%s: Take(long key) = %v, want ErrInvalid and ErrInvalidKey", name, err)
		}
		if _, err := b.Take(ctx, "", 0, 0); errors.Is(err, throttle.ErrInvalidKey) {
			t.Errorf("%s: Take(0) = %v, matches ErrInvalidKey; the key is not at fault", name, err)
		}
	}
	if n := hook.n.Load(); n != 0 {
		t.Errorf("%d commands sent, want 0", n)
	}
}

// TestBackendError: a dead server gives a *throttle.BackendError.
func TestBackendError(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1, DialerRetryTimeout: time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	for name, b := range allBuckets(t, rdb, "dead", 5, time.Second) {
		_, err := b.Take(context.Background(), "", 1, 0)
		var be *throttle.BackendError
		if !errors.As(err, &be) || be.Op != "take" || be.Key == "" {
			t.Errorf("%s: Take = %v, want a *throttle.BackendError for op take", name, err)
		}
	}
}

// srcOf is the text of the script file name alone.
func srcOf(t *testing.T, name string) []byte {
	t.Helper()
	src, err := os.ReadFile("lua/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// TestScripts: every embedded script loads on a real server under the SHA1
// that Go computed, matches its file, and is found again by EVALSHA after
// SCRIPT FLUSH through the NOSCRIPT fallback.
func TestScripts(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	for name, s := range scripts {
		var full []byte
		for _, f := range append(uses[name], name) {
			src, err := os.ReadFile("lua/" + f)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(src), "-- "+f+":") {
				t.Errorf("%s: header comment must name the file", f)
			}
			full = append(full, src...)
		}
		src := full[len(full)-len(srcOf(t, name)):]
		sum := sha1.Sum(full)
		if got := hex.EncodeToString(sum[:]); got != s.Hash() {
			t.Errorf("%s: embedded hash %s, file hash %s", name, s.Hash(), got)
		}
		if !strings.Contains(string(src), "KEYS[1]") || !strings.Contains(string(src), "Guarantee") {
			t.Errorf("%s: header comment must give KEYS/ARGV and the guarantee", name)
		}
		sha, err := s.Load(ctx, rdb).Result()
		if err != nil {
			t.Fatalf("%s: SCRIPT LOAD: %v", name, err)
		}
		if sha != s.Hash() {
			t.Errorf("%s: server SHA %s, Go SHA %s", name, sha, s.Hash())
		}
	}
	// Every script runs: through each bucket's Take, then again after the
	// server forgot them all.
	run := func() {
		t.Helper()
		for name, b := range allBuckets(t, rdb, "scripts", 5, time.Second) {
			if _, err := b.Take(ctx, "tenant", 1, time.Second); err != nil {
				t.Errorf("%s: %v", name, err)
			}
			if p, ok := throttle.BucketAs[throttle.Pauser](b); ok {
				if err := p.Pause(ctx, "other", time.Millisecond); err != nil {
					t.Errorf("%s: pause: %v", name, err)
				}
			}
			if r, ok := throttle.BucketAs[throttle.Refunder](b); ok {
				if err := r.Refund(ctx, "tenant", 1); err != nil {
					t.Errorf("%s: refund: %v", name, err)
				}
			}
			if c, ok := b.(*Counter); ok {
				if err := scriptCounterReset.Run(ctx, rdb, []string{c.ks.root + ":ctr"}, 1000).Err(); err != nil {
					t.Errorf("counter_reset: %v", err)
				}
			}
		}
	}
	run()
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	run()
}

// TestPause: a pause holds every bucket that implements Pauser, for every
// instance, and a shorter pause does not shorten it.
func TestPause(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	for name, b := range allBuckets(t, srv.Client(), "pause", 5, time.Second) {
		p, ok := throttle.BucketAs[throttle.Pauser](b)
		if !ok {
			t.Errorf("%s: not a Pauser", name)
			continue
		}
		if c, ok := b.(*Counter); ok { // a Counter grants after a reset only
			scriptCounterReset.Run(ctx, c.rdb, []string{c.ks.root + ":ctr"}, 1000)
		}
		if err := p.Pause(ctx, "", 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if err := p.Pause(ctx, "", 10*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		d, err := b.Take(ctx, "", 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		if d.Granted || d.Delay < 250*time.Millisecond || d.Delay > 302*time.Millisecond {
			t.Errorf("%s: paused Take = %+v, want denied with ~300ms delay", name, d)
		}
		// Another key of the same bucket is not paused.
		if name != "Counter" {
			if d, err := b.Take(ctx, "elsewhere", 1, 0); err != nil || !d.Granted {
				t.Errorf("%s: Take on an unpaused key = %+v, %v", name, d, err)
			}
		}
	}
}

// TestPauseForever: a pause too long for the
// millisecond arithmetic is clamped to throttle.MaxPause, not dropped.
func TestPauseForever(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	for name, b := range allBuckets(t, srv.Client(), "pauseforever", 5, time.Second) {
		if name == "Counter" {
			continue // grants only after a reset; its pause is TestPause's
		}
		for _, key := range []string{"a", "b", "c"} {
			d := map[string]time.Duration{"a": throttle.Forever, "b": throttle.Forever - time.Microsecond, "c": throttle.MaxPause + time.Hour}[key]
			if err := mustCap[throttle.Pauser](b).Pause(ctx, key, d); err != nil {
				t.Fatalf("%s: Pause(%v) = %v", name, d, err)
			}
			dec, err := b.Take(ctx, key, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			if dec.Granted || dec.Delay < throttle.MaxPause-time.Minute || dec.Delay > throttle.MaxPause+time.Millisecond {
				t.Errorf("%s: Take after Pause(%v) = %+v, want refused for about throttle.MaxPause", name, d, dec)
			}
		}
	}
}

// TestGCRAReserves: with maxWait, GCRA books a future slot, and later
// callers queue behind it; GCRA gives nothing back (it is no Refunder: a
// refund could not tell which queued slot it frees).
func TestGCRAReserves(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b, err := NewGCRA(srv.Client(), "reserve", 10, time.Second, WithBurst(1)) // one per 100 ms
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := b.Take(ctx, "", 1, 0); !d.Granted || d.Delay != 0 {
		t.Fatalf("first: %+v", d)
	}
	d, _ := b.Take(ctx, "", 1, 0)
	if d.Granted || d.Delay < 90*time.Millisecond || d.Delay > 100*time.Millisecond {
		t.Fatalf("second, no wait: %+v, want denied with ~100ms", d)
	}
	d, _ = b.Take(ctx, "", 1, time.Second)
	if !d.Granted || d.Delay < 90*time.Millisecond || d.Delay > 100*time.Millisecond {
		t.Fatalf("second, 1s wait: %+v, want a reservation ~100ms ahead", d)
	}
	d, _ = b.Take(ctx, "", 1, time.Second)
	if !d.Granted || d.Delay < 190*time.Millisecond || d.Delay > 200*time.Millisecond {
		t.Fatalf("third: %+v, want a reservation ~200ms ahead", d)
	}
	if _, ok := throttle.BucketAs[throttle.Refunder](b); ok {
		t.Fatal("GCRA is a Refunder: a refund of a queued reservation could put two permits in one slot")
	}
}

// TestKeyEscaping: user keys with '{', '}' and '%' land in the slot of
// their own tag on a real cluster, multi-key scripts run there without
// CROSSSLOT, distinct keys stay distinct, and tenants spread over slots.
func TestKeyEscaping(t *testing.T) {
	t.Parallel()
	cl := redisenv.NewCluster(t)
	rdb := cl.Client()
	ctx := context.Background()
	base := "api{v1}%"
	ks := newKeyspace(defaultPrefix, base)
	tiers, err := NewTiers(rdb, base, []throttle.Tier{{Limit: 5, Period: time.Second}, {Limit: 10, Period: 10 * time.Second}, {Limit: 20, Period: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	slots := map[int64]bool{}
	for _, key := range []string{"", "{", "}", "}{", "%7B", "a{b}c", "tenant/1", "%", "{tenant}", "tenant-2", "tenant-3", "tenant-4"} {
		tag, err := ks.tag("test", key)
		if err != nil {
			t.Fatal(err)
		}
		if prev, dup := seen[tag]; dup {
			t.Fatalf("keys %q and %q share the tag %q", prev, key, tag)
		}
		seen[tag] = key
		inner := tag[strings.IndexByte(tag, '{')+1 : len(tag)-1]
		if strings.ContainsAny(inner, "{}") {
			t.Fatalf("key %q: tag %q holds a brace", key, tag)
		}
		want := rdb.ClusterKeySlot(ctx, inner).Val()
		for _, kind := range []string{":tb", ":tb:limit", ":pause", ":tier:1000000"} {
			if got := rdb.ClusterKeySlot(ctx, tag+kind).Val(); got != want {
				t.Errorf("key %q: %s is in slot %d, want %d (its tag's)", key, tag+kind, got, want)
			}
		}
		slots[want] = true
		if _, err := tiers.Take(ctx, key, 1, 0); err != nil {
			t.Errorf("key %q: Take on the cluster: %v", key, err)
		}
	}
	if len(slots) < 2 {
		t.Errorf("all tenants in one slot: %v", slots)
	}
}

func FuzzEscape(f *testing.F) {
	for _, s := range []string{"", "{", "}", "%", "%7B", "a/b", "{a}/%7D"} {
		f.Add(s, s+"x")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ks := newKeyspace("p", "base{")
		ta, errA := ks.tag("fuzz", a)
		tb, errB := ks.tag("fuzz", b)
		if errA != nil || errB != nil {
			if len(a) <= MaxKeyLen && len(b) <= MaxKeyLen {
				t.Fatalf("tag refused a short key: %v %v", errA, errB)
			}
			return
		}
		if strings.Count(ta, "{") != 1 || strings.Count(ta, "}") != 1 || !strings.HasSuffix(ta, "}") {
			t.Fatalf("tag %q of %q does not have exactly one hash tag", ta, a)
		}
		if (ta == tb) != (a == b) {
			t.Fatalf("keys %q and %q: tags %q and %q", a, b, ta, tb)
		}
	})
}

// mustCap is what b offers of T (throttle.BucketAs), which every bucket of the test has.
func mustCap[T any](b throttle.Bucket) T {
	t, _ := throttle.BucketAs[T](b)
	return t
}
