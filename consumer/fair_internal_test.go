package consumer

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/throttle"
)

// fairFixture is a scheduler without Kafka or seekers: records are added
// as fresh candidates and permits are given by calling pick, so the
// order of grants is exact.
type fairFixture struct {
	f *fair
	p *partition
	k throttle.Keyed
	n int64
}

func newFairFixture(t *testing.T, opts ...FairOption) *fairFixture {
	t.Helper()
	cfg := newConfig([]Option{WithFairness(func(r *kgo.Record) string { return string(r.Key) }, opts...)})
	require.NoError(t, cfg.err)
	c := &Consumer{cfg: cfg, log: cfg.logger}
	b, err := throttle.NewLocal(1, time.Second)
	require.NoError(t, err)
	return &fairFixture{f: newFair(c, cfg.fair), p: &partition{c: c}, k: throttle.New(b).Key("")}
}

// add queues n records of tenant, urgent or not.
func (x *fairFixture) add(tenant string, n int, urgent bool) {
	x.f.mu.Lock()
	defer x.f.mu.Unlock()
	for range n {
		s := &record{rec: kgo.Record{Key: []byte(tenant), Offset: x.n}, tenant: tenant, urgent: urgent, classified: true}
		x.n++
		x.f.add(&cand{p: x.p, r: s, tenant: tenant, urgent: urgent, k: x.k})
	}
}

// grant gives one permit and returns the tenant it went to ("" if none),
// with a "!" when the record was urgent.
func (x *fairFixture) grant() string {
	x.f.mu.Lock()
	defer x.f.mu.Unlock()
	cd, _ := x.f.q.pick(x.k, true, false)
	if cd == nil {
		return ""
	}
	if cd.r.urgent {
		return cd.r.tenant + "!"
	}
	return cd.r.tenant
}

// localLimiter is a Limiter of 1 per second in process.
func localLimiter(t *testing.T) *throttle.Limiter {
	t.Helper()
	b, err := throttle.NewLocal(1, time.Second)
	require.NoError(t, err)
	return throttle.New(b)
}

func (x *fairFixture) grants(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = x.grant()
	}
	return out
}

func TestFairTenantWithOneRecordGetsTheNextPermitBehindABacklog(t *testing.T) {
	x := newFairFixture(t)
	x.add("A", 2000, false)
	assert.Equal(t, []string{"A", "A", "A"}, x.grants(3), "a tenant alone takes every permit")
	x.add("B", 1, false)
	assert.Equal(t, "B", x.grant(), "B's one record is the next permit's, whatever A's backlog")
	assert.Equal(t, []string{"A", "A"}, x.grants(2))

	// Several records of B arriving one at a time each get the next permit.
	for range 5 {
		x.add("B", 1, false)
		assert.Equal(t, "B", x.grant())
		assert.Equal(t, "A", x.grant())
	}
}

func TestFairBacklogsShareByWeight(t *testing.T) {
	x := newFairFixture(t, Weights(map[string]int{"one": 1, "two": 2, "four": 4}))
	x.add("one", 10000, false)
	x.add("two", 10000, false)
	x.add("four", 10000, false)
	got := map[string]int{}
	for _, g := range x.grants(7000) {
		got[g]++
	}
	for tenant, want := range map[string]int{"one": 1000, "two": 2000, "four": 4000} {
		assert.InDelta(t, want, got[tenant], 1, "tenant %s", tenant)
	}
	// Within every window of 7 grants, each gets its weight, give or take one.
	seq := x.grants(700)
	for i := 0; i+7 <= len(seq); i += 7 {
		w := map[string]int{}
		for _, g := range seq[i : i+7] {
			w[g]++
		}
		assert.InDelta(t, 4, w["four"], 1, "window %d: %v", i, seq[i:i+7])
		assert.InDelta(t, 2, w["two"], 1, "window %d: %v", i, seq[i:i+7])
	}
}

func TestFairIdleTenantDoesNotSaveUpPermits(t *testing.T) {
	x := newFairFixture(t)
	x.add("B", 1, false)
	assert.Equal(t, "B", x.grant())
	x.add("A", 100, false)
	x.grants(50) // B idle meanwhile
	x.add("B", 100, false)
	seq := x.grants(20)
	b := 0
	for _, g := range seq {
		if g == "B" {
			b++
		}
	}
	assert.InDelta(t, 10, b, 1, "B, back after being idle, alternates with A instead of catching up: %v", seq)
}

