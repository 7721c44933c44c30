package bucket

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
)

// phaseHold mirrors HOLD in tb_take.lua: how long the period's limit key
// outlives the period.
const phaseHold = 60 * time.Second

// caseBucket is a token bucket of 10 per period under prefix for case i of
// a table, with its own key ('a' + i) and that key's Redis keys.
func caseBucket(t *testing.T, rdb redis.UniversalClient, prefix string, period time.Duration, i int) (*TokenBucket, string, []string) {
	t.Helper()
	tb, err := NewTokenBucket(rdb, prefix, 10, period)
	if err != nil {
		t.Fatal(err)
	}
	key := string(rune('a' + i))
	keys, err := tb.keys(key)
	if err != nil {
		t.Fatal(err)
	}
	return tb, key, keys
}

// TestTokenBucketKeepsPhaseAfterOutage: a period that starts
// within the last tenth of a period of the phase before a gap is
// lengthened to end on that phase when a caller that saw the store fail
// meets it: by the refill itself, or by the first such caller after an
// unaware refill (a take queued in the paused server); never for callers
// that saw no outage, never for a period that starts further from an old
// boundary. The previous period's end is set by hand (its limit key's
// expiry), so no test waits on the clock.
func TestTokenBucketKeepsPhaseAfterOutage(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	const period = time.Second
	cases := []struct {
		name      string
		gap       time.Duration // since the previous period ended
		aware     bool          // the refilling caller saw the outage
		later     bool          // a caller who saw it takes after the refill
		wantTTL   time.Duration // the period's length
		wantPhase bool          // the lengthening left for a later caller
	}{
		{"aware refill", 1950 * time.Millisecond, true, false, 1050 * time.Millisecond, false},
		{"unaware refill, aware caller", 1950 * time.Millisecond, false, true, 1050 * time.Millisecond, false},
		{"unaware refill, aware caller, just before a boundary", 2990 * time.Millisecond, false, true, 1010 * time.Millisecond, false},
		{"unaware refill only", 1950 * time.Millisecond, false, false, period, true},
		{"aware refill after a long gap", 59950 * time.Millisecond, true, false, 1050 * time.Millisecond, false},
		{"a tenth before a boundary", 1900 * time.Millisecond, true, false, 1100 * time.Millisecond, false},
		{"more than a tenth before", 1880 * time.Millisecond, true, false, period, false},
		{"mid-period start kept", 1600 * time.Millisecond, false, true, period, false},
		{"on the old phase", 2000 * time.Millisecond, true, false, period, false},
		{"just after a boundary", 2005 * time.Millisecond, true, false, period, false},
		{"no gap", 3 * time.Millisecond, true, false, period, false},
		{"gap beyond the hold", 61 * time.Second, true, false, period, false},
		{"previous end unknown", -1, true, false, period, false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tb, key, keys := caseBucket(t, rdb, "phase", period, i)
			if tc.gap >= 0 && tc.gap < phaseHold {
				// The previous period ended gap ago: its limit key has
				// HOLD - gap left.
				if err := rdb.Set(ctx, keys[3], 10, phaseHold-tc.gap).Err(); err != nil {
					t.Fatal(err)
				}
			}
			take := func(aware bool) throttle.Decision {
				t.Helper()
				tb.outage = outageClock{}
				if aware {
					tb.outage.failed(time.Now().UnixNano())
				}
				d, err := tb.Take(ctx, key, 1, 0)
				if err != nil || !d.Granted {
					t.Fatalf("take: %+v, %v", d, err)
				}
				return d
			}
			start := time.Now()
			d := take(tc.aware)
			if tc.later {
				d = take(true)
			}
			took := time.Since(start) // the refill is at most this long before d's take
			pttl := rdb.PTTL(ctx, keys[0]).Val()
			// A round trip or two have passed since the refill.
			if pttl > tc.wantTTL || pttl < tc.wantTTL-150*time.Millisecond {
				t.Errorf("period left %v, want about %v", pttl, tc.wantTTL)
			}
			// The take's own answer: exact for a refill, short by the time
			// since the refill for a take just after one (a loaded machine
			// stretches it: measured, not assumed).
			if d.Reset > tc.wantTTL || d.Reset < tc.wantTTL-took-2*time.Millisecond {
				t.Errorf("Decision.Reset %v, want about %v", d.Reset, tc.wantTTL)
			}
			if capTTL := rdb.PTTL(ctx, keys[3]).Val(); capTTL < pttl+phaseHold-50*time.Millisecond || capTTL > pttl+phaseHold+50*time.Millisecond {
				t.Errorf("limit key expires in %v, want the period's end + %v (%v)", capTTL, phaseHold, pttl+phaseHold)
			}
			if got := rdb.Exists(ctx, keys[5]).Val() == 1; got != tc.wantPhase {
				t.Errorf("phase key present %v, want %v", got, tc.wantPhase)
			}
			if got := rdb.Get(ctx, keys[0]).Val(); got != "9" && !tc.later || got != "8" && tc.later {
				t.Errorf("tokens left %q: lengthening must not add or take any", got)
			}
		})
	}
}

