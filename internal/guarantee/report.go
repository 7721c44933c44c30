package guarantee

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Report is a checker's verdict on a sequence of grant times.
type Report struct {
	// Grants is how many grant times were checked.
	Grants int
	// Violations is how many grants the guarantee cannot account for: 0
	// exactly when the sequence keeps the guarantee (within the
	// tolerance). Otherwise it is the number of grants set aside, scanning
	// in time order, so that the rest keeps it: the excess. Invalid
	// checker arguments count every grant (and at least one) as a
	// violation, so a broken check never passes.
	Violations int
	// Worst is the fullest window the checker saw. Sliding and Aligned:
	// the most grants in one window, on the recorded times without
	// tolerance. Periods and Resets: the most grants in one period of the
	// most lenient refill placement found (set-aside grants included).
	// GCRA: the burst the grants needed, the most grants in any span t
	// less rate·t, rounded up, without tolerance. Compare it with the
	// limit (the burst for GCRA).
	Worst int
	// Allowed is the most grants any sequence keeping the guarantee
	// exactly could hold between the first and the last grant checked.
	Allowed int
	// Utilization is Grants ÷ Allowed (0 when there are no grants): near 1
	// for a bucket that hands out all it may, at most 1 for a compliant
	// sequence, unless it needed the tolerance.
	Utilization float64
	// Span is the time from the first to the last grant.
	Span time.Duration
	// Detail says in words what was checked and, when the guarantee was
	// broken, where first.
	Detail string
}

// Err returns nil when the guarantee was kept, or an error carrying
// Detail otherwise. Tests use it as require.NoError(t, rep.Err()).
func (r Report) Err() error {
	if r.Violations == 0 {
		return nil
	}
	return errors.New("guarantee: " + r.Detail)
}

// String summarizes the report on one line.
func (r Report) String() string {
	return fmt.Sprintf("grants=%d violations=%d worst=%d allowed=%d utilization=%.3f span=%v: %s",
		r.Grants, r.Violations, r.Worst, r.Allowed, r.Utilization, r.Span, r.Detail)
}

// sorted returns the times as nanosecond offsets from the earliest one,
// and the earliest one. times is not modified.
func sorted(times []time.Time) ([]int64, time.Time) {
	if len(times) == 0 {
		return nil, time.Time{}
	}
	ts := times
	if !slices.IsSortedFunc(ts, time.Time.Compare) {
		ts = slices.Clone(times)
		slices.SortStableFunc(ts, time.Time.Compare)
	}
	base := ts[0]
	rel := make([]int64, len(ts))
	for i, t := range ts {
		rel[i] = int64(t.Sub(base))
	}
	return rel, base
}

// invalid is the report for a check with bad arguments: it fails closed.
func invalid(n int, format string, args ...any) Report {
	return Report{
		Grants:     n,
		Violations: max(n, 1),
		Detail:     "invalid check: " + fmt.Sprintf(format, args...),
	}
}

// validate returns a non-empty description of the first bad argument.
func validate(limit int64, limitName string, durs ...namedDur) string {
	if limit < 1 {
		return fmt.Sprintf("%s = %d, must be at least 1", limitName, limit)
	}
	for _, d := range durs {
		if d.positive && d.d <= 0 {
			return fmt.Sprintf("%s = %v, must be positive", d.name, d.d)
		}
		if d.d < 0 {
			return fmt.Sprintf("%s = %v, must not be negative", d.name, d.d)
		}
	}
	return ""
}

type namedDur struct {
	name     string
	d        time.Duration
	positive bool
}

// finish fills in Span, Allowed and Utilization.
func (r *Report) finish(span int64, allowed float64) {
	r.Span = time.Duration(span)
	r.Allowed = satInt(allowed)
	if r.Allowed > 0 {
		r.Utilization = float64(r.Grants) / float64(r.Allowed)
	}
}

// satInt converts a non-negative float to int, saturating.
func satInt(f float64) int {
	if f >= math.MaxInt {
		return math.MaxInt
	}
	if f <= 0 || math.IsNaN(f) {
		return 0
	}
	return int(f)
}

// windowsIn is how many windows of length w starting at the first grant
// are needed to cover a span: floor(span/w) + 1.
func windowsIn(span, w int64) float64 { return float64(span/w) + 1 }

// at formats an offset from the first grant.
func at(ns int64) string { return "+" + time.Duration(ns).String() }
