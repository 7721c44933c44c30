package throttle

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Edge cases of the adaptive law (and one of the errors Acquire returns).

// thousandths is what the Redis buckets keep of each rate: thousandths,
// rounded down as milli does.
func thousandths(s AdaptiveState) AdaptiveState {
	r := func(v float64) float64 { return float64(milli(v)) / 1000 }
	s.Rate, s.Ceiling, s.Peak, s.Step = r(s.Rate), r(s.Ceiling), r(s.Peak), r(s.Step)
	return s
}

// TestAdaptLawTopCapSurvivesRounding: refused at 0.98 of a limit of 7
// (6.86, kept as 6.859), the fleet was refused at its top; rounding must
// not give it back the whole ceiling to probe into.
func TestAdaptLawTopCapSurvivesRounding(t *testing.T) {
	law, clock := adaptLaw{limit: 7, interval: time.Second}, clockwork.NewFakeClock()
	top := adaptTop * law.limit // 6.8599999…
	s := thousandths(AdaptiveState{Rate: 6.5, Peak: top, Step: 0.28, Decreased: clock.Now()})
	assert.InDelta(t, top, law.top(s), 1e-9)
	truncated := s
	truncated.Peak = 6.859 // what a plain truncation kept before
	assert.InDelta(t, 7, law.top(truncated), 1e-9, "a Peak a thousandth below the top is below it")
	for range 30 {
		clock.Advance(time.Second)
		if next, ok := law.increase(s, clock.Now()); ok {
			s = thousandths(next)
		}
	}
	assert.LessOrEqual(t, milli(s.Rate), milli(top), "increases stop at the top")
}

// TestAdaptLawSameAdvertisedLimitAfterRounding: 100 per minute for a
// bucket per second is 1.666…, kept as 1.666: the same advertisement
// again says nothing new (no store call, no version bump).
func TestAdaptLawSameAdvertisedLimitAfterRounding(t *testing.T) {
	law, clock := adaptLaw{limit: 2, interval: time.Second}, clockwork.NewFakeClock()
	adv := 100.0 / 60
	s, changed := law.advertised(AdaptiveState{}, adv, clock.Now())
	require.True(t, changed)
	_, changed = law.advertised(thousandths(s), adv, clock.Now())
	assert.False(t, changed)
}

// TestAdaptLawStoreClockStepsBack: a failover to a node whose clock is a
// minute behind; refusals must still lower the rate, and increases still
// come.
func TestAdaptLawStoreClockStepsBack(t *testing.T) {
	law, clock := adaptLaw{limit: 100, interval: time.Second}, clockwork.NewFakeClock()
	s, _ := law.refused(AdaptiveState{}, clock.Now()) // 90
	back := clock.Now().Add(-time.Minute)
	s2, changed := law.refused(s, back)
	require.True(t, changed)
	assert.Less(t, s2.Rate, s.Rate, "a refusal lowers the rate though the store's clock stepped back")
	_, due := law.increase(s, back)
	assert.True(t, due, "and an interval without a refusal raises it")
}

// TestAdaptLawCeilingNotPinnedByConfiguredLimit: an instance configured at
// 10 was refused; one configured at 1000 (a rolling deploy) must not be
// held at 10, and the rate never exceeds the ceiling.
func TestAdaptLawCeilingNotPinnedByConfiguredLimit(t *testing.T) {
	old, neu := adaptLaw{limit: 10, interval: time.Second}, adaptLaw{limit: 1000, interval: time.Second}
	clock := clockwork.NewFakeClock()
	s, _ := old.refused(AdaptiveState{}, clock.Now())
	assert.Zero(t, s.Ceiling, "a configured limit is not stored as the fleet's ceiling")
	assert.InDelta(t, 1000, neu.ceiling(s), 1e-9)
	clock.Advance(2 * time.Second)
	s, _ = neu.refused(s, clock.Now())
	assert.LessOrEqual(t, s.Rate, neu.ceiling(s))
	assert.LessOrEqual(t, s.Rate, 9.0, "refused at 9, the rate does not go up to a floor of 50")
}

