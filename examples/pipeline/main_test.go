package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/cli"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPipelineLosesNothingAndStaysUnderTheLimit(t *testing.T) {
	c := config{records: 400, limit: 80, interval: 200 * time.Millisecond, instances: 2, partitions: 4, timeout: time.Minute, topic: "pipeline-test", latency: 20 * time.Millisecond, keys: 1000}
	s, out, err := runLogged(t, c)
	require.NoError(t, err, out.String())
	assert.Equal(t, int64(400), s.Produced)
	assert.Equal(t, int64(400), s.Handled)
	assert.Zero(t, s.Lost)
	assert.Zero(t, s.Provider429)
	assert.LessOrEqual(t, s.MaxInWindow, int64(80))
	assert.Positive(t, s.FirstInterval)
	assert.LessOrEqual(t, s.FirstInterval, s.MaxInAnyInterval)
	assert.Contains(t, out.String(), "most calls the provider saw in any span of 200ms, by arrival")
	assert.Contains(t, out.String(), "produced 400, handled 400, lost 0")
	assert.Contains(t, out.String(), "steady state at the provider")
	assert.Positive(t, s.PeakInFlight)
	assertOnePermitPerCall(t, s)
	assert.GreaterOrEqual(t, s.Attempts, int64(400))
}

// assertOnePermitPerCall checks that each call took one permit: the
// permits the Limiters granted (counted by an Observer) are the calls the
// provider saw and the permits the consumers took that no call used
// (consumer.Stats.PermitsUnused: past their margin, their record or their
// call gone, as a revocation does); and a handler call made at most one
// call (a call cut by a revocation makes none).
func assertOnePermitPerCall(t *testing.T, s summary) {
	t.Helper()
	assert.GreaterOrEqual(t, s.Attempts, s.ProviderCalls, "handler calls, at most one provider call each")
	if s.Provider429 == 0 {
		assert.Equal(t, s.ProviderCalls+s.Unused, s.Permits, "permits granted: one per call at the provider, and those no call used")
	} else { // with 429s, checked as a bound only
		assert.GreaterOrEqual(t, s.Permits, s.ProviderCalls+s.Unused, "permits granted: one per call at the provider, and those no call used")
	}
}

// runLogged runs the demo with c, and shows what it printed and logged
// if the test fails, to tell why.
func runLogged(t *testing.T, c config) (summary, *bytes.Buffer, error) {
	t.Helper()
	var out, logs bytes.Buffer
	s, err := run(context.Background(), c, &out, slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("output:\n%s\nlogs:\n%s", out.String(), logs.String())
		}
	})
	return s, &out, err
}

