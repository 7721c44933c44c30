package bucket

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// TestAdaptiveScripts: the adaptive scripts load under the SHA1 Go
// computed and carry their header.
func TestAdaptiveScripts(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	for name, s := range adaptScripts {
		src, err := os.ReadFile("lua/" + name)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha1.Sum(src)
		if got := hex.EncodeToString(sum[:]); got != s.Hash() {
			t.Errorf("%s: embedded hash %s, file hash %s", name, s.Hash(), got)
		}
		if !strings.HasPrefix(string(src), "-- "+name+":") || !strings.Contains(string(src), "KEYS[1]") || !strings.Contains(string(src), "Guarantee") {
			t.Errorf("%s: header comment must name the file, give KEYS/ARGV and the guarantee", name)
		}
		if sha, err := s.Load(context.Background(), rdb).Result(); err != nil || sha != s.Hash() {
			t.Errorf("%s: SCRIPT LOAD = %s, %v; want %s", name, sha, err, s.Hash())
		}
	}
}

// TestAdaptiveStateIsShared: for every bucket, on one node and on a
// cluster, a refusal reported through one instance's Limiter is the
// state every other instance reads and paces by, with one slot for the
// fleet, and a swap computed from a stale version loses.
func TestAdaptiveStateIsShared(t *testing.T) {
	t.Parallel()
	single := redisenv.New(t).Client()
	cluster := redisenv.NewCluster(t).Client()
	for topo, rdb := range map[string]redis.UniversalClient{"node": single, "cluster": cluster} {
		t.Run(topo, func(t *testing.T) {
			ctx := context.Background()
			// 10 per 10 s, so that a paced slot (at 9) is 1.11 s from the next.
			for name := range allBuckets(t, rdb, "adapt", 10, 10*time.Second) {
				t.Run(name, func(t *testing.T) {
					// Two instances of one bucket; each kind its own key
					// (kinds built on one key share its pause and state).
					b := allBuckets(t, rdb, "adapt-"+name, 10, 10*time.Second)[name]
					b2 := allBuckets(t, rdb, "adapt-"+name, 10, 10*time.Second)[name]
					store := storeOf(b)
					other := storeOf(b2)
					p, err := other.PaceAdaptive(ctx, "tenant", 1, 10*time.Second, 0)
					if err != nil || !p.Granted || p.State.Active() {
						t.Fatalf("before any refusal: PaceAdaptive = %+v, %v; want granted, not adapting", p, err)
					}

					if err := throttle.New(b).Key("tenant").Report(ctx, throttle.Answer{Refused: true}); err != nil {
						t.Fatal(err)
					}
					s, err := throttle.New(b2).Key("tenant").AdaptiveState(ctx)
					if err != nil || s.Rate != 9 || s.Ceiling != 0 || s.Peak != 10 || s.Version != 1 {
						t.Fatalf("the other instance reads %+v, %v; want rate 9 (refused at 10, the configured ceiling: Ceiling 0), version 1", s, err)
					}
					if d := time.Since(s.Decreased); d < 0 || d > 5*time.Second {
						t.Errorf("decreased %v ago on the server's clock", d)
					}

					// One slot for the fleet: the first instance takes it,
					// the other is told how far the next one is.
					if p, err := store.PaceAdaptive(ctx, "tenant", 1, 10*time.Second, 0); err != nil || !p.Granted || p.Delay != 0 {
						t.Fatalf("first slot: %+v, %v", p, err)
					}
					p, err = other.PaceAdaptive(ctx, "tenant", 1, 10*time.Second, 0)
					if err != nil || p.Granted || p.Delay < time.Second || p.Delay > 1430*time.Millisecond {
						t.Fatalf("second slot: %+v, %v; want refused, about 1.11 s away", p, err)
					}
					// Within a horizon that reaches it, the slot is reserved.
					p, err = other.PaceAdaptive(ctx, "tenant", 1, 10*time.Second, 2*time.Second)
					if err != nil || !p.Granted || p.Delay < time.Second {
						t.Fatalf("reserved slot: %+v, %v", p, err)
					}

					// A stale swap loses; the fresh one wins.
					next := s
					next.Rate = 5
					if _, ok, err := store.SwapAdaptive(ctx, "tenant", throttle.AdaptiveState{Version: 0}, next, time.Minute); err != nil || ok {
						t.Fatalf("stale swap: swapped %v, %v", ok, err)
					}
					got, ok, err := other.SwapAdaptive(ctx, "tenant", s, next, time.Minute)
					if err != nil || !ok || got.Rate != 5 || got.Version != 2 {
						t.Fatalf("fresh swap: %+v, %v, %v", got, ok, err)
					}
					// Each budget has its own state.
					if s, err := throttle.New(b).Key("").AdaptiveState(ctx); err != nil || s.Active() {
						t.Errorf("key \"\": %+v, %v; want not adapting", s, err)
					}
				})
			}
		})
	}
}

