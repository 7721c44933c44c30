package guarantee

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// epoch is a whole second of the Unix epoch, so that aligned windows of a
// second or a fraction of it start at offset 0.
var epoch = time.Unix(1_700_000_000, 0)

// at returns the times epoch + s seconds.
func secs(s ...float64) []time.Time {
	out := make([]time.Time, len(s))
	for i, v := range s {
		out[i] = epoch.Add(time.Duration(math.Round(v * 1e9)))
	}
	return out
}

const ms = time.Millisecond

type row struct {
	name       string
	times      []time.Time
	tol        time.Duration
	violations int
	worst      int // -1: not checked
	allowed    int // -1: not checked
}

func runRows(t *testing.T, rows []row, check func(times []time.Time, tol time.Duration) Report) {
	t.Helper()
	for _, tc := range rows {
		t.Run(tc.name, func(t *testing.T) {
			before := slices.Clone(tc.times)
			r := check(tc.times, tc.tol)
			t.Log(r)
			assert.Equal(t, before, tc.times, "the checker must not modify its input")
			assert.Equal(t, len(tc.times), r.Grants)
			assert.Equal(t, tc.violations, r.Violations, r.Detail)
			if tc.worst >= 0 {
				assert.Equal(t, tc.worst, r.Worst, "worst")
			}
			if tc.allowed >= 0 {
				assert.Equal(t, tc.allowed, r.Allowed, "allowed")
			}
			if tc.violations == 0 {
				assert.NoError(t, r.Err())
			} else {
				assert.Error(t, r.Err())
			}
			assert.NotEmpty(t, r.Detail)
		})
	}
}

func TestSliding(t *testing.T) {
	// limit 2 per 1 s
	runRows(t, []row{
		{name: "empty", times: nil, violations: 0, worst: 0, allowed: 0},
		{name: "one", times: secs(5), violations: 0, worst: 1, allowed: 2},
		{name: "exactly a window apart never share one", times: secs(0, 0.5, 1.0, 1.5), violations: 0, worst: 2, allowed: 4},
		{name: "third grant a nanosecond early", times: secs(0, 0.5, 0.999999999), violations: 1, worst: 3, allowed: 2},
		{name: "burst of twice the limit", times: secs(3, 3, 3, 3), violations: 2, worst: 4, allowed: 2},
		{name: "unsorted input", times: secs(1.5, 0, 1.0, 0.5), violations: 0, worst: 2, allowed: 4},
		{name: "straddling two windows", times: secs(0.9, 0.95, 1.0, 1.05), violations: 2, worst: 4, allowed: 2},
		{name: "tolerance excuses a millisecond", times: secs(0, 0.5, 0.999), tol: ms, violations: 0, worst: 3, allowed: 2},
		{name: "tolerance excuses no more", times: secs(0, 0.5, 0.999), tol: ms / 2, violations: 1, worst: 3, allowed: 2},
		{name: "tolerance does not hide a burst", times: secs(0, 0, 0, 2), tol: 10 * ms, violations: 1, worst: 3, allowed: 6},
		{name: "set-aside grants do not count against later ones", times: secs(0, 0, 0, 1.0, 1.0), violations: 1, worst: 3, allowed: 4},
	}, func(ts []time.Time, tol time.Duration) Report { return Sliding(ts, 2, time.Second, tol) })
}

func TestSlidingLargeLimit(t *testing.T) {
	r := Sliding(secs(0, 0, 0), math.MaxInt64, time.Second, 0)
	assert.Zero(t, r.Violations)
	assert.Equal(t, math.MaxInt, r.Allowed)
}