// TestAdaptLawAdvertisedFarBelowTheLimit: a provider that advertises 10
// per second to a fleet configured at 1000 is followed to 10, not held
// at the configured limit's floor (50).
func TestAdaptLawAdvertisedFarBelowTheLimit(t *testing.T) {
	law, clock := adaptLaw{limit: 1000, interval: time.Second}, clockwork.NewFakeClock()
	s, _ := law.advertised(AdaptiveState{}, 10, clock.Now())
	assert.InDelta(t, 10, s.Ceiling, 1e-9)
	assert.InDelta(t, 10, s.Rate, 1e-9)
	for range 5 {
		clock.Advance(time.Second)
		s, _ = law.refused(s, clock.Now())
	}
	assert.GreaterOrEqual(t, s.Rate, 1.0, "the floor is one permit per interval")
	assert.LessOrEqual(t, s.Rate, 10.0)
}

// TestReportRefusalWithAdvertisedLimit: a 429 that advertises 30 (of a
// configured 100) is measured against 30: the rate refused is 30, so a
// second refusal there is a gentle decrease (27), not a full one (21).
func TestReportRefusalWithAdvertisedLimit(t *testing.T) {
	clock := clockwork.NewFakeClock()
	loc, err := NewLocal(100, time.Second, WithClock(clock))
	require.NoError(t, err)
	lim := New(loc, WithClock(clock))
	ctx := context.Background()
	require.NoError(t, lim.Report(ctx, Answer{Refused: true, Limit: 30}))
	s, _ := lim.adaptiveState(ctx, "")
	assert.InDelta(t, 30, s.Peak, 1e-9)
	assert.InDelta(t, 27, s.Rate, 1e-9)
}

// TestReportRetryKeepsAdvertisedLimit: a retry time pauses, and the limit
// advertised with it still lowers the ceiling; a retry time of zero names
// no wait, so the refusal counts as one without a hint.
func TestReportRetryKeepsAdvertisedLimit(t *testing.T) {
	clock := clockwork.NewFakeClock()
	loc, err := NewLocal(100, time.Second, WithClock(clock))
	require.NoError(t, err)
	lim := New(loc, WithClock(clock))
	ctx := context.Background()
	require.NoError(t, lim.Report(ctx, Answer{Refused: true, Retry: true, RetryAfter: time.Second, Limit: 5}))
	s, _ := lim.adaptiveState(ctx, "")
	assert.InDelta(t, 5, s.Ceiling, 1e-9)

	lim2 := New(loc, WithClock(clock))
	require.NoError(t, lim2.Report(ctx, Answer{Refused: true, Retry: true, RetryAfter: 0}))
	s, _ = lim2.adaptiveState(ctx, "")
	assert.True(t, s.Active(), "Retry-After: 0 paused nothing; the fleet must slow down")
}

// TestAdaptViewKeepsTheNewerState: a reply read earlier on the store's
// clock (a background refresh) that lands after a newer one (this
// process's own refusal) must not replace it while that is fresh.
func TestAdaptViewKeepsTheNewerState(t *testing.T) {
	clock := clockwork.NewFakeClock()
	loc, err := NewLocal(10, time.Second, WithClock(clock))
	require.NoError(t, err)
	lim := New(loc, WithClock(clock))
	st := lim.state("k")
	defer lim.release(st)
	t0 := clock.Now()
	lim.note(st, AdaptiveState{Rate: 9, At: t0.Add(time.Millisecond)}, lim.tb.now())
	lim.note(st, AdaptiveState{At: t0}, lim.tb.now()) // the refresh's read, from before
	v, _ := lim.view(st, 0)
	assert.InDelta(t, 9, v.st.Rate, 1e-9)
	clock.Advance(time.Second) // the newer view is stale now: anything goes
	lim.note(st, AdaptiveState{At: t0}, lim.tb.now())
	v, _ = lim.view(st, 0)
	assert.False(t, v.st.Active())
}

