package guarantee

import (
	"fmt"
	"time"
)

// Sliding checks that at most limit grants fall in any window of length
// window, wherever it starts: the guarantee of a sliding-log bucket, and the
// strict provider-side check "never more than limit in any window".
// Windows are half-open, so limit+1 grants violate it when the first and
// the last of them are less than window apart; grants exactly window apart
// never share a window.
//
// Tolerance: limit+1 grants violate only when they span less than
// window − tol.
//
// Violations is the fewest grants that must be set aside for the rest to
// comply: scanning in time order, a grant is kept when it fits with those
// kept before it, and keeping the earliest that fit is optimal.
// Worst is the most grants in one window of length window (no tolerance).
// Allowed is limit × (⌊span/window⌋ + 1): the windows laid end to end from
// the first grant to the last hold limit each.
//
// Sliding runs in O(n) time after sorting and O(min(n, limit)) extra space.
func Sliding(times []time.Time, limit int64, window, tol time.Duration) Report {
	if bad := validate(limit, "limit", namedDur{"window", window, true}, namedDur{"tol", tol, false}); bad != "" {
		return invalid(len(times), "Sliding: %s", bad)
	}
	ts, _ := sorted(times)
	n := len(ts)
	what := fmt.Sprintf("at most %d grants in any %v window (tolerance %v)", limit, window, tol)
	r := Report{Grants: n}
	if n == 0 {
		r.Detail = what + ": no grants"
		return r
	}
	w := window.Nanoseconds()
	eff := w - tol.Nanoseconds()

	// Keep a grant when the limit-th kept grant before it lies at least
	// eff earlier; ring holds the last limit kept grants.
	ring := make([]int64, min(limit, int64(n)))
	kept, pos := 0, 0
	var first string
	for j, t := range ts {
		if kept < len(ring) {
			ring[kept] = t
			kept++
			continue
		}
		if t-ring[pos] >= eff {
			ring[pos] = t
			pos = (pos + 1) % len(ring)
			continue
		}
		if r.Violations == 0 {
			first = fmt.Sprintf("grant #%d at %s is grant %d within %v of the one at %s, closer than %v",
				j, at(t), limit+1, time.Duration(t-ring[pos]), at(ring[pos]), time.Duration(eff))
		}
		r.Violations++
	}

	// Worst: the fullest window ending at each grant, two pointers.
	i := 0
	for j, t := range ts {
		for t-ts[i] >= w {
			i++
		}
		r.Worst = max(r.Worst, j-i+1)
	}

	r.finish(ts[n-1], float64(limit)*windowsIn(ts[n-1], w))
	if r.Violations == 0 {
		r.Detail = fmt.Sprintf("%d grants over %v kept %s; fullest window %d", n, r.Span, what, r.Worst)
	} else {
		r.Detail = fmt.Sprintf("%d of %d grants over %v break %s; first: %s; fullest window %d",
			r.Violations, n, r.Span, what, first, r.Worst)
	}
	return r
}
