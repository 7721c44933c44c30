package guarantee

import (
	"fmt"
	"math"
	"time"
)

// Periods checks the guarantee of a token bucket refilled to limit on
// demand: at most limit grants per refill, and refills at least interval
// apart. Refills are not observed, only grants, so Periods asks whether
// some placement of refills explains the grants: refill times r0 < r1 < …,
// each refill after the grants of the period before it and at or before
// the first grant of its own period, with r(i+1) − r(i) ≥ interval, and
// at most limit grants in each period [r(i), r(i+1)). The first refill is
// the first grant's: the bucket starts unused, so its first permits come
// from a refill made for the first grant. (Use [Resets] when the first
// refill may lie anywhere before the first grant.)
//
// Tolerance: refills need only be interval − tol apart. This absorbs
// grant times recorded up to tol late, as long as the lateness does not
// reorder the grants of two periods: a grant recorded after a grant of the
// next period cannot be told apart from one of the next period.
//
// Why not simply open each period at the first grant at or after the
// previous refill + interval (greedy, earliest)? That never accepts a
// sequence that breaks the guarantee, but it rejects sequences that keep
// it, so it is not the most lenient placement: a refill need not coincide
// with a grant, and a bucket may refill only when a caller finds it empty,
// so grants just after r + interval may still belong to the old period.
// With limit 2 and interval 1 s, grants at 0, 1.0, 1.5 and 1.9 s keep the
// guarantee with refills at 0 and 1.4 s, while greedy refills at 1.0 s and
// then sees three grants before 2.0 s. Refilling as late as possible fails
// too: grants at 0, 1.2, 1.5, 2.1 and 2.15 s keep the guarantee only with
// a refill between 1.0 and 1.2 s, which neither greedy rule makes. So
// Periods searches every placement, in O(n): let E[b] be the earliest time
// at which a period opening with grant b can have been refilled, over all
// valid placements of the grants before b. An earlier refill only loosens
// what may follow, so E[b] is all that matters about the past, and
//
//	E[0] = t0
//	E[b] = max(t(b−1), M + interval − tol) if that is ≤ t(b), else none,
//	       where M = min E[a] over the periods that may precede, a ∈ [b−limit, b−1].
//
// A sliding-window minimum gives M in O(1) amortized. When no period can
// hold a grant (every start among the limit grants before it is
// impossible), that grant is a violation: it is set aside and the scan
// goes on, so Violations counts the grants no placement can account for,
// in time order.
//
// Worst is the most grants in one period of a placement found this way,
// set-aside grants included. Allowed is limit × (⌊span/interval⌋ + 1):
// that many refills fit, interval apart, from the first grant to the last.
func Periods(times []time.Time, limit int64, interval, tol time.Duration) Report {
	return periods(times, limit, interval, tol, true)
}

// Resets checks the guarantee of a counter reset on a timer (the Counter
// bucket with its Resetter): at most limit grants between two resets, and
// resets at least interval apart. It is [Periods] except that the last
// reset before the first grant may have happened at any time (the timer
// runs whether or not grants are asked for), so the first period is held
// to its count only, and the first reset after it may come as soon as the
// first period's last grant.
//
// Allowed is limit × (⌊span/interval⌋ + 2): one more period than Periods
// allows, because the first one may have begun before the first grant.
func Resets(times []time.Time, limit int64, interval, tol time.Duration) Report {
	return periods(times, limit, interval, tol, false)
}

func periods(times []time.Time, limit int64, interval, tol time.Duration, anchored bool) Report {
	name, unit := "Periods", "refill"
	if !anchored {
		name, unit = "Resets", "reset"
	}
	if bad := validate(limit, "limit", namedDur{"interval", interval, true}, namedDur{"tol", tol, false}); bad != "" {
		return invalid(len(times), "%s: %s", name, bad)
	}
	ts, _ := sorted(times)
	n := len(ts)
	what := fmt.Sprintf("at most %d grants per %s, %ss at least %v apart (tolerance %v)", limit, unit, unit, interval, tol)
	r := Report{Grants: n}
	if n == 0 {
		r.Detail = what + ": no grants"
		return r
	}
	gap := interval.Nanoseconds() - tol.Nanoseconds()
	const none = math.MaxInt64

	// Over the kept grants: kt their times, e their E (none if no period
	// may open there), parent the start of the period before, extra the
	// grants set aside right after each. q is a monotonic deque of kept
	// indices with e != none, e increasing.
	var (
		kt     = make([]int64, 0, n)
		e      = make([]int64, 0, n)
		parent = make([]int32, 0, n)
		extra  = make([]int32, 0, n)
		q      = make([]int32, 0, 64)
		qh     int // head of q
		first  string
	)
	for j, t := range ts {
		m := int64(len(kt))
		for qh < len(q) && int64(q[qh]) < m-limit {
			qh++
		}
		em, par := int64(none), int32(-1)
		switch {
		case m == 0:
			em = t
			if !anchored {
				em = math.MinInt64 / 2
			}
		case qh < len(q):
			a := q[qh]
			if cand := e[a] + gap; cand <= t {
				em, par = max(kt[m-1], cand), a
			}
		}
		if em == none {
			// Grant j must join a period that opened within the last
			// limit-1 kept grants.
			ok := qh < len(q) && int64(q[qh]) >= m-limit+1 || qh+1 < len(q)
			if !ok {
				if r.Violations == 0 {
					first = fmt.Sprintf("grant #%d at %s fits no period of at most %d grants with %ss %v apart", j, at(t), limit, unit, time.Duration(gap))
				}
				r.Violations++
				extra[m-1]++
				continue
			}
		}
		kt = append(kt, t)
		e = append(e, em)
		parent = append(parent, par)
		extra = append(extra, 0)
		if em != none {
			for len(q) > qh && e[q[len(q)-1]] >= em {
				q = q[:len(q)-1]
			}
			q = append(q, int32(m))
			if qh > 4096 && qh > len(q)/2 { // reclaim the consumed head
				q = append(q[:0], q[qh:]...)
				qh = 0
			}
		}
	}

	// A placement: the last period opens at the deque's head (a start
	// among the last limit kept grants), each earlier one at its parent.
	k := int32(len(kt))
	for qh < len(q) && int64(q[qh]) < int64(k)-limit {
		qh++
	}
	count := 0
	for start, end := q[qh], k; start >= 0; start, end = parent[start], start {
		size := 0
		for i := start; i < end; i++ {
			size += 1 + int(extra[i])
		}
		r.Worst = max(r.Worst, size)
		count++
	}

	span := ts[n-1]
	windows := windowsIn(span, interval.Nanoseconds())
	if !anchored {
		windows++
	}
	r.finish(span, float64(limit)*windows)
	if r.Violations == 0 {
		r.Detail = fmt.Sprintf("%d grants over %v kept %s; %d %ss suffice, fullest period %d", n, r.Span, what, count, unit, r.Worst)
	} else {
		r.Detail = fmt.Sprintf("%d of %d grants over %v break %s; first: %s; fullest period %d",
			r.Violations, n, r.Span, what, first, r.Worst)
	}
	return r
}
