package guarantee

import (
	"fmt"
	"math"
	"time"
)

// GCRA checks the guarantee of a generic cell rate algorithm (GCRA) bucket,
// a token bucket of capacity burst refilled continuously at rate permits
// per second: in any span of time t, at most burst + rate·t grants. Spans
// are closed: grants i..j (in time order) are j−i+1 grants within
// t(j) − t(i). The Local bucket of package throttle and the GCRA bucket of
// package bucket keep it, with rate = limit / interval.
//
// Tolerance: a span t is taken as t + tol, so grants i..j violate only when
// j−i+1 > burst + rate·(t(j) − t(i) + tol). (Spans are compared to within a
// nanosecond, for float rounding.)
//
// Every span is checked in O(n): a grant conforms when the theoretical
// arrival time of the grants kept before it, pushed one emission interval
// 1/rate on, lies at most burst/rate + tol after it; this is the same as
// checking every span that ends with it. Non-conforming grants are set
// aside, and keeping every conforming one is optimal, so Violations is the
// fewest grants that must be set aside for the rest to comply.
//
// Worst is the burst the grants needed, on the recorded times without
// tolerance: the largest count − rate·t over every span, rounded up; at most
// burst when the grants comply. Allowed is ⌊burst + rate·span⌋.
func GCRA(times []time.Time, rate float64, burst int64, tol time.Duration) Report {
	if math.IsNaN(rate) || math.IsInf(rate, 0) || rate <= 0 {
		return invalid(len(times), "GCRA: rate = %v per second, must be positive and finite", rate)
	}
	if bad := validate(burst, "burst", namedDur{"tol", tol, false}); bad != "" {
		return invalid(len(times), "GCRA: %s", bad)
	}
	ts, _ := sorted(times)
	n := len(ts)
	what := fmt.Sprintf("at most %d + %g/s·t grants in any span t (tolerance %v)", burst, rate, tol)
	r := Report{Grants: n}
	if n == 0 {
		r.Detail = what + ": no grants"
		return r
	}
	emission := 1e9 / rate                              // ns per grant
	limit := float64(burst)*emission + float64(tol) + 1 // how far the arrival time may run ahead, ns

	// The theoretical arrival time is from + k·emission: from is the time
	// of the grant (index fromIdx) at which it last caught up with the
	// clock, k the grants kept since, that one included. Computing it
	// afresh each time keeps float error from piling up.
	var (
		from, fromIdx int64
		k             int64
		first         string
	)
	for j, t := range ts {
		nf, nfi, nk := from, fromIdx, k+1
		if k == 0 || float64(from)+float64(k)*emission < float64(t) {
			nf, nfi, nk = t, int64(j), 1
		}
		if float64(nf)+float64(nk)*emission-float64(t) <= limit {
			from, fromIdx, k = nf, nfi, nk
			continue
		}
		if r.Violations == 0 {
			first = fmt.Sprintf("grant #%d at %s makes %d grants kept since grant #%d at %s, within %v: more than %d + %g/s·(%v + %v)",
				j, at(t), nk, nfi, at(nf), time.Duration(t-nf), burst, rate, time.Duration(t-nf), tol)
		}
		r.Violations++
	}

	// Worst: with g(k) = k − rate·t(k), the span i..j exceeds rate·t by
	// g(j) − g(i) + 1, largest for the smallest g(i) with i ≤ j.
	perNs := rate / 1e9
	minG, worst := math.Inf(1), math.Inf(-1)
	for j, t := range ts {
		g := float64(j) - perNs*float64(t)
		minG = min(minG, g)
		worst = max(worst, g-minG+1)
	}
	r.Worst = satInt(math.Ceil(worst - 1e-9))

	r.finish(ts[n-1], math.Floor(float64(burst)+perNs*float64(ts[n-1])+1e-9))
	if r.Violations == 0 {
		r.Detail = fmt.Sprintf("%d grants over %v kept %s; burst needed %d", n, r.Span, what, r.Worst)
	} else {
		r.Detail = fmt.Sprintf("%d of %d grants over %v break %s; first: %s; burst needed %d",
			r.Violations, n, r.Span, what, first, r.Worst)
	}
	return r
}
