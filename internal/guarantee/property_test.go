package guarantee

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The checkers against brute-force oracles, on many small random
// sequences: same verdict, and for the checkers that claim it, the same
// (fewest) number of grants to set aside.

// smallCase draws up to 9 grants on a millisecond grid over about three
// windows of 100 ms, clustered so that edges and ties are common.
func smallCase(rng *rand.Rand) (ns []int64, limit int64, tol time.Duration) {
	n := rng.IntN(10)
	ns = make([]int64, n)
	for i := range ns {
		switch rng.IntN(4) {
		case 0: // near an edge
			ns[i] = int64(100*rng.IntN(4)-2+rng.IntN(5)) * 1e6
		case 1: // a tie with an earlier grant
			if i > 0 {
				ns[i] = ns[rng.IntN(i)]
				break
			}
			fallthrough
		default:
			ns[i] = int64(rng.IntN(300)) * 1e6
		}
	}
	slices.Sort(ns)
	return ns, int64(1 + rng.IntN(3)), time.Duration(rng.IntN(3)) * 2 * time.Millisecond
}

func asTimes(ns []int64) []time.Time {
	out := make([]time.Time, len(ns))
	for i, v := range ns {
		out[i] = epoch.Add(time.Duration(v))
	}
	return out
}

// fewestRemovals is the fewest grants to drop so that ok holds for the
// rest, by trying every subset.
func fewestRemovals(ns []int64, ok func([]int64) bool) int {
	best := len(ns)
	kept := make([]int64, 0, len(ns))
	for mask := 0; mask < 1<<len(ns); mask++ {
		kept = kept[:0]
		for i, v := range ns {
			if mask&(1<<i) != 0 {
				kept = append(kept, v)
			}
		}
		if len(ns)-len(kept) < best && ok(kept) {
			best = len(ns) - len(kept)
		}
	}
	return best
}

const propWindow = 100 * time.Millisecond

func TestSlidingMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		ns, limit, tol := smallCase(rng)
		ok := func(ts []int64) bool {
			for i := range ts {
				for j := i + int(limit); j < len(ts); j++ {
					if ts[j]-ts[i] < int64(propWindow-tol) {
						return false
					}
				}
			}
			return true
		}
		r := Sliding(asTimes(ns), limit, propWindow, tol)
		require.Equal(t, fewestRemovals(ns, ok), r.Violations, "%v limit %d tol %v: %s", ns, limit, tol, r.Detail)
	}
}

func TestAlignedMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	w := propWindow.Nanoseconds()
	for range 3000 {
		ns, limit, tol := smallCase(rng)
		// Fewest grants over a window's limit, over every assignment of
		// each grant to a window it may count in.
		d := tol.Nanoseconds()
		best := math.MaxInt
		var try func(i int, counts map[int64]int64)
		try = func(i int, counts map[int64]int64) {
			if i == len(ns) {
				excess := 0
				for _, c := range counts {
					excess += int(max(0, c-limit))
				}
				best = min(best, excess)
				return
			}
			for k := floorDiv(ns[i]-d, w); k <= floorDiv(ns[i], w); k++ { // decided in [t-d, t]
				counts[k]++
				try(i+1, counts)
				counts[k]--
			}
		}
		try(0, map[int64]int64{})
		r := Aligned(asTimes(ns), limit, propWindow, 0, tol)
		require.Equal(t, best, r.Violations, "%v limit %d tol %v: %s", ns, limit, tol, r.Detail)
	}
}

func TestGCRAMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 3000 {
		ns, burst, tol := smallCase(rng)
		rate := int64(10 + 10*rng.IntN(5)) // per second
		ok := func(ts []int64) bool {
			for i := range ts {
				for j := i; j < len(ts); j++ {
					if (int64(j-i+1)-burst)*1e9 > rate*(ts[j]-ts[i]+int64(tol)) {
						return false
					}
				}
			}
			return true
		}
		r := GCRA(asTimes(ns), float64(rate), burst, tol)
		require.Equal(t, fewestRemovals(ns, ok), r.Violations, "%v burst %d rate %d tol %v: %s", ns, burst, rate, tol, r.Detail)
		if tol == 0 && r.Grants > 0 {
			// Worst is the smallest burst that passes.
			assert.Zero(t, GCRA(asTimes(ns), float64(rate), int64(r.Worst), 0).Violations)
			if r.Worst > 1 {
				assert.NotZero(t, GCRA(asTimes(ns), float64(rate), int64(r.Worst-1), 0).Violations)
			}
		}
	}
}

func TestPeriodsMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for range 3000 {
		ns, limit, tol := smallCase(rng)
		for _, anchored := range []bool{true, false} {
			// Try every way to cut the grants into periods; place each
			// refill as early as it may be.
			gap := int64(propWindow - tol)
			feasible := len(ns) == 0
			for mask := 0; mask < 1<<max(len(ns)-1, 0) && !feasible; mask++ {
				r := ns[0]
				if !anchored {
					r = math.MinInt64 / 2
				}
				size, good := int64(1), true
				for b := 1; b < len(ns) && good; b++ {
					if mask&(1<<(b-1)) == 0 { // same period
						size++
						good = size <= limit
						continue
					}
					r = max(ns[b-1], r+gap)
					size, good = 1, r <= ns[b]
				}
				feasible = good && size <= limit
			}
			r := periods(asTimes(ns), limit, propWindow, tol, anchored)
			require.Equal(t, feasible, r.Violations == 0, "%v limit %d tol %v anchored %v: %s", ns, limit, tol, anchored, r.Detail)
			if r.Violations == 0 {
				assert.LessOrEqual(t, r.Worst, int(limit))
			}
		}
	}
}

// A larger tolerance never finds more violations.
func TestToleranceOnlyLoosens(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for range 2000 {
		ns, limit, _ := smallCase(rng)
		ts := asTimes(ns)
		prev := map[string]int{}
		for tol := time.Duration(0); tol <= 10*time.Millisecond; tol += time.Millisecond {
			for name, v := range map[string]int{
				"sliding": Sliding(ts, limit, propWindow, tol).Violations,
				"aligned": Aligned(ts, limit, propWindow, 0, tol).Violations,
				"gcra":    GCRA(ts, 10, limit, tol).Violations,
				"periods": min(1, Periods(ts, limit, propWindow, tol).Violations),
				"resets":  min(1, Resets(ts, limit, propWindow, tol).Violations),
			} {
				if p, ok := prev[name]; ok {
					require.LessOrEqual(t, v, p, "%s %v limit %d tol %v", name, ns, limit, tol)
				}
				prev[name] = v
			}
		}
	}
}

// Large sequences that keep each guarantee by construction, as a busy
// bucket would hand them out: 0 violations, high utilization, fast. Then a
// few grants too many at a full spot: found, and no more than those.

const bigN = 200_000

type built struct {
	name   string
	times  []int64
	check  func([]time.Time) Report
	inject int64 // where the sequence is full, for extra grants
}

