package main

import (
	"fmt"
	"math"
	"time"
)

// A guarantee is what a contender promises about its grants, checked on
// the times the callers' store calls that got them began (the start of
// the granting call, timed by the caller; a permit from a lease, when it
// was handed out), never on the limiter's own numbers. It
// is a small stand-in for headway's internal/guarantee package, which a
// separate module may not import.
type guarantee struct {
	// periods: at most limit grants per refill, refills at least interval
	// apart (a token bucket refilled to full on demand: headway's
	// TokenBucket, leasing over it, the lock-per-call design).
	// Otherwise: at most burst + limit·t/interval grants in any span t
	// (GCRA, redis_rate, x/time/rate).
	periods bool
	// sliding: at most limit grants in any window of interval (headway's
	// SlidingLog).
	sliding  bool
	limit    int64
	interval time.Duration
	burst    int64 // GCRA form only
}

func (g guarantee) String() string {
	if g.periods {
		return fmt.Sprintf("≤ %d per refill, refills ≥ %v apart", g.limit, g.interval)
	}
	if g.sliding {
		return fmt.Sprintf("≤ %d in any window of %v", g.limit, g.interval)
	}
	return fmt.Sprintf("≤ %d + %d/%v·t in any span t", g.burst, g.limit, g.interval)
}

// check returns how many grants the guarantee cannot account for
// (scanning in time order, setting each such grant aside) and how many
// grants it allows at most between the first and the last grant. times
// are sorted nanosecond offsets; tol relaxes each time comparison by at
// most tol (a grant was decided somewhere within its store call: tol is
// the longest granting call, never the time a grant was held after it).
func (g guarantee) check(times []int64, tol time.Duration) (violations int, allowed float64) {
	if len(times) == 0 {
		return 0, 0
	}
	span := float64(times[len(times)-1] - times[0])
	if g.periods {
		return checkPeriods(times, g.limit, int64(g.interval-tol)), windowAllowed(times, g.limit, g.interval)
	}
	if g.sliding {
		return checkSliding(times, g.limit, int64(g.interval-tol)), windowAllowed(times, g.limit, g.interval)
	}
	return checkGCRA(times, g.limit, g.interval, g.burst, tol),
		float64(g.burst) + float64(g.limit)*span/float64(g.interval)
}

// checkPeriods asks whether some placement of refills r0 < r1 < … explains
// the grants: each refill after the grants of the period before it and at
// or before the first grant of its own, refills at least gap apart, at
// most limit grants per period. e[m] is the earliest time a period opening
// at kept grant m can have been refilled (none if it cannot open there):
// an earlier refill only loosens what follows, so it is all the past that
// matters, and e[m] = max(t[m−1], min(e[a]) + gap) over the starts a of
// the period before, a ∈ [m−limit, m−1], if that is ≤ t[m]. A monotonic
// deque gives the minimum. A grant that no period can hold is a violation.
func checkPeriods(t []int64, limit, gap int64) (violations int) {
	const none = math.MaxInt64
	kt := make([]int64, 0, len(t)) // kept grants' times
	e := make([]int64, 0, len(t))
	var q []int // kept indices with e != none, e increasing
	for _, ti := range t {
		m := len(kt)
		for len(q) > 0 && int64(q[0]) < int64(m)-limit {
			q = q[1:]
		}
		em := int64(none)
		switch {
		case m == 0:
			em = ti
		case len(q) > 0 && e[q[0]]+gap <= ti:
			em = max(kt[m-1], e[q[0]]+gap)
		}
		if em == none && (len(q) == 0 || int64(q[len(q)-1]) < int64(m)-limit+1) {
			violations++ // neither opens a period nor fits in an open one
			continue
		}
		kt, e = append(kt, ti), append(e, em)
		if em != none {
			for len(q) > 0 && e[q[len(q)-1]] >= em {
				q = q[:len(q)-1]
			}
			q = append(q, m)
		}
	}
	return violations
}

// checkGCRA runs the virtual scheduling of the generic cell rate
// algorithm: grants conform to "at most burst + rate·t in any span t"
// exactly when each comes no earlier than its theoretical arrival time
// less (burst−1) emission intervals; tol lengthens every span by tol.
func checkGCRA(t []int64, limit int64, interval time.Duration, burst int64, tol time.Duration) (violations int) {
	T := float64(interval) / float64(limit)
	tau := float64(burst-1)*T + float64(tol)
	tat := float64(t[0])
	for _, ti := range t {
		f := float64(ti)
		if f < tat-tau-0.5 { // half a nanosecond for rounding
			violations++
			continue
		}
		tat = max(tat, f) + T
	}
	return violations
}

// checkSliding counts the grants of sorted times t that would put more
// than limit grants in a span shorter than window (the interval less the
// tolerance); a grant counted as a violation is left out of later spans.
func checkSliding(t []int64, limit, window int64) (violations int) {
	kept := make([]int64, 0, len(t))
	for _, ti := range t {
		if m := int64(len(kept)); m >= limit && ti-kept[m-limit] < window {
			violations++
			continue
		}
		kept = append(kept, ti)
	}
	return violations
}

// windowAllowed returns the most grants that "at most limit in any window
// of interval" allows between the first and the last of sorted times t:
// limit for every whole interval the span holds, and limit more.
func windowAllowed(t []int64, limit int64, interval time.Duration) float64 {
	if len(t) == 0 {
		return 0
	}
	span := t[len(t)-1] - t[0]
	return float64(limit) * float64(span/int64(interval)+1)
}

// maxInWindow returns the most of sorted times t in any window [s, s+w)
// with s ≥ from: what a provider counting a sliding window of w sees at
// its worst (from math.MinInt64), or once the first windows are past.
// Such a window holds the most when it opens at one of the times.
func maxInWindow(t []int64, w, from int64) int {
	most, j := 0, 0
	for i := range t {
		if t[i] < from {
			continue
		}
		j = max(j, i)
		for j < len(t) && t[j]-t[i] < w {
			j++
		}
		most = max(most, j-i)
	}
	return most
}
