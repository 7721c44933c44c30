package throttle

import (
	"math"
	"time"
)

// The adaptive rate: how a fleet learns a provider's real limit from its
// answers (see [Limiter.Report]).
//
// The control law is additive increase, multiplicative decrease (AIMD, as
// TCP's congestion control), with a memory of the rate that was refused:
//
//   - A refusal lowers the rate to 0.7 of what it was, at most once per
//     interval, so that a burst of refusals seen by many callers at once
//     counts once. The first such refusal switches the fleet to paced
//     grants (evenly spaced at the adaptive rate, on top of whatever the
//     bucket decides) and lowers the rate only to 0.9 of the limit: a
//     provider that refuses a fleet at its configured limit most often
//     refuses its bursts, which pacing alone removes. So
//     does a refusal while the rate is within 5 % of the rate refused last
//     time, or above it: the fleet found the provider's limit again and
//     overshot it a little (a sliding window meeting network jitter), or
//     probed beyond it to a limit the provider raised and overshot that.
//     If refusals go on, the next interval's decrease is a full one.
//   - Each interval without a refusal raises it quickly (half the gap, at
//     least 4 % of the limit) back toward a plateau just below the rate
//     that was refused (0.97 of it: a provider counting a sliding window
//     refuses an even pace at exactly its limit as soon as the network
//     jitters). After two quiet intervals on the plateau it probes
//     beyond, by a step that doubles every interval (from 4 % of the
//     limit), so that a provider that raised its limit again is found in
//     a few intervals (examples/adaptive: a limit back from 25 to 50 per
//     second followed within 7 s, where four intervals on the plateau
//     and steps from 2 % took longer than the 8 s it was given).
//   - The rate never goes below the floor (5 % of the ceiling, at least
//     one permit per interval unless the ceiling is lower) nor above the
//     ceiling: the configured limit, or a lower limit the provider
//     advertises (steps are then shares of that ceiling). Once the fleet
//     has been refused at the ceiling itself, increases stop at 0.98 of
//     it: there is nothing above to find, and a provider counting a
//     sliding or fixed window refuses an even pace at exactly its limit
//     now and then (network jitter): each probe to the ceiling would cost
//     a refusal.
//   - A refusal with a retry hint (Retry-After and the like) also pauses
//     the bucket until then; it counts here like one without (see
//     Answer.Retry: only pacing ends a provider's refusals at every
//     period's edge).
//
// Times are the store's (the Redis server's clock), which may step back (a
// failover to a node whose clock is behind): a time in the state that lies
// ahead of now is moved to an interval ago (and stored so), so that the
// law goes on rather than wait for the clock to catch up.
//
// Rates are compared in whole thousandths, as the Redis buckets keep them.
//
// The law is pure: [adaptLaw] takes the state and the time and returns the
// next state. Where the state lives: see AdaptiveStore and
// adaptive_state.go.

// Defaults of the law.
const (
	adaptDecrease = 0.7  // a refusal: rate × 0.7
	adaptNear     = 0.95 // a refusal within 5 % of the last refused rate ...
	adaptGentle   = 0.9  // ... lowers it only to 0.9
	adaptApproach = 0.5  // below the plateau: half the gap per interval
	adaptPlateau  = 0.97 // the plateau, of the last refused rate
	adaptHold     = 2    // intervals on the plateau before probing
	adaptProbe    = 0.04 // beyond it: 4 % of the limit, doubling
	adaptMaxStep  = 0.25 // the probe step's cap, of the limit
	adaptFloor    = 0.05 // the floor, of the ceiling
	adaptTop      = 0.98 // refused at the ceiling: increases stop here, of it
	// adaptMinRate is the lowest ceiling an advertised limit sets, in
	// permits per interval: the Redis buckets keep rates in thousandths.
	adaptMinRate = 0.001
	// adaptMemory is how long a fleet remembers its adaptive rate without
	// a change: after that, grants are no longer paced, and a provider
	// that still refuses bursts teaches the fleet again.
	adaptMemory = 10 * time.Minute
)

// adaptLaw is the control law for one bucket: its configured limit per
// interval. Every method is pure: it takes the state and the time.
type adaptLaw struct {
	limit    float64
	interval time.Duration
}

// floor is the lowest rate a decrease goes to under ceiling c: 5 % of it,
// at least one permit per interval when c allows one, never below
// adaptMinRate.
func (a adaptLaw) floor(c float64) float64 {
	if c >= 1 {
		return max(1, adaptFloor*c)
	}
	return max(adaptMinRate, adaptFloor*c)
}

// milli is v in whole thousandths, rounded down within a millionth of
// one, as the Redis buckets keep rates (package bucket has the same
// function): comparisons of rates are made in it, so that a rate read
// back from a store equals the one computed (the small addition keeps
// 1.666, which is 1665.99… thousandths in floating point, at 1666). It is
// 0 for a rate that is not positive and caps at 2^53 thousandths.
func milli(v float64) int64 {
	if !(v > 0) {
		return 0
	}
	return int64(math.Floor(min(v*1000+1e-6, 1<<53)))
}

// ceiling is s's ceiling: the advertised one, or the configured limit,
// whichever is lower.
func (a adaptLaw) ceiling(s AdaptiveState) float64 {
	if s.Ceiling > 0 {
		return min(s.Ceiling, a.limit)
	}
	return a.limit
}

