package consumer

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
)

// These tests drive a fairQueue alone, over virtual time: records arrive
// at the times given and a permit comes every permitEvery; no Kafka, no
// limiter, no goroutine. They check, decision by decision, the fairness
// the end-to-end tests of fair_test.go check through a consumer.

const permitEvery = 10 * time.Millisecond

// budgets are budgets of no limiter: plain values the queue tells apart.
var budgetA, budgetB = (*throttle.Limiter)(nil).Key("a"), (*throttle.Limiter)(nil).Key("b")

// served is a permit the queue gave: to whom, and when on virtual time.
type served struct {
	tenant  string
	urgent  bool
	seq     int // the record's place among its tenant's arrivals
	arrived time.Duration
	at      time.Duration
}

// queueSim feeds a fairQueue and gives it permits on virtual time.
type queueSim struct {
	q    *fairQueue
	now  time.Duration
	seqs map[string]int
	got  []served
}

func newQueueSim(weights map[string]int, share float64, reserve bool) *queueSim {
	return &queueSim{q: newFairQueue(weights, share, reserve), seqs: map[string]int{}}
}

// arrive queues n fresh records of tenant for budget k now.
func (s *queueSim) arrive(tenant string, n int, urgent bool, k throttle.Keyed) {
	for range n {
		s.q.add(&cand{tenant: tenant, urgent: urgent, k: k, since: time.Time{}.Add(s.now), r: &record{seq: int64(s.seqs[tenant])}})
		s.seqs[tenant]++
	}
}

// permits moves virtual time on by n permits of budget k and gives each
// to the record the queue picks (a worker always free), reserve permits
// when reserved; a permit no record takes is lost.
func (s *queueSim) permits(n int, k throttle.Keyed, reserved bool) {
	for range n {
		s.now += permitEvery
		if cd, _ := s.q.pick(k, true, reserved); cd != nil {
			s.got = append(s.got, served{cd.tenant, cd.urgent, int(cd.r.seq), cd.since.Sub(time.Time{}), s.now})
		}
	}
}

// of returns the permits tenant's records got, in the order given.
func (s *queueSim) of(tenant string) []served {
	var out []served
	for _, g := range s.got {
		if g.tenant == tenant {
			out = append(out, g)
		}
	}
	return out
}

// TestFairnessServesALateTenantAheadOfABacklog, decision by decision: a
// tenant whose records come behind the backlogs of n others waits for
// no backlog; with equal weights its i-th record gets a permit within
// (i+1)·(n+1) permits of its arrival, its share. Each tenant's records
// are served in the order they came.
func TestFairQueueServesALateTenantWithinItsShareBehindBacklogs(t *testing.T) {
	for _, others := range []int{1, 3} {
		t.Run(fmt.Sprint(others, " backlogs"), func(t *testing.T) {
			s := newQueueSim(nil, 0, false)
			for i := range others {
				s.arrive(fmt.Sprint("A", i), 1000, false, budgetA)
			}
			s.permits(100, budgetA, false)
			const late = 6
			s.arrive("B", late, false, budgetA)
			arrived := s.now
			s.permits(late*(others+1), budgetA, false)

			bs := s.of("B")
			require.Len(t, bs, late, "every record of the late tenant served within its share")
			for i, g := range bs {
				assert.Equal(t, i, g.seq, "the late tenant's records in the order they came")
				assert.LessOrEqual(t, g.at-arrived, time.Duration((i+1)*(others+1))*permitEvery, "record %d of the late tenant", i)
			}
			for i := range others {
				for j, g := range s.of(fmt.Sprint("A", i)) {
					require.Equal(t, j, g.seq, "tenant A%d's records in the order they came", i)
				}
			}
		})
	}
}

// TestFairnessServesUrgentRecordsFirst, decision by decision: an urgent
// record behind every tenant's backlog gets the next permit; a burst of
// urgent records takes its share of the permits while normal ones wait,
// and normal work keeps the rest in every stretch of 8 permits; alone,
// urgent records take every permit.
func TestFairQueueGivesUrgentRecordsTheNextPermitWithinTheirShare(t *testing.T) {
	s := newQueueSim(nil, 0.25, false)
	for _, tenant := range []string{"A", "B", "C"} {
		s.arrive(tenant, 1000, false, budgetA)
	}
	s.permits(30, budgetA, false)
	s.arrive("U", 1, true, budgetA)
	arrived := s.now
	s.permits(1, budgetA, false)
	us := s.of("U")
	require.Len(t, us, 1)
	assert.Equal(t, arrived+permitEvery, us[0].at, "the urgent record got the next permit")

	s.arrive("U", 100, true, budgetA)
	from := len(s.got)
	s.permits(400, budgetA, false)
	burst := s.got[from:]
	urgent := 0
	for i, g := range burst {
		if g.urgent {
			urgent++
		}
		if (i+1)%8 == 0 {
			normal := 0
			for _, h := range burst[i-7 : i+1] {
				if !h.urgent {
					normal++
				}
			}
			assert.GreaterOrEqual(t, normal, 6, "normal records keep 3/4 of permits %d to %d", i-7, i)
		}
	}
	assert.InDelta(t, 100, urgent, 2, "urgent records' share of 400 permits")

	alone := newQueueSim(nil, 0.25, false)
	alone.arrive("U", 10, true, budgetA)
	alone.permits(10, budgetA, false)
	assert.Len(t, alone.of("U"), 10, "urgent records alone take every permit")
}