// ctxBucket answers as a Redis bucket whose caller's context ends
// mid-call: a *BackendError wrapping the context's error, once ctx is done.
type ctxBucket struct{}

func (ctxBucket) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (Decision, error) {
	<-ctx.Done()
	return Decision{}, &BackendError{Op: "take", Key: key, Err: ctx.Err()}
}

// TestAcquireDeadlineDuringBucketCallIsErrTimeout: the caller's deadline
// passing while the bucket is asked is a wait that ran out, whatever the
// bucket wraps: ErrTimeout and context.DeadlineExceeded, as Acquire's doc
// says, for every failure policy (a CI run saw FailOpen return the
// bucket's raw error).
func TestAcquireDeadlineDuringBucketCallIsErrTimeout(t *testing.T) {
	for _, p := range []FailurePolicy{FailLocal, FailClosed, FailOpen} {
		lim := New(ctxBucket{}, WithFailurePolicy(p))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err := lim.Acquire(ctx, Forever)
		cancel()
		assert.ErrorIs(t, err, ErrTimeout, "%v", p)
		assert.ErrorIs(t, err, context.DeadlineExceeded, "%v", p)
		assert.ErrorContains(t, err, "the bucket store did not answer in the", "%v", p)
	}
}

// TestAdaptLawTinyAdvertisedCeilingLifts: a ceiling of a thousandth of a
// permit per interval is not "the configured limit" (stored as 0), and a
// ceiling three times as high is a change.
func TestAdaptLawTinyAdvertisedCeilingLifts(t *testing.T) {
	law, clock := adaptLaw{limit: 10, interval: time.Second}, clockwork.NewFakeClock()
	s, changed := law.advertised(AdaptiveState{}, 0.001, clock.Now())
	require.True(t, changed)
	s2, changed := law.advertised(s, 0.0029, clock.Now())
	assert.True(t, changed, "0.0029 is not 0.001")
	assert.InDelta(t, 0.0029, law.ceiling(s2), 1e-12)
	s, changed = law.advertised(s, 10, clock.Now())
	require.True(t, changed, "the configured limit advertised again lifts the ceiling")
	assert.InDelta(t, 10, law.ceiling(s), 1e-9)
	for range 10 {
		clock.Advance(time.Second)
		s, _ = law.increase(s, clock.Now())
	}
	assert.Greater(t, s.Rate, 1.0, "and the rate climbs back")
}

// TestAdaptLawClockBackIncreasesOnce: with the store's clock stepped back
// behind the last refusal, one increase is due, not one per call.
func TestAdaptLawClockBackIncreasesOnce(t *testing.T) {
	law, clock := adaptLaw{limit: 100, interval: time.Second}, clockwork.NewFakeClock()
	s, _ := law.refused(AdaptiveState{}, clock.Now().Add(time.Minute))
	now := clock.Now()
	s, due := law.increase(s, now)
	require.True(t, due)
	_, due = law.increase(s, now.Add(time.Millisecond))
	assert.False(t, due, "the next increase waits an interval")
}

// TestMemPaceRescalesSlotsAfterRateChange: a slot reserved at a thousandth
// of a permit per interval does not hold the key for a thousand intervals
// once the rate is back up.
func TestMemPaceRescalesSlotsAfterRateChange(t *testing.T) {
	clock := clockwork.NewFakeClock()
	m := &memAdaptive{}
	set := func(rate float64) { setMemRate(t, m, clock.Now(), rate) }
	set(0.001)
	p := m.pace(clock.Now(), 1, time.Second, 250*time.Millisecond, 0)
	require.True(t, p.Granted)
	set(10)
	p = m.pace(clock.Now(), 1, time.Second, 250*time.Millisecond, 0)
	assert.True(t, p.Granted, "the slot left is rescaled: %v at 10 per interval", p.Delay)
	assert.LessOrEqual(t, p.Delay, 100*time.Millisecond)
}

