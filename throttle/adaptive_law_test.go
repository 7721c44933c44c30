package throttle

import (
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The control law, on a fake clock: a limit of 100 per second.
func newLaw() (adaptLaw, *clockwork.FakeClock) {
	return adaptLaw{limit: 100, interval: time.Second}, clockwork.NewFakeClock()
}

func TestAdaptLawDecreaseCountsOncePerInterval(t *testing.T) {
	law, clock := newLaw()
	s, changed := law.refused(AdaptiveState{}, clock.Now())
	require.True(t, changed)
	assert.True(t, s.Active(), "the first refusal without a hint starts pacing")
	assert.InDelta(t, 90, s.Rate, 1e-9, "at the configured limit, pacing alone may do: a gentle decrease")
	assert.InDelta(t, 100, s.Peak, 1e-9, "the refused rate is remembered")

	// A burst of refusals from many callers within the interval counts once.
	for range 50 {
		clock.Advance(15 * time.Millisecond)
		s, _ = law.refused(s, clock.Now())
	}
	assert.InDelta(t, 90, s.Rate, 1e-9)

	clock.Advance(time.Second)
	s, changed = law.refused(s, clock.Now())
	require.True(t, changed)
	assert.InDelta(t, 63, s.Rate, 1e-9, "refusals going on: a full decrease")
	assert.InDelta(t, 90, s.Peak, 1e-9, "the rate refused this time is remembered")
}

func TestAdaptLawIncrease(t *testing.T) {
	law, clock := newLaw()
	s, _ := law.refused(AdaptiveState{}, clock.Now())

	clock.Advance(999 * time.Millisecond)
	_, due := law.increase(s, clock.Now())
	assert.False(t, due, "no increase within the interval after a decrease")

	// A refusal inside the hold does not decrease but delays the increase.
	s, _ = law.refused(s, clock.Now())
	clock.Advance(500 * time.Millisecond)
	_, due = law.increase(s, clock.Now())
	assert.False(t, due, "an interval of success means no refusal in it")

	clock.Advance(500 * time.Millisecond)
	s, due = law.increase(s, clock.Now())
	require.True(t, due)
	assert.InDelta(t, 94, s.Rate, 1e-9, "half the gap to the plateau (0.97 of the refused rate), at least 4 %% of the limit")

	var rates []float64
	for range 10 {
		clock.Advance(time.Second)
		s, _ = law.increase(s, clock.Now())
		rates = append(rates, s.Rate)
	}
	assert.InDeltaSlice(t, []float64{97, 97, 98, 98, 98, 98, 98, 98, 98, 98}, rates, 1e-9,
		"up to the plateau, two quiet intervals there, then a probe, never beyond 0.98 of the ceiling the fleet was refused at")
	_, due = law.increase(s, clock.Now().Add(time.Hour))
	assert.False(t, due, "at the top there is nothing to increase")
}

// TestAdaptLawTopBelowCeiling: refused at the ceiling, the fleet stops
// 2 % below it; refused further down (the provider cut its limit), its
// probes may reach the ceiling again, in case the provider restored it.
func TestAdaptLawTopBelowCeiling(t *testing.T) {
	law, clock := newLaw()
	atCeiling := AdaptiveState{Rate: 90, Ceiling: 100, Peak: 99, Step: 2, Decreased: clock.Now()}
	below := AdaptiveState{Rate: 90, Ceiling: 100, Peak: 97.9, Step: 2, Decreased: clock.Now()}
	for range 30 {
		clock.Advance(time.Second)
		atCeiling, _ = law.increase(atCeiling, clock.Now())
		below, _ = law.increase(below, clock.Now())
	}
	assert.InDelta(t, 98, atCeiling.Rate, 1e-9, "refused within 2 %% of the ceiling: 0.98 of it at most")
	assert.InDelta(t, 100, below.Rate, 1e-9, "refused below that: probes reach the ceiling")
}

func TestAdaptLawProbesBeyondPeak(t *testing.T) {
	law, clock := newLaw()
	// The provider cut its limit: two decreases bring the rate to 63.
	s, _ := law.refused(AdaptiveState{}, clock.Now())
	clock.Advance(time.Second)
	s, _ = law.refused(s, clock.Now())
	// It recovers: the fleet climbs to its plateau, 0.97 of 90, holds two
	// intervals, then probes beyond with a step that doubles each time
	// (4 % of the limit, then 8, 16), up to the ceiling: refused below
	// 0.98 of it, the fleet may find the whole limit again.
	var rates []float64
	for range 14 {
		clock.Advance(time.Second)
		s, _ = law.increase(s, clock.Now())
		rates = append(rates, s.Rate)
	}
	assert.InDeltaSlice(t, []float64{75.15, 81.225, 85.225, 87.3, 87.3, 91.3, 99.3, 100, 100, 100, 100, 100, 100, 100}, rates, 1e-9)

	// Refused again near the rate refused last time: a small overshoot,
	// a gentle decrease. Refused again an interval later: a full one.
	s, _ = law.refused(s, clock.Now())
	assert.InDelta(t, 90, s.Rate, 1e-9)
	clock.Advance(time.Second)
	s, _ = law.refused(s, clock.Now())
	assert.InDelta(t, 63, s.Rate, 1e-9)
}

func TestAdaptLawFloor(t *testing.T) {
	law, clock := newLaw()
	var s AdaptiveState
	for range 30 {
		s, _ = law.refused(s, clock.Now())
		clock.Advance(time.Second)
	}
	assert.InDelta(t, 5, s.Rate, 1e-9, "never below 5 %% of the limit")

	tiny := adaptLaw{limit: 3, interval: time.Second}
	s = AdaptiveState{}
	for range 10 {
		s, _ = tiny.refused(s, clock.Now())
		clock.Advance(time.Second)
	}
	assert.InDelta(t, 1, s.Rate, 1e-9, "and never below one permit per interval")
}

func TestAdaptLawCeiling(t *testing.T) {
	law, clock := newLaw()
	_, changed := law.advertised(AdaptiveState{}, 150, clock.Now())
	assert.False(t, changed, "an advertised limit above the configured one teaches nothing")

	s, changed := law.advertised(AdaptiveState{}, 30, clock.Now())
	require.True(t, changed)
	assert.InDelta(t, 30, s.Rate, 1e-9, "a lower advertised limit paces at once")
	assert.InDelta(t, 30, s.Ceiling, 1e-9)
	_, changed = law.advertised(s, 30, clock.Now())
	assert.False(t, changed, "the same limit again changes nothing: no store call")

	for range 10 {
		clock.Advance(time.Second)
		s, _ = law.increase(s, clock.Now())
	}
	assert.InDelta(t, 30, s.Rate, 1e-9, "increases stop at the advertised ceiling")

	s, _ = law.refused(s, clock.Now())
	assert.InDelta(t, 27, s.Rate, 1e-9, "refused at the advertised limit: a gentle decrease")

	s, changed = law.advertised(s, 500, clock.Now())
	require.True(t, changed)
	assert.InDelta(t, 500, s.Ceiling, 1e-9, "the advertised limit is kept as it is")
	assert.InDelta(t, 100, law.ceiling(s), 1e-9, "a higher advertised limit restores the configured ceiling, no higher")
	assert.InDelta(t, 27, s.Rate, 1e-9, "the rate climbs back by increases, not at once")

	s, _ = law.advertised(s, 0.01, clock.Now())
	assert.InDelta(t, 0.01, s.Ceiling, 1e-9, "an advertised limit is followed below the configured limit's floor")
	assert.LessOrEqual(t, s.Rate, 0.01)
	s, _ = law.advertised(s, 1e-9, clock.Now())
	assert.InDelta(t, adaptMinRate, s.Ceiling, 1e-12, "down to the store's resolution, never to 0")
	assert.True(t, s.Active())
}

// TestAdaptLawRoundedRateReachesPlateau: a store that rounds the rates
// it keeps (thousandths in Redis) left the rate a hair below the plateau;
// each interval "approached" it again and restarted the hold, so the
// fleet never probed beyond (seen in examples/adaptive: stuck at 25.2).
func TestAdaptLawRoundedRateReachesPlateau(t *testing.T) {
	law, clock := newLaw()
	round := func(s AdaptiveState) AdaptiveState {
		s.Rate = float64(int64(s.Rate*1000)) / 1000
		s.Peak = float64(int64(s.Peak*1000)) / 1000
		return s
	}
	s := round(AdaptiveState{Rate: 25.2, Ceiling: 100, Peak: 26.0107, Step: 2, Decreased: clock.Now()})
	for range 8 {
		clock.Advance(time.Second)
		s, _ = law.increase(s, clock.Now())
		s = round(s)
	}
	assert.Greater(t, s.Rate, 26.0, "after the hold on the plateau, the fleet probes beyond")
}

// TestAdaptLawRoundedTopIsTop: 0.98 of 40 is 39.1999… in floating point;
// kept in thousandths (39.200), it is at the top, not a reason for a store
// call every hold.
func TestAdaptLawRoundedTopIsTop(t *testing.T) {
	law, clock := adaptLaw{limit: 40, interval: time.Second}, clockwork.NewFakeClock()
	s := AdaptiveState{Rate: float64(milli(0.98*law.limit)) / 1000, Ceiling: 40, Peak: 40, Step: 1, Decreased: clock.Now()}
	clock.Advance(time.Hour)
	_, due := law.increase(s, clock.Now())
	assert.False(t, due)
}

// A fleet refused at its ceiling, then refused again a little below it (a
// sliding window meeting jitter), keeps its increases below the ceiling:
// the second refusal found the same limit, not a lower one, and a probe
// up to the ceiling would only be refused again.
func TestAdaptLawNearRefusalKeepsTheTopBelowTheCeiling(t *testing.T) {
	law, clock := newLaw()
	s, _ := law.refused(AdaptiveState{}, clock.Now()) // at the ceiling, unpaced
	for range 6 {
		clock.Advance(time.Second)
		s, _ = law.increase(s, clock.Now())
	}
	require.InDelta(t, 98, s.Rate, 1e-9, "refused at the ceiling: 0.98 of it at most")
	s.Rate = 97 // refused a little below the top
	s, _ = law.refused(s, clock.Now())
	assert.InDelta(t, 100, s.Peak, 1e-9, "a refusal near the last one keeps the higher peak")
	highest := 0.0
	for range 30 {
		clock.Advance(time.Second)
		s, _ = law.increase(s, clock.Now())
		highest = max(highest, s.Rate)
	}
	assert.InDelta(t, 98, highest, 1e-9, "increases stop at 0.98 of the ceiling")
}
