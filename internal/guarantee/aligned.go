package guarantee

import (
	"fmt"
	"time"
)

// Aligned checks that at most limit grants fall in each window
// [offset + k·window, offset + (k+1)·window) of the Unix epoch: the
// guarantee of a fixed-window bucket, whose windows are cut on the Redis
// server's clock (on loopback, the same clock as the caller's; offset is 0
// unless the provider's windows start elsewhere).
//
// Tolerance: a grant recorded at t was decided somewhere in [t − tol, t]
// (a recorded time is only ever late), so a grant recorded within tol after
// a window's start may count in the window before it. The checker
// assigns such grants so as to leave the fewest grants over a window's
// limit: in time order, each grant goes to the earliest window it may
// count in that still has room. Because grants later in time never may
// count in an earlier window than earlier grants, this earliest-deadline
// assignment is optimal, so Violations is the fewest grants that must be
// set aside, and tol makes the check more lenient by no more than moving
// each grant by up to tol.
//
// Worst is the most grants in one window (no tolerance). Allowed is limit
// × the number of windows from the first grant's to the last grant's,
// both included.
//
// Aligned runs in O(n) time after sorting.
func Aligned(times []time.Time, limit int64, window, offset, tol time.Duration) Report {
	if bad := validate(limit, "limit", namedDur{"window", window, true}, namedDur{"tol", tol, false}); bad != "" {
		return invalid(len(times), "Aligned: %s", bad)
	}
	ts, base := sorted(times)
	n := len(ts)
	what := fmt.Sprintf("at most %d grants per %v window aligned to the epoch", limit, window)
	if offset != 0 {
		what += fmt.Sprintf(" + %v", offset)
	}
	what += fmt.Sprintf(" (tolerance %v)", tol)
	r := Report{Grants: n}
	if n == 0 {
		r.Detail = what + ": no grants"
		return r
	}
	w := window.Nanoseconds()
	// origin: the grants' offsets are from base; shift them so that window
	// edges fall on multiples of w.
	origin := base.UnixNano() - offset.Nanoseconds()%w
	idx := func(rel int64) int64 { return floorDiv(origin%w+rel, w) }
	d := tol.Nanoseconds()

	// Earliest-window assignment.
	var (
		cur   int64 = idx(ts[0] - d)
		fill  int64
		first string
	)
	for j, t := range ts {
		lo, hi := idx(t-d), idx(t) // decided in [t-d, t]: never a later window
		if cur < lo {
			cur, fill = lo, 0
		}
		if fill == limit {
			if cur+1 > hi {
				if r.Violations == 0 {
					first = fmt.Sprintf("grant #%d at %s finds the window [%s, %s) full, and no other within tolerance",
						j, at(t), at(cur*w-origin%w), at((cur+1)*w-origin%w))
				}
				r.Violations++
				continue
			}
			cur, fill = cur+1, 0
		}
		fill++
	}

	// Worst: the fullest window on the recorded times.
	run, prev := 0, idx(ts[0])
	for _, t := range ts {
		if k := idx(t); k != prev {
			run, prev = 0, k
		}
		run++
		r.Worst = max(r.Worst, run)
	}

	r.finish(ts[n-1], float64(limit)*float64(idx(ts[n-1])-idx(0)+1))
	if r.Violations == 0 {
		r.Detail = fmt.Sprintf("%d grants over %v kept %s; fullest window %d", n, r.Span, what, r.Worst)
	} else {
		r.Detail = fmt.Sprintf("%d of %d grants over %v break %s; first: %s; fullest window %d",
			r.Violations, n, r.Span, what, first, r.Worst)
	}
	return r
}

// floorDiv is a/b rounded toward minus infinity, for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