// TestAdaptViewLaterVersionWins: a state of a later version replaces the
// view even when the store's clock says it was read earlier (the clock
// stepped back between two reads).
func TestAdaptViewLaterVersionWins(t *testing.T) {
	clock := clockwork.NewFakeClock()
	loc, err := NewLocal(10, time.Second, WithClock(clock))
	require.NoError(t, err)
	lim := New(loc, WithClock(clock))
	st := lim.state("k")
	defer lim.release(st)
	t0 := clock.Now()
	lim.note(st, AdaptiveState{At: t0.Add(time.Minute), Version: 0}, lim.tb.now())
	lim.note(st, AdaptiveState{Rate: 9, At: t0, Version: 1}, lim.tb.now())
	v, _ := lim.view(st, 0)
	assert.InDelta(t, 9, v.st.Rate, 1e-9)
}

// failingAdaptive is a Pauser and AdaptiveStore whose store calls fail,
// and whose pace blocks until the caller's context ends.
type failingAdaptive struct {
	*Local
	paused atomic.Bool
}

func (f *failingAdaptive) Fallback() (int64, time.Duration, int64) {
	return 10, time.Second, 1
}
func (f *failingAdaptive) Pause(context.Context, string, time.Duration) error {
	f.paused.Store(true)
	return nil
}
func (f *failingAdaptive) SwapAdaptive(context.Context, string, AdaptiveState, AdaptiveState, time.Duration) (AdaptiveState, bool, error) {
	return AdaptiveState{}, false, errors.New("READONLY")
}
func (f *failingAdaptive) PaceAdaptive(ctx context.Context, _ string, _ int64, _, _ time.Duration) (AdaptivePace, error) {
	<-ctx.Done()
	return AdaptivePace{}, &BackendError{Op: "pace", Err: ctx.Err()}
}

// TestReportPausesEvenWhenAdaptingFails: a retry time pauses the bucket
// first; a store error while applying the advertised limit is returned
// but does not skip the pause.
func TestReportPausesEvenWhenAdaptingFails(t *testing.T) {
	loc, err := NewLocal(10, time.Second)
	require.NoError(t, err)
	f := &failingAdaptive{Local: loc}
	lim := New(f)
	err = lim.Report(context.Background(), Answer{Refused: true, Retry: true, RetryAfter: 5 * time.Second, Limit: 5})
	assert.Error(t, err, "the store's error")
	assert.True(t, f.paused.Load(), "the hint paused the bucket anyway")
}