// TestAdaptiveStoreErrors: a bad key is refused before any round trip; a
// dead server is a BackendError, and the Limiter then grants as its
// failure policy says rather than hang on pacing.
func TestAdaptiveStoreErrors(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	b, err := NewTokenBucket(rdb, "k", 5, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := storeOf(b).PaceAdaptive(ctx, strings.Repeat("x", MaxKeyLen+1), 1, time.Second, 0); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("long key: %v, want ErrInvalid", err)
	}
	_, err = storeOf(b).PaceAdaptive(ctx, "", 1, time.Second, 0)
	var be *throttle.BackendError
	if !errors.As(err, &be) {
		t.Errorf("dead server: %v, want a BackendError", err)
	}
	if _, _, err := storeOf(b).SwapAdaptive(ctx, "", throttle.AdaptiveState{Version: -1}, throttle.AdaptiveState{}, time.Second); !errors.As(err, &be) {
		t.Errorf("dead server: %v, want a BackendError", err)
	}
	if err := throttle.New(b).Report(ctx, throttle.Answer{Refused: true}); !errors.As(err, &be) {
		t.Errorf("Report on a dead server: %v, want a BackendError", err)
	}
}

// TestAdaptivePaceRescalesAfterRateChange: a slot reserved at a hundredth
// of a permit per interval (100 intervals ahead) no longer holds the key
// once the rate is back up to 10: what is left of it is rescaled to the
// new rate (adapt_pace.lua), on the stand-in as on Redis.
func TestAdaptivePaceRescalesAfterRateChange(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b, err := NewGCRA(srv.Client(), "rescale", 10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	set := func(rate float64) { t.Helper(); setAdaptiveRate(t, storeOf(b), rate) }
	set(0.01)
	if p, err := storeOf(b).PaceAdaptive(ctx, "", 1, time.Second, 250*time.Millisecond); err != nil || !p.Granted {
		t.Fatalf("first slot: %+v, %v", p, err)
	}
	if p, err := storeOf(b).PaceAdaptive(ctx, "", 1, time.Second, 250*time.Millisecond); err != nil || p.Granted || p.Delay < 90*time.Second {
		t.Fatalf("second slot at 0.01 per interval: %+v, %v; want refused for about 100s", p, err)
	}
	set(10)
	p, err := storeOf(b).PaceAdaptive(ctx, "", 1, time.Second, 250*time.Millisecond)
	if err != nil || !p.Granted || p.Delay > 110*time.Millisecond {
		t.Fatalf("at 10 per interval: %+v, %v; want granted within about 100ms (the slot left, rescaled)", p, err)
	}
}

// TestAdaptivePaceIncreaseKeepsReservedSlotsApart: slots reserved at 40
// per interval keep their times when the rate goes to 80; the next comes
// one new spacing (12.5 ms) after the last reserved, on the server's
// clock. The next-slot key stays a plain integer, as scripts before the
// rescale read it (a rolling deploy).
func TestAdaptivePaceIncreaseKeepsReservedSlotsApart(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b, err := NewGCRA(srv.Client(), "apart", 100, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	set := func(rate float64) { t.Helper(); setAdaptiveRate(t, storeOf(b), rate) }
	set(40)
	var last time.Time
	for range 100 {
		p, err := storeOf(b).PaceAdaptive(ctx, "", 1, time.Second, 250*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if !p.Granted {
			break
		}
		last = p.State.At.Add(p.Delay)
	}
	set(80)
	p, err := storeOf(b).PaceAdaptive(ctx, "", 1, time.Second, time.Second)
	if err != nil || !p.Granted {
		t.Fatalf("at 80: %+v, %v", p, err)
	}
	gap := p.State.At.Add(p.Delay).Sub(last)
	if gap < time.Second/80-time.Microsecond || gap > time.Second/80+time.Millisecond {
		t.Errorf("the first slot at 80 per interval comes %v after the last reserved at 40, want %v", gap, time.Second/80)
	}
	keys, err := b.adaptKeys("")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := srv.Client().Get(ctx, keys[1]).Result()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := strconv.ParseInt(raw, 10, 64); err != nil {
		t.Errorf("next-slot key %q = %q: want a plain integer", keys[1], raw)
	}
}

// setAdaptiveRate makes b's own budget adapt at rate per interval.
func setAdaptiveRate(t *testing.T, b throttle.AdaptiveStore, rate float64) {
	t.Helper()
	ctx := context.Background()
	old, _, err := b.SwapAdaptive(ctx, "", throttle.AdaptiveState{Version: -1}, throttle.AdaptiveState{}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.SwapAdaptive(ctx, "", old, throttle.AdaptiveState{Rate: rate, Peak: rate}, time.Minute); err != nil || !ok {
		t.Fatalf("SwapAdaptive: %v, %v", ok, err)
	}
}

// storeOf is b's store of the adaptive rate.
func storeOf(b throttle.Bucket) throttle.AdaptiveStore {
	s, _ := throttle.BucketAs[throttle.AdaptiveStore](b)
	return s
}