func TestFairUrgentGoesFirstWithinItsShare(t *testing.T) {
	x := newFairFixture(t, Urgent(func(r *kgo.Record) bool { return false }, 0.25))
	x.add("A", 1000, false)
	x.add("B", 1000, false)
	x.grants(10)
	x.add("C", 1, true)
	assert.Equal(t, "C!", x.grant(), "an urgent record goes ahead of every tenant's backlog")

	// A burst of urgent records takes at most a quarter of the permits
	// while normal records wait.
	x.add("C", 100, true)
	seq := x.grants(400)
	urgent := 0
	for _, g := range seq {
		if g == "C!" {
			urgent++
		}
	}
	assert.InDelta(t, 100, urgent, 2, "urgent share of 400 permits")
	for i := 0; i+8 <= 400; i += 8 {
		n := 0
		for _, g := range seq[i : i+8] {
			if g != "C!" {
				n++
			}
		}
		assert.GreaterOrEqual(t, n, 6, "normal records keep 3/4 of every 8 permits: %v", seq[i:i+8])
	}

	// Alone, urgent records take every permit (work conserving).
	y := newFairFixture(t, Urgent(func(r *kgo.Record) bool { return false }, 0.25))
	y.add("C", 10, true)
	assert.Equal(t, []string{"C!", "C!", "C!", "C!", "C!"}, y.grants(5))
}

// A permit of the reserve goes to the oldest urgent record whatever the
// urgent share (the shared permit would go to a normal record now), and
// leaves the share's account as it was; with no urgent record, it goes
// as a shared permit would.
func TestFairReservePermitGoesToTheOldestUrgentRecordOutsideItsShare(t *testing.T) {
	x := newFairFixture(t, Urgent(func(*kgo.Record) bool { return false }, 0.1), UrgentReserve(localLimiter(t)))
	x.add("A", 5, false)
	x.add("U", 1, true)
	x.add("V", 1, true)
	assert.Equal(t, "U!", x.grant(), "the first urgent record goes at once")
	assert.Equal(t, "A", x.grant(), "the urgent share is spent: a shared permit goes to a normal record")
	lead := x.f.q.lead
	x.f.mu.Lock()
	cd, _ := x.f.q.pick(x.k, true, true)
	x.f.mu.Unlock()
	require.NotNil(t, cd)
	assert.Equal(t, "V", cd.r.tenant, "the reserve's permit goes to the urgent record")
	assert.Equal(t, lead, x.f.q.lead, "a reserve permit does not count in the urgent share")
	x.f.mu.Lock()
	cd, _ = x.f.q.pick(x.k, true, true)
	x.f.mu.Unlock()
	require.NotNil(t, cd)
	assert.Equal(t, "A", cd.r.tenant, "with no urgent record, a reserve permit goes as a shared one")
	x.f.mu.Lock()
	assert.Zero(t, x.f.q.untried, "urgent records that left the queue are not waiting for the reserve")
	x.f.mu.Unlock()
}

func TestFairDropForgetsAStoppedPartitionsRecords(t *testing.T) {
	x := newFairFixture(t)
	x.add("A", 3, false)
	other := &partition{c: x.p.c}
	x.f.mu.Lock()
	x.f.add(&cand{p: other, r: &record{tenant: "B", classified: true}, tenant: "B", k: x.k})
	x.f.mu.Unlock()
	x.f.mu.Lock()
	require.Equal(t, 4, x.f.demand())
	x.f.mu.Unlock()
	x.p.mu.Lock()
	dropped := x.f.withdraw(x.p)
	x.p.mu.Unlock()
	assert.Len(t, dropped, 3)
	assert.Equal(t, []string{"B", ""}, x.grants(2), "only the other partition's record is left")
	x.f.mu.Lock()
	assert.Equal(t, 0, x.f.demand())
	assert.Zero(t, x.f.q.active.Len())
	x.f.mu.Unlock()
}