// TestTokenBucketNotesStoreFailures: a take cut off by a stalled Redis
// starts the outage clock that asks for the old phase; a take cancelled by
// its caller does not, and the clock runs out one interval and a second
// after the last failure.
func TestTokenBucketNotesStoreFailures(t *testing.T) {
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "SIGSTOP")
	tb, err := NewTokenBucket(shortClient(t, srv.Addr()), "notes", 10, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := tb.Take(cancelled, "", 1, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("take with a cancelled context: %v, want context.Canceled", err)
	}
	if tb.outage.recent(time.Now().UnixNano(), tb.outageWindow()) {
		t.Fatal("a cancelled take counted as a store failure")
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err = tb.Take(ctx, "", 1, 0)
	stop()
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	var be *throttle.BackendError
	if !errors.As(err, &be) {
		t.Fatalf("take against a stopped Redis: %v, want a *throttle.BackendError", err)
	}
	now := time.Now().UnixNano()
	if !tb.outage.recent(now, tb.outageWindow()) {
		t.Fatal("a take cut off by a stopped Redis did not count as a store failure")
	}
	if tb.outage.recent(now+tb.outageWindow()+1, tb.outageWindow()) {
		t.Error("a failure still counts one window after it")
	}
	waitInflight(t, &tb.common)
}

// TestTokenBucketNotesSlowReplies: a reply slower than slowReply (a
// paused Redis answering the takes queued in its connections as it
// resumes) counts as a store failure too, though the take succeeds.
func TestTokenBucketNotesSlowReplies(t *testing.T) {
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "SIGSTOP")
	tb, err := NewTokenBucket(srv.Client(), "slow", 10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Take(context.Background(), "", 1, 0); err != nil {
		t.Fatal(err)
	}
	if tb.outage.recent(time.Now().UnixNano(), tb.outageWindow()) {
		t.Fatal("a prompt reply counted as a store failure")
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := tb.Take(context.Background(), "", 1, 0)
		done <- err
	}()
	// The take is in the stopped server's socket; it cannot be answered
	// before the resume, however long this timer takes.
	<-time.After(2 * slowReply)
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("take across the pause: %v", err)
	}
	if !tb.outage.recent(time.Now().UnixNano(), tb.outageWindow()) {
		t.Error("a reply delayed by a pause did not count as a store failure")
	}
}

func TestOutageClock(t *testing.T) {
	var o outageClock
	const ms = int64(time.Millisecond)
	win := 1200 * ms
	if o.recent(5000*ms, win) {
		t.Fatal("recent before any failure")
	}
	o.failed(1000 * ms)
	if !o.recent(1000*ms, win) || !o.recent(1000*ms+win, win) {
		t.Error("a failure is not recent within its window")
	}
	if o.recent(1000*ms+win+1, win) {
		t.Error("a failure is recent after its window")
	}
}