func TestAligned(t *testing.T) {
	// limit 2 per 1 s window aligned to the epoch
	runRows(t, []row{
		{name: "empty", times: nil, violations: 0, worst: 0, allowed: 0},
		{name: "edge grant opens the next window", times: secs(0.1, 0.2, 1.0, 1.5), violations: 0, worst: 2, allowed: 4},
		{name: "third in a window", times: secs(0.1, 0.2, 0.999999999), violations: 1, worst: 3, allowed: 2},
		{name: "straddling the edge is fine", times: secs(0.9, 0.95, 1.0, 1.05), violations: 0, worst: 2, allowed: 4},
		{name: "burst at the window start", times: secs(3, 3, 3, 3.5), violations: 2, worst: 4, allowed: 2},
		{name: "unsorted input", times: secs(1.0, 0.2, 1.5, 0.1), violations: 0, worst: 2, allowed: 4},
		{name: "before the epoch", times: secs(-1700000000.5, -1700000000.4, -1700000000.3), violations: 1, worst: 3, allowed: 2},
		{name: "far windows", times: secs(0.5, 10.5), violations: 0, worst: 1, allowed: 22},
		// Recorded just before the edge: decided before it too (a
		// recorded time is only ever late), so no tolerance moves it on.
		{name: "tolerance never moves a grant to a later window", times: secs(0.5, 0.6, 0.9995, 1.2), tol: ms, violations: 1, worst: 3, allowed: 4},
		{name: "without tolerance it is a violation", times: secs(0.5, 0.6, 0.9995, 1.2), violations: 1, worst: 3, allowed: 4},
		{name: "tolerance moves an edge grant forward", times: secs(0.9995, 1.0, 1.0001, 1.0002), tol: ms, violations: 0, worst: 3, allowed: 4},
		{name: "tolerance reaches only tol", times: secs(0.9985, 1.0011, 1.0012, 1.0013), tol: ms, violations: 1, worst: 3, allowed: 4},
		{name: "tolerance into a full window does not help", times: secs(0.5, 0.6, 1.0, 1.0, 1.0), tol: ms, violations: 1, worst: 3, allowed: 4},
	}, func(ts []time.Time, tol time.Duration) Report { return Aligned(ts, 2, time.Second, 0, tol) })
}

func TestAlignedOffset(t *testing.T) {
	ts := secs(0.6, 0.7, 1.4)
	assert.Zero(t, Aligned(ts, 2, time.Second, 0, 0).Violations)
	r := Aligned(ts, 2, time.Second, 500*ms, 0)
	assert.Equal(t, 1, r.Violations, r.Detail)
	assert.Equal(t, 3, r.Worst)
	// An offset is only taken modulo the window.
	for _, off := range []time.Duration{500*ms + 7*time.Second, -500 * ms} {
		o := Aligned(ts, 2, time.Second, off, 0)
		assert.Equal(t, []int{1, 3, 2}, []int{o.Violations, o.Worst, o.Allowed}, off)
	}
}

func TestPeriods(t *testing.T) {
	// limit 2 per refill, refills 1 s apart
	runRows(t, []row{
		{name: "empty", times: nil, violations: 0, worst: 0, allowed: 0},
		{name: "on-demand refills", times: secs(0, 0.1, 1.0, 1.1, 2.0, 2.1), violations: 0, worst: 2, allowed: 6},
		{name: "third grant before the interval", times: secs(0, 0.1, 0.5), violations: 1, worst: 3, allowed: 2},
		{name: "the first refill is the first grant's", times: secs(0, 0.01, 0.02), violations: 1, worst: 3, allowed: 2},
		// A greedy placement (refill at 1.0) fails; a refill at 1.4 works.
		{name: "refill when empty", times: secs(0, 1.0, 1.5, 1.9), violations: 0, worst: 2, allowed: 4},
		// Refilling as late as possible (after 1.2) fails, and so does a
		// refill at 1.2; one between 1.0 and 1.2 works.
		{name: "refill between grants", times: secs(0, 1.2, 1.5, 2.1, 2.15), violations: 0, worst: 2, allowed: 6},
		{name: "no placement", times: secs(0, 0.1, 1.0, 1.5, 1.9), violations: 1, worst: 3, allowed: 4},
		{name: "long idle", times: secs(0, 0, 100, 100), violations: 0, worst: 2, allowed: 202},
		{name: "burst", times: secs(0, 0, 0, 0, 0), violations: 3, worst: 5, allowed: 2},
		{name: "unsorted input", times: secs(2.1, 1.0, 0.1, 2.0, 0, 1.1), violations: 0, worst: 2, allowed: 6},
		{name: "refill a millisecond early", times: secs(0, 0.1, 0.999, 1.05), violations: 1, worst: 3, allowed: 4},
		{name: "tolerance excuses it", times: secs(0, 0.1, 0.999, 1.05), tol: ms, violations: 0, worst: 2, allowed: 4},
		{name: "tolerance excuses no more", times: secs(0, 0.1, 0.998, 1.05), tol: ms, violations: 1, worst: 3, allowed: 4},
		{name: "every period one over", times: secs(0, 0, 0, 1, 1, 1, 2, 2, 2), violations: 3, worst: 3, allowed: 6},
	}, func(ts []time.Time, tol time.Duration) Report { return Periods(ts, 2, time.Second, tol) })
}