func TestWithFairnessRefusesBadSettings(t *testing.T) {
	tenant := func(r *kgo.Record) string { return "" }
	for name, opt := range map[string]Option{
		"nil tenant":       WithFairness(nil),
		"weight 0":         WithFairness(tenant, Weights(map[string]int{"a": 0})),
		"weight too large": WithFairness(tenant, Weights(map[string]int{"a": maxWeight + 1})),
		"nil urgent":       WithFairness(tenant, Urgent(nil, 0.5)),
		"share 0":          WithFairness(tenant, Urgent(func(*kgo.Record) bool { return true }, 0)),
		"share 1":          WithFairness(tenant, Urgent(func(*kgo.Record) bool { return true }, 1)),
		"share NaN":        WithFairness(tenant, Urgent(func(*kgo.Record) bool { return true }, math.NaN())),
		"nil reserve":      WithFairness(tenant, Urgent(func(*kgo.Record) bool { return true }, 0.5), UrgentReserve(nil)),
		"reserve alone":    WithFairness(tenant, UrgentReserve(localLimiter(t))),
	} {
		t.Run(name, func(t *testing.T) {
			cfg := newConfig([]Option{opt})
			require.Error(t, cfg.err)
			assert.ErrorIs(t, cfg.err, throttle.ErrInvalid)
			assert.Contains(t, cfg.err.Error(), "WithFairness", fmt.Sprint(cfg.err))
		})
	}
}

func TestFairPermitHeldForAWorkerGoesToARecordInWorkThatAsks(t *testing.T) {
	// Every worker is busy and a fresh record waits: a permit that comes
	// for it is held until a worker is free. A record in work that then
	// asks for a permit of the same budget gets the held one; else, with
	// WithConcurrency, the held permit's slot would keep the record in
	// work (and so every worker) waiting for good.
	x := newFairFixture(t)
	x.p.soft = context.Background()
	x.add("A", 1, false)
	x.f.mu.Lock()
	x.f.taken = x.f.c.cfg.maxInFlight
	x.f.mu.Unlock()
	gave := make(chan struct{})
	go func() {
		defer close(gave)
		x.f.mu.Lock()
		defer x.f.mu.Unlock()
		x.f.give(grant{k: x.k, release: noRelease}, false)
	}()
	require.Eventually(t, func() bool {
		x.f.mu.Lock()
		defer x.f.mu.Unlock()
		return x.f.pump.holding == 1
	}, 5*time.Second, time.Millisecond, "the permit is held for want of a worker")

	g := x.f.wait(x.p, &record{tenant: "B", classified: true}, x.k, 2*time.Second)
	require.NoError(t, g.err, "the record in work gets the held permit")
	<-gave
	x.f.mu.Lock()
	defer x.f.mu.Unlock()
	assert.Zero(t, x.f.pump.holding)
	assert.Equal(t, 1, x.f.q.queued.fresh, "the fresh record still waits for a worker")
}

func TestFairTurnsHoldAfterVirtualTimeGrowsLarge(t *testing.T) {
	// A tenant alone moves virtual time on by a whole step per permit: a
	// long-running consumer (2^39 permits at weight 1) reaches the end of
	// int64; the tenants must still take turns past it.
	x := newFairFixture(t)
	x.f.q.vtime = math.MaxInt64 - 3*fairScale
	x.add("A", 100, false)
	x.add("B", 100, false)
	got := map[string]int{}
	for _, g := range x.grants(40) {
		got[g]++
	}
	assert.Equal(t, map[string]int{"A": 20, "B": 20}, got)
}

func TestFairIdleTenantKeepsItsTurnThroughRebases(t *testing.T) {
	// B is idle while A alone moves virtual time to int64's end twice:
	// back, B alternates with A.
	x := newFairFixture(t)
	x.add("B", 1, false)
	require.Equal(t, "B", x.grant())
	for range 2 {
		x.f.q.vtime = math.MaxInt64 - 3*fairScale
		x.add("A", 3, false)
		x.grants(3)
	}
	x.add("A", 100, false)
	x.add("B", 100, false)
	got := map[string]int{}
	for _, g := range x.grants(40) {
		got[g]++
	}
	assert.Equal(t, map[string]int{"A": 20, "B": 20}, got)
}