func buildAll(rng *rand.Rand) []built {
	const limit = 1000
	w := int64(time.Second)
	jitter := func(max int64) int64 { return rng.Int64N(max + 1) }
	var out []built

	{ // Sliding: each grant at least a window after the limit-th before it,
		// often exactly.
		ts := make([]int64, bigN)
		for k := 1; k < bigN; k++ {
			ts[k] = ts[k-1] + jitter(100_000)*int64(rng.IntN(2))
			if k >= limit {
				ts[k] = max(ts[k], ts[k-limit]+w)
			}
		}
		k := bigN / 2
		for ts[k]-ts[k-limit+1] >= w { // a full window
			k++
		}
		out = append(out, built{"Sliding", ts, func(x []time.Time) Report { return Sliding(x, limit, time.Second, 0) }, ts[k]})
	}
	{ // Aligned: limit grants somewhere in each window.
		var ts []int64
		for k := int64(0); len(ts) < bigN; k++ {
			for range limit {
				ts = append(ts, k*w+jitter(w-1))
			}
		}
		slices.Sort(ts)
		out = append(out, built{"Aligned", ts, func(x []time.Time) Report { return Aligned(x, limit, time.Second, 0, 0) }, 100*w + w/2})
	}
	// Periods and Resets: refills exactly an interval apart, each made
	// for a grant, limit grants per period. For Resets the first period
	// begins before the first grant and its last grant ends it.
	periodsSeq := func(unanchored bool) []int64 {
		var ts []int64
		r0 := int64(0)
		if unanchored {
			r0 = -1 - jitter(w-2)
		}
		for k := int64(0); len(ts) < bigN; k++ {
			r, next := r0+k*w, r0+(k+1)*w
			lo := max(r, 0)
			ts = append(ts, lo)
			if k == 0 && unanchored {
				ts = append(ts, next-1)
			}
			for int64(len(ts)) < (k+1)*limit {
				ts = append(ts, lo+jitter(next-lo-1))
			}
		}
		slices.Sort(ts)
		return ts[:bigN]
	}
	{
		ts := periodsSeq(false)
		out = append(out, built{"Periods", ts, func(x []time.Time) Report { return Periods(x, limit, time.Second, 0) }, ts[bigN/2]})
	}
	{
		ts := periodsSeq(true)
		out = append(out, built{"Resets", ts, func(x []time.Time) Report { return Resets(x, limit, time.Second, 0) }, ts[bigN/2]})
	}
	{ // GCRA: a token bucket refilled continuously, asked twice as often
		// as it allows.
		const rate, burst = 10_000.0, 100
		ts := make([]int64, 0, bigN)
		tokens, now := float64(burst), int64(0)
		var empty int64 // a grant that emptied the bucket, past the middle
		for len(ts) < bigN {
			dt := int64(rng.ExpFloat64() * 1e9 / (2 * rate))
			now += dt
			tokens = min(burst, tokens+rate*float64(dt)/1e9)
			if tokens >= 1 {
				tokens--
				ts = append(ts, now)
				if tokens < 0.5 && empty == 0 && len(ts) > bigN/2 {
					empty = now
				}
			}
		}
		out = append(out, built{"GCRA", ts, func(x []time.Time) Report { return GCRA(x, rate, burst, 0) }, empty})
	}
	return out
}

func TestLargeCompliantSequences(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, b := range buildAll(rng) {
		t.Run(b.name, func(t *testing.T) {
			ts := asTimes(b.times)
			start := time.Now()
			r := b.check(ts)
			took := time.Since(start)
			t.Logf("%s in %v", r, took)
			require.NoError(t, r.Err())
			assert.Equal(t, len(ts), r.Grants)
			assert.Greater(t, r.Utilization, 0.5)
			assert.LessOrEqual(t, r.Utilization, 1.0)
			assert.Less(t, took, 5*time.Second, "a check of %d grants must be fast", len(ts))

			// Three grants too many at one full spot.
			bad := slices.Concat(b.times, []int64{b.inject, b.inject, b.inject})
			slices.Sort(bad)
			r = b.check(asTimes(bad))
			t.Log(r)
			assert.GreaterOrEqual(t, r.Violations, 1, r.Detail)
			assert.LessOrEqual(t, r.Violations, 3, r.Detail)
		})
	}
}

func BenchmarkCheckers(b *testing.B) {
	for _, c := range buildAll(rand.New(rand.NewPCG(13, 14))) {
		ts := asTimes(c.times)
		b.Run(fmt.Sprintf("%s/n=%d", c.name, len(ts)), func(b *testing.B) {
			for b.Loop() {
				c.check(ts)
			}
		})
	}
}
