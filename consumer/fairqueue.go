package consumer

import (
	"container/heap"
	"math"
	"time"

	"github.com/headway-go/headway/throttle"
)

// fairQueue decides which record each permit goes to under WithFairness:
// the tenants with records waiting take turns (start-time fair queuing,
// in proportion to their weights), and urgent records go ahead of them
// within their share. It holds the records waiting for a permit and
// counts them per budget for the permit pump (permits.go), which asks the
// limiter and calls pick when a permit comes. It starts no goroutine,
// asks no limiter and reads no clock: its time is virtual, the tags of
// the permits it gave, so a test drives it with plain values. Its caller
// serializes the calls (fair.mu).
type fairQueue struct {
	weights map[string]int // a tenant not named weighs 1
	share   float64        // the most of the permits urgent records take while normal ones wait
	// reserve: urgent records wait for the reserve's answer (UrgentReserve)
	// before the shared limiter is asked for them.
	reserve bool

	// tenants holds every tenant with candidates, and idle ones whose
	// finish tag is ahead of vtime (swept).
	tenants map[string]*tenant
	swept   int
	active  tenantHeap  // tenants with normal candidates
	urgent  fifo[*cand] // urgent candidates, in the order they came
	vtime   int64       // start tag of the last tenant served
	seq     uint64
	// lead is how far urgent records are ahead of their share: each
	// urgent permit adds 1 − share, each normal one takes share off; an
	// urgent record goes first while lead is not above 0. A class with no
	// record for a permit saves up no lead or lag.
	lead float64

	// queued counts the candidates; pending those of them whose reserve
	// answer has not come (cand.pending); untried the urgent ones the
	// reserve has not been asked for.
	queued, pending candCounts
	untried         int
}

// candCounts counts candidates per budget, and those in work among them;
// fresh and inWork in all.
type candCounts struct {
	byBudget, inWorkByBudget budgetCounts
	fresh, inWork            int
}

func (c *candCounts) add(cd *cand, n int) {
	c.byBudget.add(cd.k, n)
	if cd.reply != nil {
		c.inWork += n
		c.inWorkByBudget.add(cd.k, n)
	} else {
		c.fresh += n
	}
}

// cand is a record waiting for a permit: a fresh one (ready in its
// partition, not taken by a worker yet) or one in work (taken, asking for
// the permit of a later attempt). The queue reads its tenant, urgency and
// budget; the rest is its callers'.
type cand struct {
	tenant string
	urgent bool
	k      throttle.Keyed // the budget its permit comes from
	// reply receives the permit of a record in work; nil for a fresh
	// record, which is handed to a worker with its permit.
	reply chan grant
	p     *partition
	r     *record
	// since is when a fresh record became a candidate: its wait for a
	// permit counts from there (Stats.PermitWait).
	since time.Time
	// queued: in the queue. tried: the reserve was asked for a permit for
	// it; pending: queued, and the reserve has not answered for it yet:
	// the shared limiter is asked for no permit for it meanwhile, since
	// one asked would find no record when the reserve's came first.
	queued, tried, pending bool
}

// tenant is one tenant's queues and tags.
type tenant struct {
	name string
	step int64 // the virtual time one permit costs: fairScale/weight
	// start is the tag of the tenant's next permit while it is active;
	// finish the tag after its last one.
	start, finish int64
	seq           uint64 // when it became active: breaks ties
	idx           int    // in the active heap, -1 when not in it
	inWork, fresh fifo[*cand]
}

const fairScale = 1 << 24

// leadSlack is how far above 0 fairQueue.lead may be from rounding
// alone: an urgent record still goes first then.
const leadSlack = 1e-9

// rebaseAt is the virtual time past which the tags are moved back to
// start from 0 (rebase): a tenant alone moves it on by up to fairScale
// per permit, and int64 would overflow after 2^39 permits.
const rebaseAt = 1 << 62

func newFairQueue(weights map[string]int, share float64, reserve bool) *fairQueue {
	return &fairQueue{
		weights: weights, share: share, reserve: reserve,
		tenants: make(map[string]*tenant),
		queued:  candCounts{byBudget: make(budgetCounts), inWorkByBudget: make(budgetCounts)},
		pending: candCounts{byBudget: make(budgetCounts), inWorkByBudget: make(budgetCounts)},
	}
}