func TestFairUrgentShareAboveAHalfIsKept(t *testing.T) {
	// With backlogs of both, urgent records get share of the permits,
	// whatever share (above 0 and below 1) is.
	for _, share := range []float64{0.1, 0.3, 0.5, 0.6, 0.8, 0.95} {
		t.Run(fmt.Sprint(share), func(t *testing.T) {
			x := newFairFixture(t, Urgent(func(r *kgo.Record) bool { return false }, share))
			x.add("A", 2000, false)
			x.add("C", 2000, true)
			urgent := 0
			for _, g := range x.grants(1000) {
				if g == "C!" {
					urgent++
				}
			}
			assert.InDelta(t, share*1000, urgent, 2)
		})
	}
}

func TestFairRecordInWorkGetsAPermitWhileAnotherBudgetsRecordsWaitForAWorker(t *testing.T) {
	// One worker, busy with B's record, which asks for a permit of its
	// budget (a retry). A's fresh records, of another budget, are ahead
	// in turn but cannot use a permit: no worker is free. The request
	// must be for B's budget; one for A's would be held for a worker
	// that B's record keeps busy until it gets its permit.
	cfg := newConfig([]Option{WithMaxInFlight(1), WithFairness(func(r *kgo.Record) string { return string(r.Key) })})
	require.NoError(t, cfg.err)
	c := &Consumer{cfg: cfg, log: cfg.logger}
	f := newFair(c, cfg.fair)
	p := &partition{c: c, soft: context.Background()}
	budget := func() throttle.Keyed {
		b, err := throttle.NewLocal(1000, time.Second)
		require.NoError(t, err)
		return throttle.New(b).Key("")
	}
	ka, kb := budget(), budget()
	f.start(context.Background())
	defer f.stop()
	f.mu.Lock()
	f.taken = 1 // B's record
	for i := range 3 {
		f.add(&cand{p: p, r: &record{rec: kgo.Record{Key: []byte("A"), Offset: int64(i)}, tenant: "A", classified: true}, tenant: "A", k: ka})
	}
	f.mu.Unlock()
	g := f.wait(p, &record{rec: kgo.Record{Key: []byte("B")}, tenant: "B", classified: true}, kb, 2*time.Second)
	require.NoError(t, g.err)
	assert.Equal(t, kb, g.k, "a permit of the record's budget")
}

func TestFairPermitOfABudgetWithNoRecordWaitingIsNotHeld(t *testing.T) {
	// Every worker is busy and the fresh records waiting are of another
	// budget: a permit of budget kb can go to none of them, now or once
	// a worker is free, so it is given back at once instead of being
	// held (and with it, under WithConcurrency, a slot of kb's key).
	x := newFairFixture(t)
	x.add("A", 2, false)
	b, err := throttle.NewLocal(1, time.Second)
	require.NoError(t, err)
	kb := throttle.New(b).Key("")
	released := false
	x.f.mu.Lock()
	x.f.taken = x.f.c.cfg.maxInFlight
	gave := make(chan struct{})
	go func() {
		defer close(gave)
		x.f.mu.Lock()
		defer x.f.mu.Unlock()
		x.f.give(grant{k: kb, release: func() { released = true }}, false)
	}()
	x.f.mu.Unlock()
	held := false
	require.Eventually(t, func() bool {
		select {
		case <-gave:
			return true
		default:
		}
		x.f.mu.Lock()
		defer x.f.mu.Unlock()
		if x.f.pump.holding > 0 {
			held = true
			x.f.quit = true // let it go
			x.f.pump.freed.Broadcast()
		}
		return false
	}, 5*time.Second, time.Millisecond)
	assert.False(t, held, "the permit was held for a worker")
	assert.True(t, released, "the permit was given back")
}

// With UrgentReserve, the shared seekers ask for no permit for an urgent
// record until the reserve has answered for it: a shared permit asked
// meanwhile would find no record once the reserve's came first (when
// no other record waits), and be taken for nothing. A refusal lets them
// ask; normal records are asked for as before.
func TestFairSharedSeekersWaitForTheReservesAnswerForAnUrgentRecord(t *testing.T) {
	x := newFairFixture(t, Urgent(func(*kgo.Record) bool { return false }, 0.5), UrgentReserve(localLimiter(t)))
	x.f.pump.depth = fairSeekers
	x.add("U", 1, true)
	x.f.mu.Lock()
	_, ok := x.f.budget()
	x.f.mu.Unlock()
	assert.False(t, ok, "no shared request while the reserve has not answered")
	x.add("A", 1, false)
	x.f.mu.Lock()
	k, ok := x.f.budget()
	x.f.mu.Unlock()
	assert.True(t, ok, "a normal record is asked for")
	assert.Equal(t, x.k, k)
	x.f.mu.Lock()
	x.f.pump.seekingFor.add(x.k, 1) // the normal record's request is out
	x.f.pump.seeking++
	_, ok = x.f.budget()
	assert.False(t, ok, "the normal record's request covers what the shared limiter is asked for")
	cd := x.f.q.urgent.at(0)
	x.f.q.answered(cd) // the reserve refused
	_, ok = x.f.budget()
	x.f.mu.Unlock()
	assert.True(t, ok, "once the reserve refused, the urgent record is asked for")
}