func TestResets(t *testing.T) {
	// limit 2 per reset, resets 1 s apart, the first one unknown
	runRows(t, []row{
		{name: "empty", times: nil, violations: 0, worst: 0, allowed: 0},
		{name: "a reset soon after the first grants", times: secs(0, 0.01, 0.02, 0.03), violations: 0, worst: 2, allowed: 4},
		{name: "the second reset an interval later", times: secs(0, 0.01, 0.02, 0.03, 0.04), violations: 1, worst: 3, allowed: 4},
		{name: "resets a period apart", times: secs(0, 0.01, 0.5, 0.6, 1.5, 1.6), violations: 0, worst: 2, allowed: 6},
		// A reset may fall between grants recorded at the same instant.
		{name: "two periods at one instant", times: secs(0, 0, 0, 0), violations: 0, worst: 2, allowed: 4},
		{name: "three periods at one instant", times: secs(0, 0, 0, 0, 0), violations: 1, worst: 3, allowed: 4},
		// The first reset falls between 0.5 and 0.6, the second after 1.5.
		{name: "tolerance", times: secs(0, 0.5, 0.6, 0.61, 1.499, 1.6), tol: ms, violations: 0, worst: 2, allowed: 6},
		{name: "no tolerance", times: secs(0, 0.5, 0.6, 0.61, 1.499, 1.6), violations: 1, worst: 3, allowed: 6},
	}, func(ts []time.Time, tol time.Duration) Report { return Resets(ts, 2, time.Second, tol) })
}

func TestGCRA(t *testing.T) {
	// burst 2, 10 per second
	runRows(t, []row{
		{name: "empty", times: nil, violations: 0, worst: 0, allowed: 0},
		{name: "burst then paced, on the boundary", times: secs(0, 0, 0.1, 0.2, 0.3), violations: 0, worst: 2, allowed: 5},
		{name: "one over the burst", times: secs(0, 0, 0), violations: 1, worst: 3, allowed: 2},
		{name: "too soon after the burst", times: secs(0, 0, 0.05), violations: 1, worst: 3, allowed: 2},
		{name: "a nanosecond too soon", times: secs(0, 0, 0.1, 0.2, 0.299999998), violations: 1, worst: 3, allowed: 4},
		{name: "full again after idling", times: secs(0, 5, 5), violations: 0, worst: 2, allowed: 52},
		{name: "idling gives no more than the burst", times: secs(0, 5, 5, 5), violations: 1, worst: 3, allowed: 52},
		{name: "tolerance excuses a millisecond", times: secs(0, 0, 0.099), tol: ms, violations: 0, worst: 3, allowed: 2},
		{name: "tolerance excuses no more", times: secs(0, 0, 0.098), tol: ms, violations: 1, worst: 3, allowed: 2},
		{name: "unsorted input", times: secs(0.3, 0, 0.2, 0, 0.1), violations: 0, worst: 2, allowed: 5},
		{name: "twice the rate", times: secs(0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5), violations: 4, worst: 6, allowed: 7},
	}, func(ts []time.Time, tol time.Duration) Report { return GCRA(ts, 10, 2, tol) })
}

func TestInvalidArgumentsFailClosed(t *testing.T) {
	ts := secs(0, 1)
	for name, r := range map[string]Report{
		"Sliding limit":   Sliding(ts, 0, time.Second, 0),
		"Sliding window":  Sliding(ts, 1, 0, 0),
		"Sliding tol":     Sliding(ts, 1, time.Second, -1),
		"Aligned window":  Aligned(ts, 1, -time.Second, 0, 0),
		"Periods limit":   Periods(ts, -1, time.Second, 0),
		"Resets interval": Resets(ts, 1, 0, 0),
		"GCRA rate":       GCRA(ts, 0, 1, 0),
		"GCRA NaN":        GCRA(ts, math.NaN(), 1, 0),
		"GCRA Inf":        GCRA(ts, math.Inf(1), 1, 0),
		"GCRA burst":      GCRA(ts, 1, 0, 0),
		"empty input":     Sliding(nil, 0, time.Second, 0),
	} {
		assert.Positive(t, r.Violations, name)
		assert.Contains(t, r.Detail, "invalid check", name)
		assert.Error(t, r.Err(), name)
	}
}

func TestUtilization(t *testing.T) {
	// 3 s of a token bucket handing out all it may: 4 refills.
	var ts []time.Time
	for p := range 4 {
		for i := range 100 {
			ts = append(ts, epoch.Add(time.Duration(p)*time.Second+time.Duration(i)*ms))
		}
	}
	r := Periods(ts, 100, time.Second, 0)
	require.NoError(t, r.Err())
	assert.Equal(t, 400, r.Allowed)
	assert.InDelta(t, 1.0, r.Utilization, 1e-9)
	assert.Equal(t, 3099*ms, r.Span)

	// Half the rate.
	r = Periods(ts[:200], 100, 500*ms, 0)
	assert.Equal(t, 2.0/3, r.Utilization) // span 1.099 s: 3 refills of 100
}
