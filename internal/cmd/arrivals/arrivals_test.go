package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/internal/guarantee"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain runs a child of the fleet when the end-to-end test starts this
// binary as one (see childEnv), and otherwise the tests, failing the
// package if any goroutine outlives them.
func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(childMain(spec, os.Stdin, os.Stdout, os.Stderr))
	}
	redisenv.QuietLogs()
	goleak.VerifyTestMain(m)
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// ms lays out times at the given milliseconds after t0.
func ms(v ...int) []time.Time {
	out := make([]time.Time, len(v))
	for i, m := range v {
		out[i] = t0.Add(time.Duration(m) * time.Millisecond)
	}
	return out
}

func TestFullestCountsHalfOpenSpans(t *testing.T) {
	for _, tc := range []struct {
		name       string
		times      []time.Time
		span       time.Duration
		most, from int
	}{
		{"none", nil, time.Second, 0, 0},
		{"one", ms(5), time.Second, 1, 0},
		{"exactly a span apart share no span", ms(0, 250, 500, 750), 250 * time.Millisecond, 1, 0},
		{"a hair less than a span apart share one", ms(0, 249, 500), 250 * time.Millisecond, 2, 0},
		{"the fullest span is in the middle", ms(0, 300, 310, 320, 549, 550, 900), 250 * time.Millisecond, 4, 1},
		{"equal times all count", ms(100, 100, 100, 400), 250 * time.Millisecond, 3, 0},
		{"a burst at a period's edge", ms(0, 10, 20, 240, 245, 250, 255, 260), 250 * time.Millisecond, 6, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			most, from := fullest(tc.times, tc.span)
			assert.Equal(t, tc.most, most)
			assert.Equal(t, tc.from, from)
		})
	}
}

func TestOverLimitSetsAsideTheFewest(t *testing.T) {
	span := 100 * time.Millisecond
	// Limit 2: 0 and 50 fill [0, 100); 60 and 99 cannot go; 100 can
	// (0 is a span before), 150 too (50 is), 160 cannot.
	got := overLimit(ms(0, 50, 60, 99, 100, 150, 160), 2, span)
	assert.Equal(t, []int{2, 3, 6}, got)
	assert.Empty(t, overLimit(ms(0, 50, 100, 150, 200), 2, span))
	assert.Empty(t, overLimit(nil, 2, span))
}

// TestFiguresAgreeWithTheGuaranteeChecker checks the counting against
// internal/guarantee's Sliding checker, written apart, on random arrivals:
// the same fullest span and the same number to set aside.
func TestFiguresAgreeWithTheGuaranteeChecker(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		n := rng.IntN(80)
		limit := 1 + rng.IntN(8)
		span := time.Duration(1+rng.IntN(50)) * time.Millisecond
		ts := make([]time.Time, n)
		for i := range ts {
			ts[i] = t0.Add(time.Duration(rng.IntN(200)) * time.Millisecond) // many ties, many edges
		}
		slices.SortFunc(ts, time.Time.Compare)
		want := guarantee.Sliding(ts, int64(limit), span, 0)
		most, _ := fullest(ts, span)
		require.Equal(t, want.Worst, most, "limit %d span %v times %v", limit, span, ts)
		require.Equal(t, want.Violations, len(overLimit(ts, limit, span)), "limit %d span %v times %v", limit, span, ts)
	}
}