// top is how far increases may take s's rate: its ceiling, or adaptTop of
// it once the fleet was refused at (or within 2 % of) the ceiling. The
// Peak a store kept may be rounded down from the rate refused.
func (a adaptLaw) top(s AdaptiveState) float64 {
	c := a.ceiling(s)
	if milli(s.Peak) >= milli(adaptTop*c) {
		return adaptTop * c
	}
	return c
}

// clampFuture moves the times of s that lie ahead of now (the store's
// clock stepped back) to one interval before now: the law goes on as if
// they were an interval ago, once. It reports whether it moved any: the
// caller must then store s, so that the next call does not clamp again.
func (a adaptLaw) clampFuture(s AdaptiveState, now time.Time) (AdaptiveState, bool) {
	moved := false
	for _, t := range []*time.Time{&s.Decreased, &s.Increased, &s.Refused} {
		if t.After(now) {
			*t, moved = now.Add(-a.interval), true
		}
	}
	return s, moved
}

// stepBase is what the approach and probe steps are shares of: the lower
// of the configured limit and the ceiling (an advertised limit far below
// the configured one gets steps to its own scale).
func (a adaptLaw) stepBase(s AdaptiveState) float64 { return min(a.limit, a.ceiling(s)) }

// refused applies a refusal (with a retry hint or without) at now. It reports false
// when nothing changed worth storing: a refusal within the interval after
// a decrease counts once, and only its time is noted (which delays the
// next increase), at most ten times an interval.
func (a adaptLaw) refused(s AdaptiveState, now time.Time) (AdaptiveState, bool) {
	s, _ = a.clampFuture(s, now) // a decrease or a noted refusal stores it
	if s.Active() && now.Sub(s.Decreased) < a.interval {
		if now.Sub(s.Refused) < a.interval/10 {
			return s, false
		}
		s.Refused = now
		return s, true
	}
	ceiling := a.ceiling(s)
	rate := ceiling
	if s.Active() {
		rate = min(s.Rate, ceiling)
	}
	factor := adaptDecrease
	near := s.Peak > 0 && rate >= adaptNear*s.Peak
	if !s.Active() || near {
		factor = adaptGentle
	}
	// A refusal near the rate refused last time found the same limit
	// again: the higher of the two stays the peak, so a fleet refused at
	// its ceiling keeps its increases below it (top) rather than probing
	// up to it again after a jitter refusal a little below.
	if !near || rate > s.Peak {
		s.Peak = rate
	}
	// Never up: a rate already below the floor (an instance with a
	// higher configured limit, a rolling deploy) stays where it is.
	s.Rate = min(max(a.floor(ceiling), rate*factor), rate)
	s.Step = adaptProbe * a.stepBase(s)
	s.Decreased, s.Refused = now, now
	return s, true
}

// increase applies an interval of success: it reports false when no
// increase is due at now (less than an interval since the last change or
// refusal, or the rate at its ceiling already).
func (a adaptLaw) increase(s AdaptiveState, now time.Time) (AdaptiveState, bool) {
	if !s.Active() {
		return s, false
	}
	s, clamped := a.clampFuture(s, now)
	last := s.Decreased
	for _, t := range []time.Time{s.Increased, s.Refused} {
		if t.After(last) {
			last = t
		}
	}
	ceiling := a.top(s)
	plateau := min(adaptPlateau*s.Peak, ceiling)
	if now.Sub(last) < a.interval || milli(s.Rate) >= milli(ceiling) {
		return s, clamped
	}
	// A rate within a hundredth of the plateau is on it: a store's
	// rounding would keep it "approaching" forever.
	base := a.stepBase(s)
	if milli(s.Rate) < milli(plateau)-10 {
		s.Rate = min(s.Rate+max(adaptApproach*(plateau-s.Rate), adaptProbe*base), plateau)
	} else {
		if s.Rate < s.Peak && now.Sub(last) < adaptHold*a.interval {
			return s, clamped // on the plateau: hold
		}
		step := min(max(s.Step, adaptProbe*base), adaptMaxStep*base)
		s.Rate += step
		s.Step = min(2*step, adaptMaxStep*base)
	}
	s.Rate = min(s.Rate, ceiling)
	s.Increased = now
	return s, true
}

// advertised applies a limit the provider advertised, already converted
// to permits per interval of the bucket (at least adaptMinRate): it is
// stored as it is, and the ceiling is the lower of it and each instance's
// configured limit (so that instances configured differently agree on
// what they store). The rate, and the rate refused last, go no higher
// than the ceiling: an advertised limit counts as one the fleet met, and
// increases stop at 0.98 of it. It reports false when nothing changed, in
// the store's thousandths.
func (a adaptLaw) advertised(s AdaptiveState, limit float64, now time.Time) (AdaptiveState, bool) {
	adv := max(limit, adaptMinRate)
	c := min(adv, a.limit)
	if !s.Active() {
		if c >= a.limit {
			return s, false // not adapting, and nothing to learn
		}
		s.Rate = c
		s.Peak = c
		s.Increased = now
	} else if milli(s.Ceiling) == milli(adv) && milli(s.Rate) <= milli(c) && milli(s.Peak) <= milli(c) {
		return s, false
	}
	s.Ceiling = adv
	s.Rate = min(s.Rate, c)
	s.Peak = min(s.Peak, c)
	return s, true
}