// The reserve is asked for a fresh urgent record only while a worker is
// free for it: a permit taken for a record no worker can take is held
// until one frees, however long the handlers in work take, and a permit
// of a periodic bucket used in a later period comes on top of that
// period's. A waiter (a retry, in work) is asked for at once.
func TestFairReserveIsAskedForAFreshUrgentRecordOnlyWhileAWorkerIsFree(t *testing.T) {
	x := newFairFixture(t, Urgent(func(*kgo.Record) bool { return false }, 0.5), UrgentReserve(localLimiter(t)))
	x.add("U", 1, true)
	x.f.mu.Lock()
	defer x.f.mu.Unlock()
	x.f.taken = x.f.c.cfg.maxInFlight // every worker busy
	assert.Nil(t, x.f.reserveNext(), "no worker is free for the fresh urgent record")
	x.f.add(&cand{p: x.p, r: &record{rec: kgo.Record{Key: []byte("V")}, tenant: "V", urgent: true, classified: true}, tenant: "V", urgent: true, k: x.k, reply: make(chan grant, 1)})
	cd := x.f.reserveNext()
	require.NotNil(t, cd, "a waiter needs no worker")
	assert.Equal(t, "V", cd.r.tenant)
	x.f.taken--
	cd = x.f.reserveNext()
	require.NotNil(t, cd, "a worker is free")
	assert.Equal(t, "U", cd.r.tenant)
}

// An urgent record that leaves its queue (its partition stopped) while
// the reserve is asked for it leaves no count behind: the reserve's
// answer, coming after, changes nothing, and the shared seekers ask for
// the records that stay.
func TestFairUrgentRecordLeavingWhileTheReserveIsAskedLeavesNoCount(t *testing.T) {
	x := newFairFixture(t, Urgent(func(*kgo.Record) bool { return false }, 0.5), UrgentReserve(localLimiter(t)))
	x.add("U", 2, true)
	x.f.mu.Lock()
	next := x.f.reserveNext()
	require.NotNil(t, next)
	next.tried = true // as seekReserve does before asking
	x.f.q.untried--
	x.f.mu.Unlock()
	assert.Len(t, x.f.withdraw(x.p), 2)
	x.f.mu.Lock()
	defer x.f.mu.Unlock()
	x.f.q.answered(next) // the answer comes
	assert.Zero(t, x.f.q.untried)
	assert.Zero(t, x.f.q.pending.fresh)
	assert.Zero(t, x.f.q.pending.inWork)
	assert.Empty(t, x.f.q.pending.byBudget)
	assert.Empty(t, x.f.q.queued.byBudget)
	assert.Nil(t, x.f.reserveNext())
}

// A reserve permit held for want of a worker is no shared seeker's: it
// lets no shared seeker more start (seekers are at most WithMaxInFlight,
// a seeker holding a permit counted out as it asks for none).
func TestFairReservePermitHeldStartsNoSharedSeekerMore(t *testing.T) {
	x := newFairFixture(t, Urgent(func(*kgo.Record) bool { return false }, 0.5), UrgentReserve(localLimiter(t)))
	x.add("A", 1, false)
	x.f.mu.Lock()
	x.f.pump.ctx = context.Background()
	x.f.pump.seekers = x.f.c.cfg.maxInFlight // every seeker there, none idle
	x.f.pump.holding++                       // the reserve's seeker holds a permit
	x.f.pump.reserveHolding++
	x.f.kick()
	seekers := x.f.pump.seekers
	x.f.quit = true // a seeker started would end at once
	x.f.mu.Unlock()
	x.f.stop()
	assert.Equal(t, x.f.c.cfg.maxInFlight, seekers, "no seeker started")
}