// TestAcquireDeadlineDuringPacingIsErrTimeout: as for a bucket call, the
// caller's deadline passing while the adaptive pace is asked is
// ErrTimeout and DeadlineExceeded.
func TestAcquireDeadlineDuringPacingIsErrTimeout(t *testing.T) {
	loc, err := NewLocal(10, time.Second)
	require.NoError(t, err)
	lim := New(&failingAdaptive{Local: loc})
	lim.note(lim.root, AdaptiveState{Rate: 5, At: time.Now()}, lim.tb.now()) // adapting, as a refusal left it
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err = lim.Acquire(ctx, Forever)
	assert.ErrorIs(t, err, ErrTimeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

// TestMemPaceIncreaseKeepsReservedSlotsApart: slots reserved at 40 per
// interval up to the horizon keep their times when the rate goes to 80;
// the next slot comes one new spacing after the last reserved one, not
// among them.
func TestMemPaceIncreaseKeepsReservedSlotsApart(t *testing.T) {
	clock := clockwork.NewFakeClock()
	m := &memAdaptive{}
	set := func(rate float64) { setMemRate(t, m, clock.Now(), rate) }
	set(40)
	var last time.Duration
	for {
		p := m.pace(clock.Now(), 1, time.Second, 250*time.Millisecond, 0)
		if !p.Granted {
			break
		}
		last = p.Delay
	}
	set(80)
	p := m.pace(clock.Now(), 1, time.Second, time.Second, 0)
	require.True(t, p.Granted)
	assert.Equal(t, last+time.Second/80, p.Delay, "one new spacing after the last slot reserved (%v)", last)
}

// TestAdaptLawClampedTimesAreStored: on the plateau with the state's
// times an hour ahead of the store's clock, the clamp is stored once and
// the hold then ends (before, every call clamped again and the fleet held
// for ever).
func TestAdaptLawClampedTimesAreStored(t *testing.T) {
	law, clock := adaptLaw{limit: 10, interval: time.Second}, clockwork.NewFakeClock()
	ahead := clock.Now().Add(time.Hour)
	s := AdaptiveState{Rate: 9.7, Peak: 10, Step: 0.4, Decreased: ahead, Increased: ahead, Refused: ahead}
	for range 5 {
		clock.Advance(time.Second)
		if next, changed := law.increase(s, clock.Now()); changed {
			s = next
		}
	}
	assert.Greater(t, s.Rate, 9.7, "the fleet probes beyond the plateau again")
}

// TestAdaptLawHugeAdvertisedLimitSaysNothingNew: an "unlimited"
// advertisement (1e14 per interval) repeated is no change.
func TestAdaptLawHugeAdvertisedLimitSaysNothingNew(t *testing.T) {
	law, clock := adaptLaw{limit: 10, interval: time.Second}, clockwork.NewFakeClock()
	s, _ := law.refused(AdaptiveState{}, clock.Now())
	s, changed := law.advertised(s, 1e14, clock.Now())
	require.True(t, changed)
	_, changed = law.advertised(s, 1e14, clock.Now())
	assert.False(t, changed)
}

// TestAdaptLawTinyCeilingStepsToScale: under an advertised ceiling of
// 0.008 per interval (of a configured 10), a refusal at 0.004 is followed
// by steps to the ceiling's scale, not a jump to the ceiling.
func TestAdaptLawTinyCeilingStepsToScale(t *testing.T) {
	law, clock := adaptLaw{limit: 10, interval: time.Second}, clockwork.NewFakeClock()
	s, _ := law.advertised(AdaptiveState{}, 0.008, clock.Now())
	s.Rate = 0.004
	clock.Advance(time.Minute)
	s, _ = law.refused(s, clock.Now())
	for range 3 {
		clock.Advance(time.Second)
		s, _ = law.increase(s, clock.Now())
	}
	assert.Less(t, s.Rate, 0.006, "three intervals after a refusal at 0.004")
}

// setMemRate makes m adapt at rate per interval from now.
func setMemRate(t *testing.T, m *memAdaptive, now time.Time, rate float64) {
	t.Helper()
	old, _ := m.swap(now, AdaptiveState{Version: -1}, AdaptiveState{}, 0)
	_, ok := m.swap(now, old, AdaptiveState{Rate: rate}, time.Hour)
	require.True(t, ok)
}

// TestAdaptViewBelievesAStoreThatLostItsState: a state of an earlier
// version read by a call sent after the view's state came back is the
// store's own (it lost the state, an empty restart, and counts versions
// anew), whatever its clock says; one read by a call sent before is an
// older reply landing late.
func TestAdaptViewBelievesAStoreThatLostItsState(t *testing.T) {
	clock := clockwork.NewFakeClock()
	loc, err := NewLocal(10, time.Second, WithClock(clock))
	require.NoError(t, err)
	lim := New(loc, WithClock(clock))
	st := lim.state("k")
	defer lim.release(st)
	t0 := clock.Now()
	before := lim.tb.now()
	clock.Advance(time.Millisecond)
	lim.note(st, AdaptiveState{Rate: 9, At: t0, Version: 3}, before)
	lim.note(st, AdaptiveState{At: t0.Add(time.Hour), Version: 1}, before) // sent before the view came back
	v, _ := lim.view(st, 0)
	assert.InDelta(t, 9, v.st.Rate, 1e-9, "a reply of a call sent earlier replaced the view")
	clock.Advance(time.Millisecond)
	lim.note(st, AdaptiveState{At: t0.Add(-time.Hour), Version: 1}, lim.tb.now()) // read after it: the store lost it
	v, _ = lim.view(st, 0)
	assert.False(t, v.st.Active(), "the store's state, read after the view, is not believed")
}
