package buckettest

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/guarantee"
)

// permit is one permit the suite saw granted: the bucket decided it at
// some time in [lo, hi] (the Take's start and return; for a reservation,
// both moved on by its Delay, the time the permit is for). On a fake
// clock lo == hi.
type permit struct{ lo, hi time.Time }

// judge checks the permits r recorded (granted to one key) against the
// guarantees that apply: all of them for a run of takes of one permit
// (onePermit), those without OnePermit otherwise. It checks two things,
// independently of the bucket's own numbers:
//
//   - the total: no more permits between the run's start and the latest
//     hi than the guarantee allows in that span. The run starts at the
//     earliest Take r recorded, kept or not: a take whose permits were
//     handed back, or a refused one, may have started the bucket's first
//     period before the first permit kept;
//   - the times, with the checker of package internal/guarantee for the
//     guarantee's kind, at hi with a tolerance of the widest hi − lo. In
//     real time a permit whose Take took longer than a tenth of the
//     interval is set aside from this check (its time is too uncertain to
//     judge a window by), so that one slow call on a loaded machine does
//     not widen the tolerance for every other; it still counts in the
//     total.
//
// It returns how many permits were set aside, for the caller to report.
func (s *suite) judge(t testing.TB, what string, r *recorder, onePermit bool) (aside int) {
	t.Helper()
	ps := r.permits
	if len(ps) == 0 {
		return 0
	}
	first, last := ps[0].lo, ps[0].hi
	for _, p := range ps {
		if p.lo.Before(first) {
			first = p.lo
		}
		if p.hi.After(last) {
			last = p.hi
		}
	}
	if !r.start.IsZero() && r.start.Before(first) {
		first = r.start
	}
	var (
		slow  = s.Interval / 10
		times []time.Time
		tol   time.Duration
	)
	if !s.real() {
		slow = math.MaxInt64
	}
	for _, p := range ps {
		w := p.hi.Sub(p.lo)
		if w > slow {
			aside++
			continue
		}
		tol = max(tol, w)
		times = append(times, p.hi)
	}
	slices.SortFunc(times, time.Time.Compare)
	// A PerPeriod's first period may be pinned to the earliest time
	// checked only if no take can have been decided more than the
	// tolerance before it (one set aside, or one not kept, may have).
	anchored := len(times) > 0 && !first.Before(times[0].Add(-tol))
	for _, g := range s.guarantees {
		if g.OnePermit && !onePermit {
			continue
		}
		if allowed := g.allowed(first, last); int64(len(ps)) > allowed {
			t.Errorf("%s: %d permits kept within %v (from the run's first Take's start to the last kept one's return); %v allows at most %d",
				what, len(ps), last.Sub(first), g, allowed)
		}
		if len(times) == 0 {
			continue
		}
		if rep := g.check(times, tol, anchored); rep.Violations > 0 {
			t.Errorf("%s: %v is broken: %v", what, g, rep.Err())
		}
	}
	return aside
}

// judgeRun is judge for one run, logging what it judged.
func (s *suite) judgeRun(t *testing.T, what string, r *recorder, onePermit bool) {
	t.Helper()
	aside := s.judge(t, what, r, onePermit)
	t.Logf("%s: %d permits judged; %d set aside from the timed check, their Take having taken more than a tenth of the interval", what, len(r.permits), aside)
}

// allowed is the most permits g lets a key be granted between from and
// to, both included.
func (g Guarantee) allowed(from, to time.Time) int64 {
	span := to.Sub(from)
	periods := int64(span / g.Period)
	switch g.Kind {
	case PerPeriod, SlidingWindow:
		return g.Limit * (periods + 1)
	case PerReset:
		return g.Limit * (periods + 2)
	case AlignedWindow:
		p := g.Period.Nanoseconds()
		return g.Limit * (floorDiv(to.UnixNano(), p) - floorDiv(from.UnixNano(), p) + 1)
	case Rate:
		return g.Burst + int64(float64(g.Limit)*float64(span)/float64(g.Period))
	}
	return 0
}

// check runs the checker of g's kind on the times; anchored says the
// first time is the key's first grant, so a PerPeriod's first period
// begins there.
func (g Guarantee) check(times []time.Time, tol time.Duration, anchored bool) guarantee.Report {
	switch g.Kind {
	case PerPeriod:
		if anchored {
			return guarantee.Periods(times, g.Limit, g.Period, tol)
		}
		return guarantee.Resets(times, g.Limit, g.Period, tol)
	case PerReset:
		return guarantee.Resets(times, g.Limit, g.Period, tol)
	case AlignedWindow:
		return guarantee.Aligned(times, g.Limit, g.Period, 0, tol)
	case SlidingWindow:
		return guarantee.Sliding(times, g.Limit, g.Period, tol)
	case Rate:
		return guarantee.GCRA(times, float64(g.Limit)/g.Period.Seconds(), g.Burst, tol)
	}
	return guarantee.Report{Violations: 1, Detail: fmt.Sprintf("unknown kind %v", g.Kind)}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
