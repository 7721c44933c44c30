package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Printing: one line per round, then each figure's median and range over
// the rounds, or one table for a scenario's rows.

// stat is a figure over several rounds.
type stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// statOf returns the median (the mean of the middle two for an even
// count) and the range of v; NaNs are left out.
func statOf(v []float64) stat {
	v = slices.DeleteFunc(slices.Clone(v), math.IsNaN)
	if len(v) == 0 {
		return stat{math.NaN(), math.NaN(), math.NaN()}
	}
	slices.Sort(v)
	n := len(v)
	m := v[n/2]
	if n%2 == 0 {
		m = (v[n/2-1] + v[n/2]) / 2
	}
	return stat{Median: m, Min: v[0], Max: v[n-1]}
}

// format writes s with prec decimals: "7 [6–8]", or "7" when every round
// gave the same at that precision.
func (s stat) format(prec int) string {
	if math.IsNaN(s.Median) {
		return "-"
	}
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', prec, 64) }
	if f(s.Min) == f(s.Max) {
		return f(s.Median)
	}
	return f(s.Median) + " [" + f(s.Min) + "–" + f(s.Max) + "]"
}

// summary is a configuration's figures over its rounds.
type summary struct {
	Rounds int `json:"rounds"`
	// Broken is the rounds with more than the limit in some span of one
	// interval.
	Broken    int  `json:"rounds_broken"`
	Most      stat `json:"most_in_interval"`
	MostAfter stat `json:"most_in_interval_after_first"`
	MostSent  stat `json:"most_in_interval_by_send"`
	Multiple  stat `json:"most_times_limit"`
	Over      stat `json:"over_limit"`
	Used      stat `json:"used"`
	Fewest    stat `json:"fewest_in_interval"`
	Arrivals  stat `json:"arrivals"`
	Refused   stat `json:"refused"`
	Deadline  stat `json:"deadline"`
	Errors    stat `json:"errors"`
	Status429 stat `json:"status_429"`
	Degraded  stat `json:"degraded"`
	Load      stat `json:"load"`
}

func summarize(rs []roundResult, limit int64) summary {
	s := summary{Rounds: len(rs)}
	of := func(f func(r roundResult) float64) stat {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return statOf(v)
	}
	for _, r := range rs {
		if r.Most > int(limit) {
			s.Broken++
		}
	}
	s.Most = of(func(r roundResult) float64 { return float64(r.Most) })
	s.MostAfter = of(func(r roundResult) float64 { return float64(r.MostAfter) })
	s.MostSent = of(func(r roundResult) float64 { return float64(r.MostSent) })
	s.Multiple = of(func(r roundResult) float64 { return r.Multiple })
	s.Over = of(func(r roundResult) float64 { return float64(r.Over) })
	s.Used = of(func(r roundResult) float64 { return r.Used })
	s.Fewest = of(func(r roundResult) float64 { return float64(r.Fewest) })
	s.Arrivals = of(func(r roundResult) float64 { return float64(r.Arrivals) })
	s.Refused = of(func(r roundResult) float64 { return float64(r.Refused) })
	s.Deadline = of(func(r roundResult) float64 { return float64(r.Deadline) })
	s.Errors = of(func(r roundResult) float64 { return float64(r.Errors) })
	s.Status429 = of(func(r roundResult) float64 { return float64(r.Status429) })
	s.Degraded = of(func(r roundResult) float64 { return float64(r.Degraded) })
	s.Load = of(func(r roundResult) float64 { return r.Load })
	return s
}

