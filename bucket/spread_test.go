package bucket

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// TestTokenBucketGrantsAreSpreadOverThePeriod: a crowd of callers at a
// period's start goes one every limit-th of the interval, at the place the
// token bucket's own
// answer (its period's limit, tokens left and end) gives each grant, its
// coalesced takes included. The Limiter sleeps on a fake clock; the bucket
// counts on the Redis server's.
func TestTokenBucketGrantsAreSpreadOverThePeriod(t *testing.T) {
	rdb := redisenv.New(t).Client()
	b, err := NewTokenBucket(rdb, "spread", 10, 10*time.Second)
	require.NoError(t, err)
	clock := clockwork.NewFakeClock()
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	k := lim.Key("api")

	done := make(chan error, 10)
	for range 10 {
		go func() { done <- k.Acquire(ctx, time.Minute) }()
	}
	expect := func(grants, sleepers int) {
		t.Helper()
		for range grants {
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(5 * time.Second):
				t.Fatal("a grant did not come")
			}
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		require.NoError(t, clock.BlockUntilContext(wctx, sleepers))
		select {
		case err := <-done:
			t.Fatalf("a grant came before its place in the period (err %v)", err)
		default:
		}
	}
	expect(1, 9) // the period's first token at once
	for i := 8; i >= 0; i-- {
		// The places are 950 ms apart (95 % of the interval over 10),
		// less the few real milliseconds the period ran on the server
		// before each answer.
		clock.Advance(950 * time.Millisecond)
		expect(1, i)
	}
}
