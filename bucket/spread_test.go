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

// latePeriod starts key's period of tb (10 per 10 s) with one grant, as
// an earlier fleet that trickled would, and moves the server's record of
// it 6 s on: its end (the tokens key's expiry, and its limit key's) 4 s
// away. It returns the Redis keys of key's budget.
func latePeriod(t *testing.T, tb *TokenBucket, key string) []string {
	t.Helper()
	ctx := context.Background()
	if d, err := tb.Take(ctx, key, 1, 0); err != nil || !d.Granted || d.Remaining != 9 {
		t.Fatalf("the earlier fleet's take: %+v, %v; want a fresh period", d, err)
	}
	keys, err := tb.keys(key)
	require.NoError(t, err)
	require.NoError(t, tb.rdb.PExpire(ctx, keys[0], 4*time.Second).Err())
	require.NoError(t, tb.rdb.PExpire(ctx, keys[3], phaseHold+4*time.Second).Err())
	return keys
}

// TestTokenBucketLateTakeStartsItsPlacesAnew: a take that finds its
// period behind the Limiter's pace (the period's 2nd token taken 6 s into
// a period of 10 s, whose 2nd place was 950 ms in) lengthens the period
// so that the period's remaining tokens have as much of the interval
// ahead of them as in a fresh period: a take of several (a process's
// coalesced crowd) to end an interval after the start that makes its
// place now, a take of one to put its place counted over the whole
// interval (not 95 % of it) at now. Takes at or ahead of the pace, and
// periods above a minute (not spread), keep their end.
func TestTokenBucketLateTakeStartsItsPlacesAnew(t *testing.T) {
	rdb := redisenv.New(t).Client()
	ctx := context.Background()
	const interval = 10 * time.Second
	earlier, err := NewTokenBucket(rdb, "late", 10, interval)
	require.NoError(t, err)
	latePeriod(t, earlier, "a")
	latePeriod(t, earlier, "crowd")
	// A new fleet: an instance that knows nothing of the period.
	tb, err := NewTokenBucket(rdb, "late", 10, interval)
	require.NoError(t, err)
	d, err := tb.Take(ctx, "a", 1, throttle.Forever)
	require.NoError(t, err)
	require.True(t, d.Granted)
	require.Equal(t, int64(8), d.Remaining)
	// The 2nd place over the whole interval, 1 s after the period's new
	// start, is now.
	want := interval - time.Second
	require.LessOrEqual(t, d.Reset, want+time.Millisecond, "%+v", d)
	require.GreaterOrEqual(t, d.Reset, want-100*time.Millisecond, "the period was not lengthened: %+v", d)
	// The 3rd token right after: ahead of the new pace, the end stays.
	d2, err := tb.Take(ctx, "a", 1, throttle.Forever)
	require.NoError(t, err)
	require.True(t, d2.Granted)
	require.LessOrEqual(t, d2.Reset, d.Reset, "a take ahead of the pace moved the end")

	// A crowd's take of up to 5 puts the 2nd place at now.
	u, err := tb.run(ctx, "crowd", -5)
	require.NoError(t, err)
	require.Equal(t, int64(5), u.got)
	want = interval - 950*time.Millisecond
	require.LessOrEqual(t, u.granted.Reset, want+time.Millisecond, "%+v", u.granted)
	require.GreaterOrEqual(t, u.granted.Reset, want-100*time.Millisecond, "the period was not lengthened: %+v", u.granted)

	// A fresh period's crowd is ahead of the pace: no take moves its end.
	var last time.Duration = interval
	for i := range 10 {
		d, err := tb.Take(ctx, "b", 1, throttle.Forever)
		require.NoError(t, err)
		require.True(t, d.Granted, "take %d", i)
		require.LessOrEqual(t, d.Reset, last, "take %d moved the end", i)
		last = d.Reset
	}

	// A daily quota is no pace: its period keeps its end.
	daily, err := NewTokenBucket(rdb, "late-daily", 10, 24*time.Hour)
	require.NoError(t, err)
	d, err = daily.Take(ctx, "", 1, throttle.Forever)
	require.NoError(t, err)
	require.True(t, d.Granted)
	keys, err := daily.keys("")
	require.NoError(t, err)
	require.NoError(t, rdb.PExpire(ctx, keys[0], time.Hour).Err())
	u, err = daily.run(ctx, "", -5)
	require.NoError(t, err)
	require.True(t, u.granted.Granted)
	require.LessOrEqual(t, u.granted.Reset, time.Hour, "a daily period was lengthened")
}

// TestTokenBucketEvenPaceKeepsItsPeriod: callers paced evenly at the
// limit's rate (an adaptive rate, one at a time) lag the Limiter's places
// by up to a twentieth of the interval at the period's end; their takes
// do not lengthen the period, so it does not stop them at its end.
func TestTokenBucketEvenPaceKeepsItsPeriod(t *testing.T) {
	rdb := redisenv.New(t).Client()
	ctx := context.Background()
	tb, err := NewTokenBucket(rdb, "even", 10, 10*time.Second)
	require.NoError(t, err)
	d, err := tb.Take(ctx, "", 1, throttle.Forever)
	require.NoError(t, err)
	require.True(t, d.Granted)
	keys, err := tb.keys("")
	require.NoError(t, err)
	// The 10th token, taken 8.9 s into the period: the Limiter's place
	// (8.55 s in) has passed, the place over the whole interval (9 s
	// in) not.
	require.NoError(t, rdb.Set(ctx, keys[0], 1, 1100*time.Millisecond).Err())
	d, err = tb.Take(ctx, "", 1, throttle.Forever)
	require.NoError(t, err)
	require.True(t, d.Granted)
	require.LessOrEqual(t, d.Reset, 1100*time.Millisecond, "an even pace lengthened the period: %+v", d)
}

// TestTokenBucketCrowdLateInAPeriodIsSpread: a new fleet whose crowd
// comes 6 s into a period of 10 s that an earlier fleet started with one
// grant (a fleet starting on a used key) goes at the limit's
// pace, as a crowd at a fresh period's start does: one every 950 ms.
// Before, the crowd found its places passed and took the period's 9
// tokens at once, 4 s before the next period's first grants.
func TestTokenBucketCrowdLateInAPeriodIsSpread(t *testing.T) {
	rdb := redisenv.New(t).Client()
	earlier, err := NewTokenBucket(rdb, "late-crowd", 10, 10*time.Second)
	require.NoError(t, err)
	latePeriod(t, earlier, "api")

	b, err := NewTokenBucket(rdb, "late-crowd", 10, 10*time.Second)
	require.NoError(t, err)
	clock := clockwork.NewFakeClock()
	lim := throttle.New(b, throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	k := lim.Key("api")

	done := make(chan error, 9)
	for range 9 {
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
		require.NoError(t, clock.BlockUntilContext(wctx, sleepers), "the other callers do not wait for their places")
		select {
		case err := <-done:
			t.Fatalf("a grant came before its place in the period (err %v)", err)
		default:
		}
	}
	// The first take, of one token, puts its place over the whole
	// interval at now (the Limiter's, over 95 % of it, 50 ms ago): its
	// grant goes at once, the next one 900 ms on.
	expect(1, 8)
	clock.Advance(900 * time.Millisecond)
	expect(1, 7)
	for i := 6; i >= 0; i-- {
		clock.Advance(950 * time.Millisecond)
		expect(1, i)
	}
}
