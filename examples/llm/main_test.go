package main

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// small is a run of a few seconds: windows of a second. The cap's lease
// is 3 s, the shortest whose holders' renewals have a second to answer,
// as a Hold has (bucket.NewConcurrency): under a shorter one, a renewal
// is cut at a third of the lease, and on a busy machine a holder's slot
// can end under its call (the godoc's open case); no instance dies here.
func small() config {
	return config{
		instances: 2, partitions: 4, records: 90,
		rpm: 40, tpm: 2400, concurrency: 3,
		window: time.Second, latency: 50 * time.Millisecond, lease: 3 * time.Second,
		minTokens: 20, maxTokens: 100, estimate: 100,
		timeout: time.Minute, seed: 7, provider: "continuous", headers: "openai",
		handlerTimeout: 10 * time.Second, callTime: time.Second,
	}
}

func runSmall(t *testing.T, c config) summary {
	t.Helper()
	// A real redis-server: the fleet's cap leans on pub/sub and on the
	// server's clock in scripts, which the in-process stand-in serves
	// only roughly under this load.
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "a fleet of instances on one cap and budget")
	c.redisAddr = srv.Addr()
	var out, logs bytes.Buffer
	s, err := run(context.Background(), c, &out, slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("output:\n%s\nlogs:\n%s", out.String(), logs.String())
		}
	})
	require.NoError(t, err)
	return s
}

// The fleet's cap keeps the provider's own: it never refuses a call for
// concurrency; every record reaches it; a provider counting a sliding
// window admits at most its limits in any window (by arrival). The
// handler is a plain client.Do: the Transport takes and settles the cost.
func TestFleetKeepsTheProvidersLimits(t *testing.T) {
	c := small()
	c.provider = "sliding"
	s := runSmall(t, c)
	assert.Zero(t, s.lost, "records lost")
	assert.Equal(t, c.records, s.handled)
	assert.Zero(t, s.stats.RefusedConcurrency, "the fleet's cap kept the calls in flight within the provider's")
	assert.LessOrEqual(t, s.stats.MaxInFlight, int(c.concurrency))
	assert.LessOrEqual(t, s.stats.MaxTokensInWindow, c.tpm)
	assert.NotEmpty(t, s.windows)
	// Estimates taken whole allow tpm/estimate = 24 calls a window; the
	// Transport settles each with its usage (60 tokens on average), and
	// the requests limit (40) binds instead.
	assert.Greater(t, s.stats.MaxRequestsInWindow, c.tpm/c.estimate*5/4, "the estimates were settled with the usage")
	assert.Zero(t, s.stats.Cut, "no call was cut after its permit")
}

// The budget keeps a provider that counts a sliding window from
// refusing: at most its limits in any span of one window at send time,
// however the grants fall. (A budget counted in periods granted a
// period's start right after the late grants of the one before, and the
// provider refused them.)
func TestBudgetIsNotRefusedByASlidingProvider(t *testing.T) {
	c := small()
	c.provider, c.records, c.jitter = "sliding", 240, 20*time.Millisecond
	s := runSmall(t, c)
	assert.Zero(t, s.lost, "records lost")
	assert.LessOrEqual(t, s.stats.MaxRequestsInWindow, c.rpm)
	assert.LessOrEqual(t, s.stats.MaxTokensInWindow, c.tpm)
	assert.LessOrEqual(t, s.stats.Refused*100, s.stats.Accepted, "refusals above 1%% of the calls accepted: %+v", s.stats)
}

// A handler's deadline shorter than the wait for a slot does not cut
// calls: the Transport takes no slot or cost once less than the call's
// time is left (WithCallTime), and the consumer calls the handler again.
// No call sent with less than its time left is cut, no call is ended at
// the client while the provider runs it on, and the provider never meets
// more calls than the cap. A call sent with its time left and cut anyway
// took longer than that time (a busy machine's client reading the answer
// late): not the Transport's, and only logged.
func TestHandlerDeadlineCutsNoCall(t *testing.T) {
	c := small()
	c.handlerTimeout, c.callTime = 400*time.Millisecond, 150*time.Millisecond
	c.rpm, c.tpm = 1000, 100_000 // the cap binds: the records queue for slots
	s := runSmall(t, c)
	assert.Zero(t, s.lost, "records lost")
	assert.Positive(t, s.permitWaits, "handlers met their deadline waiting for a slot")
	assert.Zero(t, s.cutShort, "calls sent with less than their time left, then ended by the handler's deadline")
	if s.cut > 0 {
		t.Logf("%d call(s) cut after a send with their time left: they ran longer than %v", s.cut-s.cutShort, c.callTime)
	}
	assert.Zero(t, s.stats.Cut, "calls the provider ran for a caller gone")
	assert.Zero(t, s.stats.RefusedConcurrency)
	assert.LessOrEqual(t, s.stats.MaxInFlight, int(c.concurrency))
}

// An instance killed in the middle of its calls (its Redis connections
// cut, so it releases nothing) loses no record, and its slots come back
// to the others when their lease ends.
func TestKilledInstanceGivesItsSlotsBack(t *testing.T) {
	c := small()
	c.instances, c.records, c.killAt = 3, 120, 1500*time.Millisecond
	// Calls long enough that the cap binds, and a lease longer than a
	// call: a killed holder's calls still run at the provider until they
	// end, and its slots must not be handed on before.
	c.latency = 200 * time.Millisecond
	c.lease = 600 * time.Millisecond
	c.tpm = 100_000
	s := runSmall(t, c)
	assert.Zero(t, s.lost, "records lost")
	assert.Positive(t, s.killedHeld, "the instance was killed in the middle of its calls")
	require.True(t, s.back, "the other instances held every slot again after the kill")
	t.Logf("killed holding %d slots; all back %v after the kill (lease %v)", s.killedHeld, s.slotsBack, c.lease)
	// The slots expire at most a lease after the dead holder's last
	// renewal, which came before the kill; the rest is the waiters' wake-up
	// and the harness's 20 ms look.
	assert.LessOrEqual(t, s.slotsBack, c.lease+c.lease/2, "the killed instance's slots came back within its lease")
	assert.Zero(t, s.stats.RefusedConcurrency, "a dead holder's slot is not given out twice")
}

func TestBadFlagsAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{"-instances", "0"},
		{"-tpm", "0"},
		{"-estimate", "999999"},
		{"-min-tokens", "10", "-max-tokens", "5"},
		{"-kill-instance-at", "1s", "-instances", "1"},
		{"-provider", "leaky"},
		{"-jitter", "1s"},
		{"-call-time", "10s"},
	} {
		var out, errs bytes.Buffer
		assert.Equal(t, cli.ExitUsage, command(context.Background(), args, &out, &errs), "%v", args)
		assert.Contains(t, errs.String(), "llm: -", "%v: the error names the flag", args)
	}
}

func TestCommandLineConventions(t *testing.T) {
	cli.Check(t, command, cli.Conventions("llm", "-records=0", "-provider=leaky", "-window=x"))
}
