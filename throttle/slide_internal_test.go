package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const ms = int64(time.Millisecond)

// grantOf is a token bucket's answer to a take at asked of a period of
// limit permits per second that started at start, with left remaining.
func grantOf(limit, left, start, asked int64) Decision {
	return Decision{Granted: true, Limit: limit, Remaining: left, Reset: time.Duration(start + 1000*ms - asked)}
}

// Each grant kept to the sliding view goes no sooner than an interval
// after the grant a limit before it; a slot beyond the caller's room is
// not claimed. (Times on the base are never 0: it starts a second early.)
func TestSlidingViewHoldsAGrantAnIntervalAfterTheOneALimitBefore(t *testing.T) {
	var v slidingView
	for i, at := range []int64{1000, 1100, 1200} { // fewer than a limit in the last interval: at once
		wait, ok := v.claim(1, grantOf(3, 2-int64(i), 1000*ms, at*ms), at*ms, at*ms, 1000*ms, time.Second)
		assert.True(t, ok)
		assert.Zero(t, wait)
	}
	assert.Equal(t, 500*time.Millisecond, v.ahead(1500*ms, 1000*ms), "the next slot is an interval after the first grant")
	claim := func(left int64, room time.Duration) (time.Duration, bool) {
		return v.claim(1, grantOf(3, left, 2000*ms, 2000*ms), 2000*ms, 2000*ms, 1000*ms, room)
	}
	wait, ok := claim(2, time.Second)
	assert.True(t, ok)
	assert.Zero(t, wait)
	wait, ok = claim(1, 50*time.Millisecond)
	assert.False(t, ok, "its slot, 100 ms on, is beyond its room")
	assert.Equal(t, 100*time.Millisecond, wait)
	wait, ok = claim(1, time.Second)
	assert.True(t, ok)
	assert.Equal(t, 100*time.Millisecond, wait, "the refused claim took no slot")
	wait, ok = claim(0, time.Second)
	assert.True(t, ok)
	assert.Equal(t, 200*time.Millisecond, wait)
}

// An instance that made a third of the fleet's grants in the last period
// keeps its own grants a third of the limit apart: with like traffic on
// every instance, the fleet's grants keep the limit in any window.
func TestSlidingViewKeepsToTheInstancesShareOfTheFleet(t *testing.T) {
	var v slidingView
	for i := range int64(3) { // its grants 2, 5 and 8 of the period's 9
		at := 1000*ms + 100*i*ms
		wait, ok := v.claim(1, grantOf(9, 6-3*i, 1000*ms, at), at, at, 1000*ms, time.Second)
		assert.True(t, ok)
		assert.Zero(t, wait)
	}
	at := 2000 * ms // the next period: its first grant, the fleet's first
	wait, ok := v.claim(1, grantOf(9, 8, at, at), at, at, 1000*ms, time.Second)
	assert.True(t, ok)
	assert.Zero(t, wait, "an interval after its grant 3 before")
	wait, ok = v.claim(1, grantOf(9, 5, at, at), at, at, 1000*ms, time.Second)
	assert.True(t, ok)
	assert.Equal(t, 100*time.Millisecond, wait, "an interval after its second grant of the last period")
}

// Above maxSlidingView, the view keeps one time per group of grants, the
// group's first: at most maxSlidingView times.
func TestSlidingViewOfALargeLimitKeepsOneTimePerGroup(t *testing.T) {
	var v slidingView
	for i := range int64(300) {
		at := 1000*ms + i*ms
		wait, ok := v.claim(1, grantOf(300, 299-i, 1000*ms, at), at, at, 1000*ms, time.Second)
		assert.True(t, ok)
		assert.Zero(t, wait)
	}
	assert.Equal(t, int64(3), v.group)
	assert.Len(t, v.times, 100)
	assert.Equal(t, 700*time.Millisecond, v.ahead(1300*ms, 1000*ms), "an interval after the first group's first grant")
}

// The period view places the next grant after the permits granted in the
// period it last heard of, and knows nothing once that period ends.
func TestPeriodViewPlacesTheNextGrant(t *testing.T) {
	var p periodView
	assert.Zero(t, p.ahead(0, 1000*ms), "no period heard of")
	p.note(0, Decision{Granted: true, Limit: 4, Remaining: 2, Reset: time.Second}, 1000*ms)
	assert.Equal(t, 375*time.Millisecond, p.ahead(100*ms, 1000*ms), "2 granted: the next place is 2/4 of 95 % in")
	p.note(10*ms, Decision{Granted: true, Limit: 4, Remaining: 3, Reset: 990 * time.Millisecond}, 1000*ms)
	assert.Equal(t, 375*time.Millisecond, p.ahead(100*ms, 1000*ms), "an older answer of the same period lowers nothing")
	p.note(20*ms, Decision{Limit: 4, Remaining: 0, Reset: 980 * time.Millisecond}, 1000*ms)
	assert.Equal(t, 850*time.Millisecond, p.ahead(100*ms, 1000*ms), "spent: the last place")
	assert.Zero(t, p.ahead(1000*ms, 1000*ms), "the period has ended")
	p.note(1000*ms, Decision{Granted: true, Limit: 4, Remaining: 3, Reset: time.Second}, 1000*ms)
	assert.Equal(t, 237500*time.Microsecond, p.ahead(1000*ms, 1000*ms), "the next period")
}

// slowPeriod is a periodic bucket of 10 permits per second whose Take
// takes 990 ms on the fake clock and grants the period's last permit in a
// period lengthened to end 1.5 s after the take (its place 1.355 s on);
// its Refund does not answer (it ends with its context, and then closes
// refunded).
type slowPeriod struct {
	clock    *clockwork.FakeClock
	refunded chan struct{}
}

func (b *slowPeriod) Take(context.Context, string, int64, time.Duration) (Decision, error) {
	b.clock.Advance(990 * time.Millisecond)
	return Decision{Granted: true, Limit: 10, Remaining: 0, Reset: 1500 * time.Millisecond}, nil
}

func (b *slowPeriod) Refund(ctx context.Context, _ string, _ int64) error {
	defer close(b.refunded)
	<-ctx.Done()
	return ctx.Err()
}

func (b *slowPeriod) Periodic() bool { return true }

func (b *slowPeriod) Fallback() (int64, time.Duration, int64) { return 10, time.Second, 1 }

// A placed caller whose place turns out to lie beyond what is left of its
// wait gives its permit back within its wait, as every give-back of a
// wait is: a store that does not answer the refund does not keep it for
// the store timeout (nor the give-back's whole second).
func TestAPlaceBeyondTheWaitIsGivenBackWithinTheWait(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &slowPeriod{clock: clock, refunded: make(chan struct{})}
	// A store timeout longer than a give-back's whole second.
	lim := New(b, WithClock(clock), WithStoreTimeout(3*time.Second))
	err := lim.Acquire(context.Background(), time.Second) // 10 ms left after the take
	assert.ErrorIs(t, err, ErrTimeout, "its place is beyond its wait")
	select {
	case <-b.refunded:
		t.Error("the caller was kept until the refund ended, past its wait's end")
	default:
	}
	require.NoError(t, lim.Close())
	<-b.refunded
}