// print writes s as a few lines.
func (s summary) print(w io.Writer) {
	fmt.Fprintf(w, "over %d rounds, median [range]:\n", s.Rounds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  most in one interval\t%s\t(%s× the limit)\n", s.Most.format(0), s.Multiple.format(2))
	fmt.Fprintf(tw, "  the same, after the first\t%s\t(the fleet's start left out)\n", s.MostAfter.format(0))
	fmt.Fprintf(tw, "  the same, by send time\t%s\t(the fleet's own pace, before the way to the provider)\n", s.MostSent.format(0))
	fmt.Fprintf(tw, "  over the limit\t%s\t(arrivals a sliding window of the limit would refuse)\n", s.Over.format(0))
	fmt.Fprintf(tw, "  used\t%s\t\n", s.Used.format(3))
	fmt.Fprintf(tw, "  fewest in an interval\t%s\t\n", s.Fewest.format(0))
	fmt.Fprintf(tw, "  arrivals\t%s\t\n", s.Arrivals.format(0))
	fmt.Fprintf(tw, "  refused by the limiter\t%s\t\n", s.Refused.format(0))
	fmt.Fprintf(tw, "  deadline, errors, 429\t%s, %s, %s\t\n", s.Deadline.format(0), s.Errors.format(0), s.Status429.format(0))
	fmt.Fprintf(tw, "  failure-policy grants\t%s\t(the shared bucket's store failed)\n", s.Degraded.format(0))
	fmt.Fprintf(tw, "  load average\t%s\t\n", s.Load.format(1))
	tw.Flush()
	if s.Broken > 0 {
		fmt.Fprintf(w, "  the limit was broken in %d of %d rounds\n", s.Broken, s.Rounds)
	} else {
		fmt.Fprintf(w, "  the limit held in every round\n")
	}
}

// line is one round on one line.
func (r roundResult) line(limit int64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "round %d: most %d (%.2f× %d) at %.2fs [%s], %d after the first interval, %d by send time", r.Round, r.Most, r.Multiple, limit, r.MostAtS, byString(r.MostBy), r.MostAfter, r.MostSent)
	if r.Over > 0 {
		fmt.Fprintf(&b, "; over %d [%s; waited p50 %.0fms, on the way p50 %.1fms]", r.Over, byString(r.OverBy), r.OverWaitedMs, r.OverWayMs)
	} else {
		b.WriteString("; over 0")
	}
	fmt.Fprintf(&b, "; used %.3f; fewest %d; %d arrivals; calls %d ok, %d refused", r.Used, r.Fewest, r.Arrivals, r.OK, r.Refused)
	if len(r.RefusedBy) > 0 {
		fmt.Fprintf(&b, " (%s)", byString64(r.RefusedBy))
	}
	fmt.Fprintf(&b, ", %d deadline, %d errors, %d × 429", r.Deadline, r.Errors, r.Status429)
	if r.FirstError != "" {
		fmt.Fprintf(&b, " (first error: %s)", r.FirstError)
	}
	if r.StoreErrors+r.Degraded > 0 {
		fmt.Fprintf(&b, "; %d store errors, %d failure-policy grants", r.StoreErrors, r.Degraded)
	}
	if r.Stops > 0 {
		fmt.Fprintf(&b, "; %d stops", r.Stops)
	}
	if len(r.Killed) > 0 {
		fmt.Fprintf(&b, "; KILLED processes %v", r.Killed)
	}
	if r.Stuck > 0 {
		fmt.Fprintf(&b, "; %d workers stuck at the stop", r.Stuck)
	}
	fmt.Fprintf(&b, "; send to arrival p99 %.1fms, max %.1fms; load %.1f", r.WayP99Ms, r.WayMaxMs, r.Load)
	return b.String()
}

// byOrder sorts the keys of a breakdown: processes by number, then the
// classes in the order of classes, then the rest.
func byOrder(keys []string) []string {
	rank := func(k string) (int, int) {
		if n, err := strconv.Atoi(strings.TrimPrefix(k, "p")); err == nil && strings.HasPrefix(k, "p") {
			return 0, n
		}
		if i := slices.Index(classes, k); i >= 0 {
			return 1, i
		}
		return 2, 0
	}
	slices.SortFunc(keys, func(a, b string) int {
		ga, na := rank(a)
		gb, nb := rank(b)
		if ga != gb {
			return ga - gb
		}
		if na != nb {
			return na - nb
		}
		return strings.Compare(a, b)
	})
	return keys
}

func byString(m map[string]int) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	var parts []string
	for _, k := range byOrder(keys) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func byString64(m map[string]int64) string {
	n := make(map[string]int, len(m))
	for k, v := range m {
		n[k] = int(v)
	}
	return byString(n)
}

// table writes one row per configuration: medians and ranges.
func table(w io.Writer, outs []outcome) {
	if len(outs) == 0 {
		return
	}
	fmt.Fprintf(w, "\nmedian [range] over %d rounds of %v each; most: the most arrivals in any span of one interval\n", outs[0].Summary.Rounds, outs[0].Scenario.Duration)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tworkers\tmost\t× limit\tafter 1st\tby send\tover\tused\tfewest\trefused\tfail-policy\tbroken\tload\t")
	for _, o := range outs {
		s, sc := o.Summary, o.Scenario
		fmt.Fprintf(tw, "%s\t%d×%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t\n", sc.Name, sc.Processes, sc.Workers,
			s.Most.format(0), s.Multiple.format(2), s.MostAfter.format(0), s.MostSent.format(0), s.Over.format(0), s.Used.format(3), s.Fewest.format(0),
			s.Refused.format(0), s.Degraded.format(0), s.Broken, s.Rounds, s.Load.format(1))
	}
	tw.Flush()
}