func TestSteadySeconds(t *testing.T) {
	t0 := time.Unix(100, 0)
	at := func(ms ...int) []time.Time {
		var ts []time.Time
		for _, m := range ms {
			ts = append(ts, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return ts
	}
	assert.Nil(t, steadySeconds(nil, t0))
	assert.Empty(t, steadySeconds(at(0, 10, 999), t0), "one second, the last: no steady state")
	assert.Equal(t, []int64{3, 0, 1}, steadySeconds(at(0, 10, 999, 2500, 3000, 3100), t0))
	assert.Equal(t, []int64{2, 1}, steadySeconds(at(0, 10, 999, 1500, 1600, 2600, 3600), t0.Add(time.Second)),
		"from the first call after the group settled")
	lo, med := shares([]int64{50, 100, 80, 90}, 100)
	assert.Equal(t, 0.5, lo)
	assert.Equal(t, 0.85, med)
}

func TestPipelineRefusesBadFlags(t *testing.T) {
	good := config{records: 1, limit: 1, interval: time.Second, instances: 1, partitions: 1, timeout: time.Second, keys: 1}
	tests := []struct {
		name string
		mod  func(*config)
		want string
	}{
		{"records", func(c *config) { c.records = 0 }, "-records 0"},
		{"limit", func(c *config) { c.limit = -1 }, "-limit -1"},
		{"interval", func(c *config) { c.interval = time.Microsecond }, "-interval 1µs"},
		{"instances", func(c *config) { c.instances = 0 }, "-instances 0"},
		{"partitions", func(c *config) { c.partitions = 5000 }, "-partitions 5000"},
		{"timeout", func(c *config) { c.timeout = 0 }, "-timeout 0s"},
		{"target", func(c *config) { c.target = "ftp://x" }, `-target "ftp://x"`},
		{"latency", func(c *config) { c.latency = -time.Second }, "-latency -1s"},
		{"inflight", func(c *config) { c.inFlight = -1 }, "-inflight -1"},
		{"ordering", func(c *config) { c.ordering = "chaos" }, `-ordering "chaos"`},
		{"keys", func(c *config) { c.keys = 0 }, "-keys 0"},
		{"provider", func(c *config) { c.policy = "leaky" }, `-provider "leaky"`},
		{"permits", func(c *config) { c.permits = "neither" }, `-permits "neither"`},
		{"urgent-reserve", func(c *config) { c.tenants, c.share, c.reserve = "A:1,U:1!", 0.2, 1 }, "-urgent-reserve 1: want a part of -limit (1)"},
		{"urgent-reserve without -tenants", func(c *config) { c.limit, c.reserve = 10, 1 }, "-urgent-reserve 1: want a part of -limit (10), at least 1 and below it, with -tenants"},
		{"urgent-reserve without an urgent tenant", func(c *config) { c.limit, c.tenants, c.share, c.reserve = 10, "A:1", 0.2, 1 }, "no tenant is urgent"},
		{"urgent-reserve with -permits transport", func(c *config) {
			c.limit, c.tenants, c.share, c.reserve, c.permits = 10, "A:1,U:1!", 0.2, 1, "transport"
		}, "-urgent-reserve 1 with -permits transport"},
		{"tenants with -permits transport", func(c *config) { c.tenants, c.share, c.fair, c.permits = "A:1,B:1", 0.2, true, "transport" }, "-tenants with -permits transport"},
		{"urgent-reserve with -fair=false", func(c *config) { c.limit, c.tenants, c.share, c.reserve, c.fair = 10, "A:1,U:1!", 0.2, 1, false }, "-urgent-reserve 1 with -fair=false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.mod(&c)
			_, err := run(context.Background(), c, io.Discard, slog.Default())
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

// TestCommandLine checks the conventions every example tool keeps (see
// internal/cli): usage on -h, exit 2 with one line for bad usage, exit 1
// when the run fails its own check, and the summary on SIGTERM.
func TestCommandLine(t *testing.T) {
	cli.Check(t, command, append(cli.Conventions("pipeline", "-records=0", "-interval=1us", "-target=ftp://x", "-records=many"),
		cli.Case{Name: "records not handled in time", Args: []string{"-records", "100000", "-timeout", "4s"}, Code: cli.ExitFailed, Stdout: "produced", Stderr: "records not handled yet"},
	))
	cli.Terminate(t, command, []string{"-records", "100000"}, "/100000 handled", "produced", cli.ExitFailed)
}

func TestFirstInterval(t *testing.T) {
	t0 := time.Unix(100, 0)
	at := func(ms ...int) []time.Time {
		var ts []time.Time
		for _, m := range ms {
			ts = append(ts, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return ts
	}
	assert.Zero(t, firstInterval(nil, time.Second))
	assert.Equal(t, int64(3), firstInterval(at(0, 10, 999, 1000, 1500), time.Second), "the span from the first call, its end excluded")
	assert.Equal(t, int64(1), firstInterval(at(0, 1000), time.Second))
}

func TestParseTenants(t *testing.T) {
	ts, err := parseTenants("A:2000,B:20@2/s,C:5*4,U:3@0.5/s!")
	require.NoError(t, err)
	assert.Equal(t, []tenantSpec{
		{name: "A", count: 2000, weight: 1},
		{name: "B", count: 20, rate: 2, weight: 1},
		{name: "C", count: 5, weight: 4},
		{name: "U", count: 3, rate: 0.5, weight: 1, urgent: true},
	}, ts)
	for _, bad := range []string{"", "A", "A:", "A:0", "A-B:3", "A:3,A:4", "A:3@0/s", "A:3*0", "A:3*x", ":3"} {
		_, err := parseTenants(bad)
		assert.Error(t, err, bad)
	}
}

// -tenants with WithFairness: a tenant that produces after another's
// backlog is handled while the backlog lasts, not after it, every record
// is handled once, and each tenant's waits are printed.
func TestPipelineTenantsShareTheLimit(t *testing.T) {
	c := config{limit: 50, interval: 250 * time.Millisecond, instances: 2, partitions: 4, timeout: time.Minute, topic: "pipeline-tenants",
		latency: 5 * time.Millisecond, keys: 50, tenants: "A:600,B:5@10/s", fair: true, share: 0.2}
	s, out, err := runLogged(t, c)
	require.NoError(t, err, out.String())
	assert.Equal(t, int64(605), s.Handled)
	assert.Zero(t, s.Lost)
	assert.Zero(t, s.BehindInKey)
	require.Len(t, s.Tenants, 2)
	assert.Equal(t, 5, s.Tenants[1].Calls)
	assert.Positive(t, s.TenantSpan, "B's records were handled while A's lasted")
	assert.Contains(t, out.String(), "per tenant, from produce to the handler call")
}

// -urgent-reserve: the urgent records' own bucket beside the shared one
// (consumer.UrgentReserve): together they keep the limit at the
// provider, each call takes one permit (a reserve permit serves the
// Transport's request too), and every record is handled once.
func TestPipelineUrgentReserveKeepsTheLimitWithOnePermitPerCall(t *testing.T) {
	c := config{limit: 50, interval: 250 * time.Millisecond, instances: 2, partitions: 4, timeout: time.Minute, topic: "pipeline-reserve",
		latency: 5 * time.Millisecond, keys: 50, tenants: "A:600,U:5@10/s!", fair: true, share: 0.2, reserve: 5}
	s, out, err := runLogged(t, c)
	require.NoError(t, err, out.String())
	assert.Equal(t, int64(605), s.Handled)
	assert.Zero(t, s.Lost)
	assert.Zero(t, s.Provider429)
	assert.Zero(t, s.BehindInKey)
	assert.LessOrEqual(t, s.MaxInWindow, int64(50))
	assertOnePermitPerCall(t, s)
	require.Len(t, s.Tenants, 2)
	assert.Equal(t, 5, s.Tenants[1].Calls)
	assert.Contains(t, out.String(), "and one of 5 for urgent records (consumer.UrgentReserve)")
}

// -urgent-reserve with urgent records alone: each call takes one permit,
// the reserve's, none of the shared bucket's besides (no other record is
// there to take a shared permit asked for an urgent record).
func TestPipelineUrgentReserveAloneTakesOnePermitPerCall(t *testing.T) {
	c := config{limit: 50, interval: 250 * time.Millisecond, instances: 2, partitions: 4, timeout: time.Minute, topic: "pipeline-reserve-alone",
		latency: 5 * time.Millisecond, keys: 50, tenants: "U:20@20/s!", fair: true, share: 0.2, reserve: 25}
	s, out, err := runLogged(t, c)
	require.NoError(t, err, out.String())
	assert.Equal(t, int64(20), s.Handled)
	assert.Zero(t, s.Lost)
	assertOnePermitPerCall(t, s)
}