// add queues cd: an urgent one in the order it came, a normal one in its
// tenant's queue, the tenant active from now if it was not.
func (q *fairQueue) add(cd *cand) {
	cd.queued = true
	q.queued.add(cd, 1)
	if cd.urgent {
		q.urgent.push(cd)
		if q.reserve {
			q.untried++
			cd.pending = true
			q.pending.add(cd, 1)
		}
		return
	}
	t := q.tenants[cd.tenant]
	if t == nil {
		w := 1
		if n, ok := q.weights[cd.tenant]; ok {
			w = n
		}
		t = &tenant{name: cd.tenant, step: fairScale / int64(w), finish: math.MinInt64, idx: -1}
		q.tenants[t.name] = t
	}
	if cd.reply != nil {
		t.inWork.push(cd)
	} else {
		t.fresh.push(cd)
	}
	if t.idx < 0 {
		t.start = max(q.vtime, t.finish)
		q.seq++
		t.seq = q.seq
		heap.Push(&q.active, t)
	}
}

// unqueued forgets cd's counts, once it left its queue.
func (q *fairQueue) unqueued(cd *cand) {
	if cd.urgent && q.reserve && !cd.tried {
		q.untried--
	}
	q.answered(cd)
	cd.queued = false
	q.queued.add(cd, -1)
}

// answered notes that cd is no longer waiting for the reserve's answer
// (it came, or cd left its queue).
func (q *fairQueue) answered(cd *cand) {
	if !cd.pending {
		return
	}
	cd.pending = false
	q.pending.add(cd, -1)
}

// nextBudget returns the budget of the candidate that would be chosen
// now, workers and the urgent share aside; the zero Keyed if none waits.
func (q *fairQueue) nextBudget() throttle.Keyed {
	switch {
	case q.urgent.len() > 0:
		return q.urgent.at(0).k
	case q.active.Len() > 0:
		if t := q.active[0]; t.inWork.len() > 0 {
			return t.inWork.at(0).k
		}
		return q.active[0].fresh.at(0).k
	}
	return throttle.Keyed{}
}

// reserveNext returns the oldest urgent candidate the reserve has not
// been asked for that can take a permit now: one in work, or a fresh one
// when worker (a worker is free for it: a permit held for want of a
// worker waits for the handlers in work, and past its time's margin it is
// not used at all); nil if none.
func (q *fairQueue) reserveNext(worker bool) *cand {
	if q.untried == 0 {
		return nil
	}
	untried := false
	for i := range q.urgent.len() {
		if cd := q.urgent.at(i); !cd.tried {
			if cd.reply != nil || worker {
				return cd
			}
			untried = true
		}
	}
	if !untried { // the count is wrong: never wait on it
		q.untried = 0
	}
	return nil
}

// pick removes and returns the candidate the next permit of budget k goes
// to: an urgent one within the urgent share (any urgent one, and outside
// the share, for a permit of the reserve: reserved), else the next of the
// tenant whose turn it is. Fresh records count only when worker (a worker
// is free). needWorker reports that none was chosen for want of a worker.
func (q *fairQueue) pick(k throttle.Keyed, worker, reserved bool) (cd *cand, needWorker bool) {
	if q.vtime >= rebaseAt {
		q.rebase()
	}
	// Urgent first, within the share; beyond it only when no normal
	// record can take the permit.
	ui := q.urgent.index(forPermit(k, worker))
	if ui >= 0 && reserved {
		cd = q.urgent.remove(ui)
		q.unqueued(cd)
		return cd, false
	}
	t, ti, inWork := q.next(k, worker)
	if ui >= 0 && (q.lead <= leadSlack || t == nil) {
		if t == nil {
			q.lead = min(q.lead, 0)
		}
		q.lead += 1 - q.share
		cd = q.urgent.remove(ui)
		q.unqueued(cd)
		return cd, false
	}
	if t == nil {
		// No candidate of k in work (it would have been chosen): only a
		// fresh record of k can take the permit, once a worker is free.
		return nil, !worker && q.queued.byBudget[k] > 0
	}
	if ui < 0 {
		q.lead = max(q.lead, 0)
	}
	q.lead -= q.share
	if inWork {
		cd = t.inWork.remove(ti)
	} else {
		cd = t.fresh.remove(ti)
	}
	q.unqueued(cd)
	q.vtime = t.start
	t.finish = t.start + t.step
	if t.inWork.len()+t.fresh.len() > 0 {
		t.start = t.finish
		heap.Fix(&q.active, t.idx)
	} else {
		heap.Remove(&q.active, t.idx)
		q.sweep()
	}
	return cd, false
}

