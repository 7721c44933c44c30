package bucket

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// TestAdaptiveCallCutByContextRaceFree: with a client that ignores context
// deadlines (ContextTimeoutEnabled off), a call to the adaptive state cut
// off by its context returns at once while its round trip goes on in the
// background; the caller must not read what that round trip later writes.
// Regression: SwapAdaptive and PaceAdaptive returned variables that the
// background round trip wrote (a data race seen by -race in the end-to-end
// test).
func TestAdaptiveCallCutByContextRaceFree(t *testing.T) {
	t.Parallel()
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "CLIENT PAUSE")
	o := srv.ClientOptions()
	o.ContextTimeoutEnabled = false
	rdb := redis.NewClient(o)
	t.Cleanup(func() { rdb.Close() })
	tb, err := NewTokenBucket(rdb, "adapt-race", 10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	admin := srv.Client()
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()
	// Load the scripts first, so that the paused call is the script itself.
	if _, _, err := tb.SwapAdaptive(ctx, "", throttle.AdaptiveState{Version: -1}, throttle.AdaptiveState{}, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.PaceAdaptive(ctx, "", 1, time.Second, 0); err != nil {
		t.Fatal(err)
	}
	for _, call := range []func(context.Context) error{
		func(ctx context.Context) error {
			_, _, err := tb.SwapAdaptive(ctx, "", throttle.AdaptiveState{Version: -1}, throttle.AdaptiveState{}, time.Millisecond)
			return err
		},
		func(ctx context.Context) error {
			_, err := tb.PaceAdaptive(ctx, "", 1, time.Second, 0)
			return err
		},
	} {
		if err := admin.Do(ctx, "CLIENT", "PAUSE", 150, "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		err := call(cctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a call cut off by its context: %v, want context.DeadlineExceeded in the chain", err)
		}
		// Let the background round trip finish (and write) while this
		// goroutine has already read the call's results.
		waitInflight(t, &tb.common)
	}
}
