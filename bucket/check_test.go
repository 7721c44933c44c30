package bucket

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/headway-go/headway/throttle"
)

// grant is one permit the test saw granted: the server decided it at some
// time in [lo, hi] (µs since the Unix epoch, the test's own clock, taken
// around the Take call; for a reservation, shifted by its delay). The
// checkers below use only these times, never the bucket's own numbers.
// Redis runs on the same host, so its TIME and the test's clock agree.
type grant struct {
	lo, hi int64
	// decided is when the Take call that made it returned (µs); for a
	// reservation it is before lo.
	decided int64
}

// checker reports a violation of a bucket's guarantee among grants made
// after start (µs since the epoch; nothing was granted before it).
type checker func(gs []grant, start int64) error

// at is when the checkers take g to have been decided: when its Take
// returned. The script that granted it ran in the last round trip before
// that: a coalesced take (bucket/coalesce.go) may wait in line, or through
// a refused batch into the next period, so the middle of [lo, hi] can lie
// a whole period before the decision (seen: a take of 217 ms, granted by
// the next period's refill, counted by its middle in the period before).
func (g grant) at() int64 { return g.hi }

func sortGrants(gs []grant) []grant {
	gs = slices.Clone(gs)
	slices.SortFunc(gs, func(a, b grant) int { return int(a.at() - b.at()) })
	return gs
}

// checkWindows: at most limit grants per aligned window of period, for
// each tier, counting the grants known to lie inside the window (a grant
// whose [lo, hi] straddles a boundary is counted in neither: that is the
// tolerance for measuring on our side of the network).
func checkWindows(tiers []throttle.Tier) checker {
	return func(gs []grant, start int64) error {
		for _, t := range tiers {
			p := t.Period.Microseconds()
			counts := map[int64]int64{}
			for _, g := range gs {
				if w := g.lo / p; w == g.hi/p {
					counts[w]++
				}
			}
			for w, c := range counts {
				if c > t.Limit {
					return fmt.Errorf("tier %d/%v: %d grants in the aligned window starting %d µs, want ≤ %d", t.Limit, t.Period, c, w*p, t.Limit)
				}
			}
		}
		return nil
	}
}

// checkSliding: for each window, no limit+1 grants within a span shorter
// than its period. The span of a group is measured pessimistically for the
// bucket (latest hi minus earliest lo), so only a certain violation fails.
func checkSliding(windows []throttle.Tier) checker {
	return func(gs []grant, start int64) error {
		gs = sortGrants(gs)
		for _, w := range windows {
			p, l := w.Period.Microseconds(), int(w.Limit)
			for i := 0; i+l < len(gs); i++ {
				lo, hi := gs[i].lo, gs[i].hi
				for _, g := range gs[i+1 : i+l+1] {
					lo, hi = min(lo, g.lo), max(hi, g.hi)
				}
				if hi-lo < p {
					return fmt.Errorf("window %d/%v: %d grants within %d µs", w.Limit, w.Period, l+1, hi-lo)
				}
			}
		}
		return nil
	}
}

// checkGCRA: in any span t, at most burst + t/emission grants (slot times).
func checkGCRA(limit int64, interval time.Duration, burst int64) checker {
	em := float64(interval.Microseconds()) / float64(limit)
	return func(gs []grant, start int64) error {
		gs = sortGrants(gs)
		for i := range gs {
			lo, hi := gs[i].lo, gs[i].hi
			for j := i; j < len(gs); j++ {
				lo, hi = min(lo, gs[j].lo), max(hi, gs[j].hi)
				if n := int64(j - i + 1); float64(n) > float64(burst)+float64(hi-lo)/em+1e-9 {
					return fmt.Errorf("%d grants within %d µs, want ≤ burst %d + %.1f", n, hi-lo, burst, float64(hi-lo)/em)
				}
				if float64(hi-lo)/em > float64(len(gs)) {
					break
				}
			}
		}
		return nil
	}
}

// checkPeriods: the grants can be split into periods of at most limit
// grants each, whose starts (refills, resets) are at least interval - tol
// apart, the first starting at start or later (the bucket was empty
// before). It is exact for that guarantee: f[k] is the earliest start a
// period beginning at grant k can have, over every valid split of the
// grants before k.
func checkPeriods(limit int64, interval, tol time.Duration) checker {
	iv := (interval - tol).Microseconds()
	return func(gs []grant, start int64) error {
		gs = sortGrants(gs)
		n, l := len(gs), int(limit)
		if n == 0 {
			return nil
		}
		const inf = math.MaxInt64
		f := make([]int64, n+1)
		for k := range f {
			f[k] = inf
		}
		f[0] = start
		for k := 1; k < n; k++ {
			s := gs[k].at()
			for i := max(0, k-l); i < k; i++ {
				if f[i] == inf || f[i]+iv > s {
					continue
				}
				f[k] = min(f[k], max(f[i]+iv, gs[k-1].at()))
			}
		}
		for i := max(0, n-l); i < n; i++ {
			if f[i] != inf {
				return nil
			}
		}
		// Find where it broke, for the message.
		last := 0
		for k := range n {
			if f[k] != inf {
				last = k
			}
		}
		return fmt.Errorf("no split into periods of ≤ %d grants, ≥ %v apart: stuck after grant %d of %d (at %d µs); the next %d grants span %d µs",
			limit, interval-tol, last, n, gs[last].at(), min(l+1, n-last), gs[min(last+l, n-1)].at()-gs[last].at())
	}
}