// forPermit matches the candidates for a permit of k: fresh ones only
// when fresh.
func forPermit(k throttle.Keyed, fresh bool) func(*cand) bool {
	return func(cd *cand) bool { return cd.k == k && (fresh || cd.reply != nil) }
}

// next returns the active tenant with the earliest start tag that has a
// candidate for a permit of k (a fresh one only when worker), and where
// that candidate is.
func (q *fairQueue) next(k throttle.Keyed, worker bool) (best *tenant, i int, inWork bool) {
	has := func(t *tenant) (int, bool) {
		if i := t.inWork.index(forPermit(k, true)); i >= 0 {
			return i, true
		}
		if worker {
			return t.fresh.index(forPermit(k, true)), false
		}
		return -1, false
	}
	if q.active.Len() == 0 {
		return nil, -1, false
	}
	if i, w := has(q.active[0]); i >= 0 {
		return q.active[0], i, w
	}
	for _, t := range q.active {
		if best != nil && !t.before(best) {
			continue
		}
		if j, w := has(t); j >= 0 {
			best, i, inWork = t, j, w
		}
	}
	return best, i, inWork
}

// rebase moves every tag back by vtime, so that vtime is 0: the order of
// the tags is kept, and the tags stay far from int64's end. Every start
// tag is at least vtime; a finish tag at most vtime is unset instead (the
// tenant starts at vtime either way), so none underflows, however many
// rebases an idle tenant stays through.
func (q *fairQueue) rebase() {
	d := q.vtime
	for _, t := range q.tenants {
		if t.idx >= 0 {
			t.start -= d
		}
		if t.finish <= d {
			t.finish = math.MinInt64
		} else {
			t.finish -= d
		}
	}
	q.vtime = 0
}

// sweep forgets idle tenants whose finish tag vtime has reached (they
// would start at vtime anyway), once the map has doubled since the last
// sweep.
func (q *fairQueue) sweep() {
	if len(q.tenants) < 2*q.swept+64 {
		return
	}
	for name, t := range q.tenants {
		if t.idx < 0 && t.finish <= q.vtime {
			delete(q.tenants, name)
		}
	}
	q.swept = len(q.tenants)
}

// remove takes cd, a candidate in work that gave up, out of its queue.
func (q *fairQueue) remove(cd *cand) {
	q.unqueued(cd)
	is := func(c *cand) bool { return c == cd }
	if cd.urgent {
		q.urgent.remove(q.urgent.index(is))
		return
	}
	t := q.tenants[cd.tenant]
	t.inWork.remove(t.inWork.index(is))
	if t.inWork.len()+t.fresh.len() == 0 {
		heap.Remove(&q.active, t.idx)
	}
}

// removeFresh takes the fresh candidates of out of their queues and
// returns them (their partition stopped).
func (q *fairQueue) removeFresh(of func(*cand) bool) []*cand {
	fresh := func(cd *cand) bool { return cd.reply == nil && of(cd) }
	out := q.urgent.filter(fresh)
	for _, t := range q.active {
		out = append(out, t.fresh.filter(fresh)...)
	}
	for _, cd := range out {
		q.unqueued(cd)
	}
	for i := 0; i < q.active.Len(); {
		if t := q.active[i]; t.inWork.len()+t.fresh.len() == 0 {
			heap.Remove(&q.active, i)
			continue
		}
		i++
	}
	return out
}

// before orders tenants by start tag, then by when they became active.
func (t *tenant) before(u *tenant) bool {
	if t.start != u.start {
		return t.start < u.start
	}
	return t.seq < u.seq
}