// Weights, over time: while tenants of weights 1, 2 and 4 all have
// backlogs, each gets its weight's part of every 7 permits (give or take
// one); one that comes later gets its part from then on, with nothing
// saved up for the time it was away.
func TestFairQueueSharesPermitsByWeight(t *testing.T) {
	s := newQueueSim(map[string]int{"one": 1, "two": 2, "four": 4}, 0, false)
	s.arrive("one", 5000, false, budgetA)
	s.arrive("two", 5000, false, budgetA)
	s.permits(300, budgetA, false)
	s.arrive("four", 5000, false, budgetA)
	from := len(s.got)
	s.permits(700, budgetA, false)
	seq := s.got[from:]
	for i := 0; i+7 <= len(seq); i += 7 {
		w := map[string]int{}
		for _, g := range seq[i : i+7] {
			w[g.tenant]++
		}
		assert.InDelta(t, 4, w["four"], 1, "permits %d to %d: %v", i, i+6, w)
		assert.InDelta(t, 2, w["two"], 1, "permits %d to %d: %v", i, i+6, w)
		assert.InDelta(t, 1, w["one"], 1, "permits %d to %d: %v", i, i+6, w)
	}
}

// TestFairnessWithASpentBudgetHoldsUpNoOtherTenant, decision by
// decision: a permit goes only to a record of its own budget, so while
// one budget grants nothing the other budget's records take every one of
// their permits, whatever the turns; the spent budget's record keeps its
// place for when its budget grants again.
func TestFairQueueGivesAPermitOnlyToARecordOfItsBudget(t *testing.T) {
	s := newQueueSim(nil, 0, false)
	s.arrive("hot", 1, false, budgetA)
	s.arrive("cold", 50, false, budgetB)
	s.permits(50, budgetB, false)
	assert.Len(t, s.of("cold"), 50, "every permit of the other budget went to its records")
	assert.Empty(t, s.of("hot"), "no permit of another budget went to the spent budget's record")
	assert.Equal(t, budgetA, s.q.nextBudget(), "the spent budget's record is the next to ask for")
	s.permits(1, budgetA, false)
	assert.Len(t, s.of("hot"), 1)
}

// UrgentReserve's part is kept for urgent records: the reserve is asked
// for urgent records only, oldest first, and the shared limiter for none
// of them until the reserve has answered; a reserve permit goes to the
// oldest urgent record whatever the urgent share and leaves the share's
// account as it was; refused by the reserve, an urgent record takes a
// shared permit within its share.
func TestFairQueueKeepsTheReserveForUrgentRecords(t *testing.T) {
	s := newQueueSim(nil, 0.25, true)
	s.arrive("A", 100, false, budgetA)
	assert.Nil(t, s.q.reserveNext(true), "no reserve permit is asked for normal records")
	s.arrive("U", 3, true, budgetA)
	assert.Equal(t, 3, s.q.pending.byBudget[budgetA], "no shared permit asked for the urgent records yet")

	var asked []*cand
	for i := range 2 { // the reserve is asked for two of them, and grants
		next := s.q.reserveNext(true)
		require.NotNil(t, next)
		assert.Equal(t, i, int(next.r.seq), "the oldest urgent record not yet asked for")
		next.tried = true
		s.q.untried--
		asked = append(asked, next)
	}
	for _, cd := range asked {
		s.q.answered(cd)
		lead := s.q.lead
		s.permits(1, budgetA, true)
		assert.Equal(t, lead, s.q.lead, "a reserve permit does not count in the urgent share")
	}
	assert.Len(t, s.of("U"), 2, "the reserve's permits went to the urgent records")
	assert.Empty(t, s.of("A"), "no reserve permit went to a normal record while an urgent one waited")

	next := s.q.reserveNext(true) // the reserve refuses the third
	require.NotNil(t, next)
	next.tried = true
	s.q.untried--
	s.q.answered(next)
	assert.Zero(t, s.q.pending.byBudget[budgetA], "refused, the urgent record is asked for on the shared limiter")
	s.permits(4, budgetA, false)
	assert.Len(t, s.of("U"), 3, "the urgent record took a shared permit within its share")
	assert.Nil(t, s.q.reserveNext(true))
}

// TestFairnessWithOneWorkerAndRetriesHandlesEveryRecord, decision by
// decision: with no worker free, a permit goes to a record in work (a
// retry) of its budget, ahead in turn or not, never to a fresh record;
// with none in work, no record takes it and the queue says a worker is
// what is missing.
func TestFairQueueGivesAPermitToARecordInWorkWhileNoWorkerIsFree(t *testing.T) {
	q := newFairQueue(nil, 0, false)
	q.add(&cand{tenant: "A", k: budgetA})
	retry := &cand{tenant: "B", k: budgetA, reply: make(chan grant, 1)}
	q.add(retry)
	cd, needWorker := q.pick(budgetA, false, false)
	assert.Same(t, retry, cd, "the record in work got the permit")
	assert.False(t, needWorker)
	assert.False(t, retry.queued)

	cd, needWorker = q.pick(budgetA, false, false)
	assert.Nil(t, cd, "no fresh record takes a permit without a worker")
	assert.True(t, needWorker)
	cd, _ = q.pick(budgetA, true, false)
	require.NotNil(t, cd)
	assert.Equal(t, "A", cd.tenant, "once a worker is free, the fresh record")
	assert.Zero(t, q.queued.fresh+q.queued.inWork, "nothing left")
	assert.Empty(t, q.queued.byBudget)
}
