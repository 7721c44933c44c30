package main

import (
	"math"
	"slices"
	"strconv"
	"time"
)

// What the provider saw, counted exactly from the arrival times. Nothing
// here trusts the fleet's own numbers: an arrival is a request the
// provider's handler read, timed under its lock.

// arrival is one request as the provider saw it: when it arrived and, from
// its query (see trace.go), which process sent it, in which class of wait,
// when the call began and when it was sent, and with -trace when its
// permit was granted and what the grant said.
type arrival struct {
	At      time.Time
	Process int    // the child that sent it; -1 when unknown (a refusal)
	Class   string // the call's wait class (short, long, none); "" when unknown
	Began   time.Time
	Sent    time.Time
	// With -trace: when the bucket's granting Take returned (zero if not
	// seen), and its decision's Delay, Reset and Remaining.
	Decided   time.Time
	Delay     time.Duration
	Reset     time.Duration
	Remaining int64
}

// waited is how long the call waited between its start and its send: for
// its permit, and for the permit's place; 0 when unknown.
func (a arrival) waited() time.Duration {
	if a.Began.IsZero() || a.Sent.IsZero() {
		return 0
	}
	return a.Sent.Sub(a.Began)
}

// way is how long the request took from its send to its arrival (the
// machine's scheduling, a stopped process); -1 when unknown.
func (a arrival) way() time.Duration {
	if a.Sent.IsZero() {
		return -1
	}
	return a.At.Sub(a.Sent)
}

// sortArrivals sorts a by arrival time (stable, so that the provider's
// order is kept for equal times).
func sortArrivals(a []arrival) {
	slices.SortStableFunc(a, func(x, y arrival) int { return x.At.Compare(y.At) })
}

// fullest returns the most arrivals in any half-open span [t, t+span), and
// the index of the first arrival of a span that holds that many. ts must
// be sorted. Two pointers: for each arrival j, i is the earliest arrival
// less than span before it, so the span starting at i holds i..j; the
// fullest span starts at an arrival, so these are all the candidates.
func fullest(ts []time.Time, span time.Duration) (most, first int) {
	i := 0
	for j := range ts {
		for ts[j].Sub(ts[i]) >= span {
			i++
		}
		if n := j - i + 1; n > most {
			most, first = n, i
		}
	}
	return most, first
}

// overLimit returns the indices of the fewest arrivals that must be set
// aside for at most limit to be left in any half-open span of span: what a
// provider enforcing that sliding window would have refused. Scanning in
// time order, an arrival is kept when the limit-th kept arrival before it
// is at least span earlier; keeping the earliest that fit is optimal (the
// same count as guarantee.Sliding's Violations at tolerance 0). ts must be
// sorted.
func overLimit(ts []time.Time, limit int, span time.Duration) []int {
	if limit < 1 {
		return nil
	}
	var out []int
	ring := make([]time.Time, 0, min(limit, len(ts)))
	pos := 0
	for j, t := range ts {
		switch {
		case len(ring) < limit:
			ring = append(ring, t)
		case t.Sub(ring[pos]) >= span:
			ring[pos] = t
			pos = (pos + 1) % limit
		default:
			out = append(out, j)
		}
	}
	return out
}

// intervals counts the arrivals in each interval laid end to end from
// from, [from + k·interval, from + (k+1)·interval), for the whole
// intervals that end by end. ts must be sorted.
func intervals(ts []time.Time, from, end time.Time, interval time.Duration) []int {
	n := int(end.Sub(from) / interval)
	if n <= 0 {
		return nil
	}
	counts := make([]int, n)
	for _, t := range ts {
		k := int(t.Sub(from) / interval)
		if t.Before(from) || k >= n {
			continue
		}
		counts[k]++
	}
	return counts
}

// used is the share of what the limit allows that the arrivals used from
// one interval after the first arrival to end: the arrivals in
// [first + interval, end) over limit × (that span ÷ interval). The first
// interval is left out: the fleet's start (connections, first refills)
// is no part of its steady state. NaN when the span is empty.
func used(ts []time.Time, end time.Time, limit int64, interval time.Duration) float64 {
	if len(ts) == 0 {
		return 0
	}
	from := ts[0].Add(interval)
	span := end.Sub(from)
	if span <= 0 {
		return math.NaN()
	}
	n := 0
	for _, t := range ts {
		if !t.Before(from) && t.Before(end) {
			n++
		}
	}
	return float64(n) / (float64(limit) * span.Seconds() / interval.Seconds())
}