func TestCountReportsUseDipsAndSenders(t *testing.T) {
	interval := 100 * time.Millisecond
	var arr []arrival
	// 5 per interval for ten intervals from t0 (even), but interval 4
	// has 2 only and interval 6 has 7, two of them short calls of p1.
	for k := range 10 {
		n := 5
		switch k {
		case 4:
			n = 2
		case 6:
			n = 7
		}
		for i := range n {
			a := arrival{At: t0.Add(time.Duration(k)*interval + time.Duration(i)*10*time.Millisecond), Process: 0, Class: classNone}
			if k == 6 && i >= 5 {
				a.Process, a.Class, a.Began, a.Sent = 1, classShort, a.At.Add(-20*time.Millisecond), a.At.Add(-time.Millisecond)
			}
			arr = append(arr, a)
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	rng.Shuffle(len(arr), func(i, j int) { arr[i], arr[j] = arr[j], arr[i] })
	f := count(arr, 5, interval, t0.Add(10*interval))
	assert.Equal(t, 49, f.Arrivals)
	assert.Equal(t, 7, f.Most)
	assert.Equal(t, 7, f.MostAfter)
	assert.Equal(t, 2, f.MostSent, "by send time: only p1's calls say when they were sent")
	assert.InDelta(t, 1.4, f.Multiple, 1e-9)
	assert.InDelta(t, 0.6, f.MostAtS, 1e-9)
	assert.Equal(t, map[string]int{"p0": 5, "p1": 2, classNone: 5, classShort: 2}, f.MostBy)
	assert.Equal(t, 2, f.Over)
	assert.Equal(t, map[string]int{"p1": 2, classShort: 2}, f.OverBy)
	assert.InDelta(t, 19, f.OverWaitedMs, 1e-9)
	assert.InDelta(t, 1, f.OverWayMs, 1e-9)
	assert.InDelta(t, 1, f.WayMaxMs, 1e-9)
	assert.Equal(t, []int{5, 5, 5, 5, 2, 5, 7, 5, 5, 5}, f.PerInterval)
	assert.Equal(t, 2, f.Fewest)
	// Used: 44 arrivals from t0+100ms to the end, where 45 are allowed.
	assert.InDelta(t, 44.0/45, f.Used, 1e-9)
}

func TestStatGivesMedianAndRange(t *testing.T) {
	assert.Equal(t, stat{Median: 6, Min: 5, Max: 9}, statOf([]float64{9, 5, 6}))
	assert.Equal(t, stat{Median: 5.5, Min: 5, Max: 6}, statOf([]float64{6, 5}))
	assert.Equal(t, "6 [5–9]", statOf([]float64{9, 5, 6}).format(0))
	assert.Equal(t, "0.98", statOf([]float64{0.98}).format(2))
}

func TestCommandLine(t *testing.T) {
	cases := cli.Conventions("arrivals", "-limit=0", "-interval=0", "-waits=sometimes", "-bucket=counter",
		"-stop=0:30ms:1s", "-rounds=0", "-scenario=nope", "-duration=1s", "-provider-policy=leaky")
	cases = append(cases,
		cli.Case{Name: "stop names no process", Args: []string{"-processes=2", "-stop=2:1s:30ms"}, Code: cli.ExitUsage, Stderr: "no process 2"},
		cli.Case{Name: "scenario sets the limit", Args: []string{"-scenario=matrix", "-limit=7"}, Code: cli.ExitUsage, Stderr: "-limit: not with -scenario"},
		cli.Case{Name: "only matches nothing", Args: []string{"-scenario=matrix", "-only=^nothing$"}, Code: cli.ExitUsage, Stderr: "matches no row"},
		cli.Case{Name: "only without a scenario", Args: []string{"-only=lease"}, Code: cli.ExitUsage, Stderr: "needs -scenario"},
		cli.Case{Name: "margin not below the interval", Args: []string{"-interval=250ms", "-margin=250ms"}, Code: cli.ExitUsage, Stderr: "below the interval"},
		cli.Case{Name: "margin of a bucket without one", Args: []string{"-bucket=gcra", "-margin=3ms"}, Code: cli.ExitUsage, Stderr: "only the tokenbucket and slidinglog"},
	)
	cli.Check(t, command, cases)
}

func TestIssue41HasItsRows(t *testing.T) {
	rows := matrix(scenario{Bucket: "tokenbucket", Duration: 10 * time.Second})
	var names []string
	for _, r := range rows {
		names = append(names, r.Name)
	}
	assert.Len(t, rows, 30)
	for _, want := range []string{"5/250ms mixed 1p", "500/1s none 3p", "50/1s mixed 3p lease", "5/250ms none 3p stop 0:1s:30ms"} {
		assert.Contains(t, names, want)
	}
}

// TestEndToEnd runs the harness itself, small: one child process, two
// workers, 5 per 100 ms for a second, child 0 stopped for 30 ms every
// 400 ms. It checks that the harness runs, stops its children and reports
// what the provider saw, not what the figures are: the limit may or may
// not hold (that is what the harness measures).
func TestEndToEnd(t *testing.T) {
	var out, errs bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dump := t.TempDir() + "/arrivals.jsonl"
	code := command(ctx, []string{"-processes=1", "-workers=2", "-limit=5", "-interval=100ms", "-duration=1s",
		"-stop=0:400ms:30ms", "-trace", "-dump=" + dump, "-json"}, &out, &errs)
	require.Contains(t, []int{cli.ExitOK, cli.ExitFailed}, code, "stderr: %s", errs.String())
	if code == cli.ExitFailed {
		require.Contains(t, errs.String(), "the limit was broken at the provider", "a failure other than the limit's:\n%s", errs.String())
	}
	var got struct {
		Outcomes []outcome `json:"outcomes"`
		Rounds   int       `json:"rounds"`
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &got), "stdout: %s", out.String())
	require.Equal(t, 1, got.Rounds)
	r := got.Outcomes[0].Rounds[0]
	// 5 per 100 ms for a second allows 50, and two workers calling in a
	// closed loop can take them; a broken harness sees none, or far more.
	assert.Greater(t, r.Arrivals, 10, "%+v", r)
	assert.LessOrEqual(t, r.Arrivals, 100, "%+v", r)
	assert.LessOrEqual(t, r.OK, int64(r.Arrivals), "a child counts more answered calls than the provider saw arrive")
	assert.GreaterOrEqual(t, r.Stops, int64(1))
	assert.Empty(t, r.Killed)
	assert.Zero(t, r.Errors, "first error: %s", r.FirstError)
	assert.Positive(t, r.Used, "%+v", r) // how much: a figure of the machine's speed (RESULTS.md)
	// It says which Redis it runs on: one it started, or the stand-in
	// (CI's fresh-machine step hides redis-server).
	assert.Regexp(t, `arrivals: (started|WARNING: redis-server is not installed)`, errs.String())

	// The dump has every arrival, each with its call's times.
	raw, err := os.ReadFile(dump)
	require.NoError(t, err)
	lines = strings.Split(strings.TrimSpace(string(raw)), "\n")
	require.Len(t, lines, r.Arrivals)
	traced := 0
	for _, l := range lines {
		var d dumped
		require.NoError(t, json.Unmarshal([]byte(l), &d))
		require.True(t, d.Began > 0 && d.Began <= d.Sent && d.Sent <= d.At, "%s", l)
		if d.Decided > 0 {
			traced++
		}
	}
	assert.Greater(t, traced, len(lines)/2, "grants the bucket was seen to make")
}

func TestNoteRoundTrips(t *testing.T) {
	n := &callNote{began: t0}
	n.decided = t0.Add(time.Millisecond)
	n.d.Delay, n.d.Reset, n.d.Remaining = 2*time.Millisecond, 90*time.Millisecond, 3
	a := arrival{Remaining: -1}
	decode(n.encode(t0.Add(5*time.Millisecond)), &a)
	assert.True(t, a.Began.Equal(t0))
	assert.True(t, a.Sent.Equal(t0.Add(5*time.Millisecond)))
	assert.True(t, a.Decided.Equal(t0.Add(time.Millisecond)))
	assert.Equal(t, 2*time.Millisecond, a.Delay)
	assert.Equal(t, 90*time.Millisecond, a.Reset)
	assert.Equal(t, int64(3), a.Remaining)

	a = arrival{Remaining: -1}
	decode((&callNote{began: t0}).encode(t0), &a) // no grant seen
	assert.True(t, a.Decided.IsZero())
	assert.Equal(t, int64(-1), a.Remaining)
	decode("garbage", &a)
	assert.True(t, a.Sent.Equal(t0))
}