// TestTokenBucketOwnDeadlineIsNoOutage: a caller whose own
// deadline cuts a take short while Redis is healthy, or who cancels it,
// does not make the instance ask for the old phase; it used to, for an
// interval and a second, and a period an unaware refill had marked was
// then lengthened without any outage.
func TestTokenBucketOwnDeadlineIsNoOutage(t *testing.T) {
	srv := redisenv.New(t)
	tb, err := NewTokenBucket(srv.Client(), "own-deadline", 1000, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	lim := throttle.New(tb)
	if err := lim.Acquire(context.Background(), time.Second); err != nil { // loads the script
		t.Fatal(err)
	}
	for _, d := range []time.Duration{0, 20 * time.Microsecond, 100 * time.Microsecond, time.Millisecond} {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		_ = lim.Acquire(ctx, time.Second)
		_, _ = tb.Take(ctx, "", 1, 0)
		cancel()
		if tb.outage.recent(time.Now().UnixNano(), tb.outageWindow()) {
			t.Errorf("a caller's own %v deadline on a healthy Redis counted as a store failure", d)
		}
	}
}

// TestTokenBucketTinyPeriodsKeepTheirPace: with periods of 1 or
// 2 ms, a tenth of a period is under a millisecond, so nothing is ever
// lengthened; a refill on the old phase never is. A 1 ms period used to be
// lengthened at every refill by a caller that saw an outage (a third of
// the grants lost).
func TestTokenBucketTinyPeriodsKeepTheirPace(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	for _, tc := range []struct {
		period, gap time.Duration
	}{
		{time.Millisecond, 5 * time.Second},
		{time.Millisecond, 1 * time.Millisecond},
		{2 * time.Millisecond, 5 * time.Second},
		{2 * time.Millisecond, 1 * time.Millisecond},
		{5 * time.Millisecond, 5 * time.Second},
	} {
		tb, err := NewTokenBucket(rdb, fmt.Sprintf("tiny-%v-%v", tc.period, tc.gap), 1, tc.period)
		if err != nil {
			t.Fatal(err)
		}
		keys, _ := tb.keys("")
		if err := rdb.Set(ctx, keys[3], 1, phaseHold-tc.gap).Err(); err != nil {
			t.Fatal(err)
		}
		tb.outage.failed(time.Now().UnixNano())
		d, err := tb.Take(ctx, "", 1, 0)
		if err != nil || !d.Granted {
			t.Fatalf("period %v: %+v, %v", tc.period, d, err)
		}
		if d.Reset > tc.period {
			t.Errorf("period %v, previous end %v ago: lengthened to %v", tc.period, tc.gap, d.Reset)
		}
	}
}

// TestTokenBucketKeepsALostPeriod (Redis restarted empty): a
// take from an instance that was told of a period still running on the
// server's clock, meeting a server with no record of it, starts no period:
// the tokens stay at 0 until that end, for every instance. Without a loss
// (the server recorded the period's end, or the take carries an end that
// has passed: it was delayed on its way), the refill is as usual. The
// instance's knowledge and the server's record are set by hand, on the
// server's clock, so no case waits on it.
func TestTokenBucketKeepsALostPeriod(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	const period = time.Second
	const none = time.Duration(-1 << 62)
	cases := []struct {
		name     string
		known    time.Duration // the end the instance knows, from the server's now; 0: none
		recorded time.Duration // the end on record (tb:cap), from now; none: no record
		hold     time.Duration // 0: a usual refill
	}{
		{"restarted empty", 600 * time.Millisecond, none, 600 * time.Millisecond},
		{"refill lost", 700 * time.Millisecond, -300 * time.Millisecond, 700 * time.Millisecond},
		{"tokens key lost", 400 * time.Millisecond, 400 * time.Millisecond, 400 * time.Millisecond},
		{"tokens key lost, the record ends later", 400 * time.Millisecond, 450 * time.Millisecond, 450 * time.Millisecond},
		{"a take delayed past the end it knew", -20 * time.Millisecond, -20 * time.Millisecond, 0},
		{"a take delayed past the end, restarted empty", -20 * time.Millisecond, none, 0},
		{"the known end within the clock's rounding", time.Millisecond, 0, 0},
		{"the record within half a period of the known end", 400 * time.Millisecond, -90 * time.Millisecond, 0},
		{"nothing known", 0, none, 0},
		// No period runs longer than a lengthened one (another server's
		// clock far ahead of this one's).
		{"an end further ahead than any period", time.Hour, none, 1100 * time.Millisecond},
		{"an end further ahead, the record intact", time.Hour, -10 * time.Millisecond, 1100 * time.Millisecond},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tb, key, keys := caseBucket(t, rdb, "lost", period, i)
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if tc.recorded != none {
				if err := rdb.Set(ctx, keys[3], 10, phaseHold+tc.recorded).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if tc.known != 0 {
				at := now.UnixMilli()
				tb.ends.note(key, at+tc.known.Milliseconds(), at)
			}
			d, err := tb.Take(ctx, key, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			if tc.hold == 0 {
				if !d.Granted || d.Remaining != 9 || d.Reset < period-50*time.Millisecond {
					t.Fatalf("want a usual refill (granted, 9 left, a whole period), got %+v", d)
				}
				return
			}
			// The server's clock moved on since it was read (a loaded
			// machine may take a while between the two calls).
			if d.Granted || d.Remaining != 0 || d.Delay > tc.hold+time.Millisecond || d.Delay < tc.hold-250*time.Millisecond {
				t.Fatalf("want a refusal until the lost period's end (%v), got %+v", tc.hold, d)
			}
			// Every instance, knowing nothing, finds the period held.
			other, err := NewTokenBucket(rdb, "lost", 10, period)
			if err != nil {
				t.Fatal(err)
			}
			if d, err := other.Take(ctx, key, 1, 0); err != nil || d.Granted {
				t.Fatalf("another instance: %+v, %v; want a refusal", d, err)
			}
			if left := rdb.PTTL(ctx, keys[3]).Val(); left < phaseHold || left > phaseHold+tc.hold {
				t.Fatalf("the period's limit key lives %v, want the hold and the minute", left)
			}
		})
	}
}

// TestTokenBucketDelayedTakeHoldsNothing: a take sent just before its
// period's end, held in a stalled server (SIGSTOP) until after it, finds
// nothing lost: it refills as usual. (Counted from its send, the end it
// knew would still have been ahead of it.)
func TestTokenBucketDelayedTakeHoldsNothing(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	const period = 200 * time.Millisecond
	tb, err := NewTokenBucket(srv.Client(), "delayed", 10, period)
	if err != nil {
		t.Fatal(err)
	}
	d, err := tb.Take(ctx, "", 1, 0)
	if err != nil || !d.Granted {
		t.Fatalf("first take: %+v, %v", d, err)
	}
	time.Sleep(d.Reset - 60*time.Millisecond) // the server's period: 60 ms before its end
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	got := make(chan throttle.Decision, 1)
	go func() {
		d, err := tb.Take(ctx, "", 1, 0)
		if err != nil {
			t.Error(err)
		}
		got <- d
	}()
	time.Sleep(200 * time.Millisecond) // the stall: past the period's end
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if d := <-got; !d.Granted || d.Remaining != 9 {
		t.Fatalf("the delayed take: %+v; want a usual refill (granted, 9 left)", d)
	}
}

// TestTokenBucketRestartedEmptyKeepsThePhase: after FLUSHALL (what a
// restart without persistence leaves), the fleet's next period starts
// where the lost one ended, with all its tokens.
func TestTokenBucketRestartedEmptyKeepsThePhase(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	ctx := context.Background()
	const period = 300 * time.Millisecond
	tb, err := NewTokenBucket(rdb, "flushed", 5, period)
	if err != nil {
		t.Fatal(err)
	}
	d, err := tb.Take(ctx, "", 1, 0)
	if err != nil || !d.Granted {
		t.Fatalf("first take: %+v, %v", d, err)
	}
	end := time.Now().Add(d.Reset)
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	d, err = tb.Take(ctx, "", 1, 0)
	if err != nil || d.Granted {
		t.Fatalf("after the flush: %+v, %v; want a refusal until the lost period's end", d, err)
	}
	if until := time.Until(end); d.Delay > until+5*time.Millisecond {
		t.Fatalf("refused for %v, but the lost period ends in %v", d.Delay, until)
	}
	time.Sleep(d.Delay) // the server's clock: the held period must end
	var granted throttle.Decision
	for range 50 { // a retry or two if the sleep ended an instant early
		if granted, err = tb.Take(ctx, "", 1, 0); err != nil || granted.Granted {
			break
		}
		time.Sleep(granted.Delay)
	}
	if err != nil || !granted.Granted || granted.Remaining != 4 {
		t.Fatalf("after the lost period: %+v, %v; want a fresh period, 4 left", granted, err)
	}
	// The new period ends one period after the lost one did, less the
	// reply's time in transit, plus how late this caller asked after the
	// hold (a timer on a loaded machine).
	if got := time.Until(end.Add(period)) - granted.Reset; got < -50*time.Millisecond || got > 30*time.Millisecond {
		t.Fatalf("the new period ends %v off the lost period's phase", got)
	}
}