// figures is what one round's arrivals show.
type figures struct {
	// Arrivals is every request the provider saw, accepted or refused.
	Arrivals int `json:"arrivals"`
	// Most is the most arrivals in any half-open span of one interval;
	// Multiple is Most ÷ the limit; MostAtS where the first fullest span
	// starts, in seconds from the first arrival.
	Most     int     `json:"most_in_interval"`
	Multiple float64 `json:"most_times_limit"`
	MostAtS  float64 `json:"most_at_s"`
	// MostBy breaks the fullest span down by sender: "p0", "p1", ... per
	// process and "short", "long", "none" per wait class.
	MostBy map[string]int `json:"most_by"`
	// MostAfter is Most among the arrivals from one interval after the
	// first on: the steady state, the fleet's start left out.
	MostAfter int `json:"most_in_interval_after_first"`
	// MostSent is Most by the requests' send times (the children's
	// clocks, the same machine's) instead of their arrivals: the fleet's
	// own pace. Most well above it means the requests bunched on the way
	// (a loaded machine, a stalled provider), not at the Limiters.
	MostSent int `json:"most_in_interval_by_send"`
	// Over is the fewest arrivals that must be set aside for the rest to
	// hold the limit in every span of one interval (what a provider
	// enforcing a sliding window would refuse); OverBy breaks them down
	// as MostBy does; OverWaitedMs is their median wait (the call's start
	// to its send) and OverWayMs their median way (the send to the
	// arrival).
	Over         int            `json:"over_limit"`
	OverBy       map[string]int `json:"over_by,omitempty"`
	OverWaitedMs float64        `json:"over_waited_ms_p50,omitempty"`
	OverWayMs    float64        `json:"over_way_ms_p50,omitempty"`
	// WayP99Ms and WayMaxMs: how long requests took from their send to
	// their arrival, over all arrivals.
	WayP99Ms float64 `json:"way_ms_p99"`
	WayMaxMs float64 `json:"way_ms_max"`
	// Used is the arrivals from one interval after the first to the end
	// of the round over what the limit allows in that span.
	Used float64 `json:"used"`
	// Fewest is the fewest arrivals in a whole interval laid from the
	// first arrival, the first interval left out (a dip).
	Fewest int `json:"fewest_in_interval"`
	// PerInterval is the arrivals per interval from the first arrival.
	PerInterval []int `json:"per_interval"`
}

// count computes the figures of arrivals (any order) for limit per
// interval, up to end, the moment the round was stopped. Arrivals after
// end (calls in flight when the children were told to stop) count for
// Most and Over, which any arrival can break, not for Used or Fewest.
func count(arr []arrival, limit int64, interval time.Duration, end time.Time) figures {
	arr = slices.Clone(arr)
	sortArrivals(arr)
	ts := make([]time.Time, len(arr))
	for i, a := range arr {
		ts[i] = a.At
	}
	f := figures{Arrivals: len(arr)}
	if len(arr) == 0 {
		return f
	}
	var at int
	f.Most, at = fullest(ts, interval)
	f.Multiple = float64(f.Most) / float64(limit)
	f.MostAtS = ts[at].Sub(ts[0]).Seconds()
	f.MostBy = map[string]int{}
	for _, a := range arr[at : at+f.Most] {
		by(f.MostBy, a)
	}
	after, _ := slices.BinarySearchFunc(ts, ts[0].Add(interval), time.Time.Compare)
	f.MostAfter, _ = fullest(ts[after:], interval)
	if over := overLimit(ts, int(min(limit, math.MaxInt32)), interval); len(over) > 0 {
		f.Over = len(over)
		f.OverBy = map[string]int{}
		var waits, ways []time.Duration
		for _, i := range over {
			by(f.OverBy, arr[i])
			if w := arr[i].waited(); w > 0 {
				waits = append(waits, w)
			}
			if w := arr[i].way(); w >= 0 {
				ways = append(ways, w)
			}
		}
		f.OverWaitedMs = quantileMs(waits, 0.5)
		f.OverWayMs = quantileMs(ways, 0.5)
	}
	var (
		ways []time.Duration
		sent []time.Time
	)
	for _, a := range arr {
		if w := a.way(); w >= 0 {
			ways = append(ways, w)
			sent = append(sent, a.Sent)
		}
	}
	slices.SortFunc(sent, time.Time.Compare)
	f.MostSent, _ = fullest(sent, interval)
	f.WayP99Ms, f.WayMaxMs = quantileMs(ways, 0.99), quantileMs(ways, 1)
	f.Used = used(ts, end, limit, interval)
	f.PerInterval = intervals(ts, ts[0], end, interval)
	if len(f.PerInterval) > 1 {
		f.Fewest = slices.Min(f.PerInterval[1:])
	}
	return f
}

// quantileMs is the q-quantile of d (sorted here), in milliseconds; 0
// for none.
func quantileMs(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := min(int(q*float64(len(d))), len(d)-1)
	return float64(d[i]) / float64(time.Millisecond)
}

// by counts a under its process and its class (a refusal of the
// provider's, which names neither, under "429").
func by(m map[string]int, a arrival) {
	if a.Process >= 0 {
		m["p"+strconv.Itoa(a.Process)]++
	}
	if a.Class != "" {
		m[a.Class]++
	} else {
		m["429"]++ // the provider's refusals carry no sender
	}
}
