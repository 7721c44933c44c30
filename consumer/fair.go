package consumer

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/internal/capability"
	"github.com/headway-go/headway/throttle"
)

// FairOption configures [WithFairness]: [Weights], [Urgent], [UrgentReserve].
type FairOption interface {
	applyFair(*fairConfig)
}

type fairOptionFunc func(*fairConfig)

func (f fairOptionFunc) applyFair(c *fairConfig) { f(c) }

// fairConfig is WithFairness's settings.
type fairConfig struct {
	tenant func(*kgo.Record) string
	// weights: a tenant not named weighs 1.
	weights map[string]int
	// urgent: nil, no record is urgent; share: the most of the permits
	// urgent records take while normal records wait too.
	urgent func(*kgo.Record) bool
	share  float64
	// reserve: nil, none; else urgent records try its permits first.
	reserve *throttle.Limiter
	err     error
}

// maxWeight is the largest weight [Weights] accepts.
const maxWeight = 1000

// fairSeekers is the most permit requests an instance keeps outstanding
// at once under WithFairness (fewer when fewer records wait). How many it
// keeps adapts (fair.adapt): one fewer, down to one, after each grant the
// limiter paced (it waited for the grant's place in the period, a
// refusal's retry time, or the adaptive pace), one more after each grant
// that came as fast as the store answers (more requests then make more
// permits). The limiter tells which (capability.PaceNote): how long a
// grant took does not, since a paced grant of a busy limit can take as
// little as the store's answer to another. Few requests keep what they
// reserve small and spread: the record that gets a permit is chosen when
// the permit comes, but the instance's next permit is the earliest place
// its requests hold, and many requests of one instance take places in a
// row, leaving the instance without a grant while the others' pass (and
// an urgent record that comes then waiting for them).
const fairSeekers = 8

// WithFairness shares the limiter's permits among tenants: tenant names
// the tenant of each record, and when records of several tenants wait,
// each permit goes to the tenant whose turn it is (start-time fair
// queuing: the tenants with records waiting take turns, in proportion to
// their [Weights]), whatever the backlog of the others. A tenant with one
// record waiting gets one of the next permits, however many records
// another tenant has queued. Default: off, and records take permits in
// the order workers reach them.
//
// How: an instance keeps a few permit requests outstanding (one while
// the limiter paces them, up to 8 while grants come as fast as the store
// answers; never more than records wait) instead of one per record in
// work, and chooses the record a permit goes to when the permit comes:
// the next record of the tenant whose turn it is. The records the instance holds
// (up to [WithQueueSize] and [WithQueueBytes] per partition: the
// read-ahead) wait in its queue, not in the limiter, and a record is
// taken by a worker ([WithMaxInFlight]) only with its permit. The
// scheduler is work conserving: a tenant alone gets every permit.
//
// What holds: the order per key ([WithOrdering]; a record is a candidate
// only once the records of its key before it are finished), at least
// once and the watermark, the memory bounds, and revocation (a record's
// wait ends with its partition). The permit requests wait at most
// [WithPermitWait]'s wait, and with [WithShaping] at most its bound: a
// request that times out goes, as the record's permit timeout, to the
// record whose turn it was, which is then taken and handled by its
// policy (with WithShaping, parked: its key's hold of its partition
// counts from when it is taken). Each budget ([WithLimiterFor]) has its
// own requests, so one that grants nothing (a tenant's own budget,
// spent) holds up no other. Fairness holds among the
// records one instance holds: each instance schedules its own
// partitions' records, so across a group a tenant gets its share of each
// instance that holds its records. A tenant whose records are all on one
// instance's partitions gets its turns there only; a partition paused at
// its queue bound shows no more of its records until it has drained to
// half. Retries take their turn like first attempts. A permit whose
// record went away meanwhile (its partition revoked) is not used.
//
// tenant is called once per record, when the record's turn in its key
// comes, from the goroutine that made it ready, and must be fast and
// safe for concurrent use; a panic in it counts the record as tenant
// "". With [WithLimiterFor], fairness holds among the records of each
// budget: a permit of one budget goes to a record of that budget; its
// function is called for a record's first attempt when the record
// becomes a candidate, from that same goroutine (for later attempts, from
// the record's worker). A nil tenant is refused, and so is fairness with
// nothing to share: a nil Limiter given to [New] without WithLimiterFor
// or [WithConcurrency].
func WithFairness(tenant func(*kgo.Record) string, opts ...FairOption) Option {
	return optionFunc(func(c *config) {
		if tenant == nil {
			c.invalid("WithFairness", nil, "must name each record's tenant")
			return
		}
		fc := &fairConfig{tenant: tenant}
		for _, o := range opts {
			if o != nil {
				o.applyFair(fc)
			}
		}
		if fc.err == nil && fc.reserve != nil && fc.urgent == nil {
			fc.err = fmt.Errorf("consumer: WithFairness UrgentReserve without Urgent: name the urgent records with Urgent: %w", throttle.ErrInvalid)
		}
		if fc.err != nil {
			if c.err == nil {
				c.err = fc.err
			}
			return
		}
		c.fair = fc
	})
}

// Weights gives tenants of [WithFairness] weights: a tenant of weight 2
// gets twice the permits of a tenant of weight 1 while both have records
// waiting. A tenant not named weighs 1. Each weight must be between 1 and
// 1000. The map is copied.
func Weights(w map[string]int) FairOption {
	return fairOptionFunc(func(c *fairConfig) {
		m := make(map[string]int, len(w))
		for t, n := range w {
			if n < 1 || n > maxWeight {
				if c.err == nil {
					c.err = fmt.Errorf("consumer: WithFairness Weights: tenant %q weighs %d: must be between 1 and %d: %w", t, n, maxWeight, throttle.ErrInvalid)
				}
				return
			}
			m[t] = n
		}
		c.weights = m
	})
}

// Urgent marks records of [WithFairness] urgent: an urgent record gets
// the next permit, ahead of the normal records of every tenant, as long
// as urgent records have taken at most share of the permits (the first
// goes at once; then, while normal records wait too, share of the
// permits, spread among the normal ones; all of them when none do), so
// that normal work always keeps at least 1 − share of the limit. Urgent
// records take permits in the order they became ready, whatever their
// tenant, outside the tenants' turns. urgent is called once per record,
// like WithFairness's tenant; a panic in it counts the record as
// normal. share must be above 0 and below 1; a nil urgent is refused.
// An urgent record still waits for the limiter's next grant (at a
// period's end of a token bucket, for the next period's first):
// [UrgentReserve] gives urgent records a part of the limit of their own.
func Urgent(urgent func(*kgo.Record) bool, share float64) FairOption {
	return fairOptionFunc(func(c *fairConfig) {
		switch {
		case urgent == nil:
			if c.err == nil {
				c.err = fmt.Errorf("consumer: WithFairness Urgent: nil function: %w", throttle.ErrInvalid)
			}
		case !(share > 0 && share < 1):
			if c.err == nil {
				c.err = fmt.Errorf("consumer: WithFairness Urgent share %v: must be above 0 and below 1, so that normal records keep a share: %w", share, throttle.ErrInvalid)
			}
		default:
			c.urgent, c.share = urgent, share
		}
	})
}

// UrgentReserve gives the urgent records of [Urgent] a part of the
// provider's limit of their own: reserve is a Limiter over that part
// (say 5 calls a second of 100, in a bucket under a key of its own), and
// the Limiter given to [New] keeps the rest (95), so that together they
// keep the provider's limit. An urgent record takes one of reserve's
// permits when reserve has one at once; it then waits for no grant of
// the shared limiter, whose grants come at the limit's pace once a crowd
// waits for them. When
// reserve has none at once (its part spent), the record waits for the
// next permit of its budget, as [Urgent] says.
//
// The reserve is asked for one urgent record at a time, in the order
// they came, and for a record not in work yet only while a worker is
// free for it ([WithMaxInFlight]); the shared limiter is asked for an
// urgent record only once the reserve has answered for it, so that a
// record the reserve serves costs no shared permit. That answer takes a
// store round trip, and with a hung store at most reserve's store
// timeout ([throttle.WithStoreTimeout]) and its [throttle.FailurePolicy].
// A reserve that fails otherwise than by refusing (an error not matching
// [throttle.ErrTimeout]) is logged as a warning, once until it answers
// again; the urgent records then take shared permits.
// A reserve permit goes to the oldest urgent record that can take it
// then, and if none is left (the record asked for was served or revoked
// meanwhile), to the record a shared permit would go to. The reserve is
// asked for urgent records only, so its part goes unused when none come:
// size it for the urgent records' rate.
//
// A reserve permit stands for the record's budget's: the handler's
// context holds it as that budget's ([throttle.Keyed.ContextWithPermit]),
// so a Transport of throttle/httpclient built on the Limiter given to New
// takes no second permit for the call. With [WithConcurrency], the record
// takes a slot of its budget's key too, only if one is free at once.
//
// Refused: a nil reserve, UrgentReserve without Urgent, a nil Limiter
// given to New (the handler's calls would take a permit of their own for
// each of reserve's), the Limiter given to New itself (a key of it would
// be a whole second limit), and [WithLimiterFor] (with a budget per
// record, give urgent records a budget of their own in its function
// instead). Another Limiter over New's bucket is no reserve (its permits
// are the shared bucket's), and one over a bucket of another limit under
// the same store key would share that key's state: give reserve a key of
// its own.
func UrgentReserve(reserve *throttle.Limiter) FairOption {
	return fairOptionFunc(func(c *fairConfig) {
		if reserve == nil {
			if c.err == nil {
				c.err = fmt.Errorf("consumer: WithFairness UrgentReserve: nil Limiter: %w", throttle.ErrInvalid)
			}
			return
		}
		c.reserve = reserve
	})
}

// fair schedules the permits of one instance among tenants (WithFairness).
//
// Candidates are records ready to take a permit: fresh ones (ready in
// their partition, not taken by a worker yet) and waiters (taken, asking
// for the permit of a later attempt). Seekers (goroutines, at most
// WithMaxInFlight) ask the limiter for permits while a budget's
// candidates need more than those already asked for it, up to depth per
// budget (adapt); when a permit comes, pick chooses its
// record: an urgent one within the urgent share, else the next record of
// the tenant with the earliest start tag. A fresh record is handed to a
// worker with its permit; a waiter gets the permit through its channel.
//
// Lock order: partition.mu, then fair.mu, then sched.mu (hand); a
// seeker holds none while it asks the limiter.
type fair struct {
	c   *Consumer
	cfg *fairConfig

	mu sync.Mutex
	// wanted wakes a seeker waiting for candidates (idle of them);
	// freed wakes the seekers that hold a permit for want of a worker
	// (holding of them); untriedC wakes the reserve's seeker.
	wanted, freed, untriedC sync.Cond
	// untried counts the queued urgent candidates that have not asked
	// the reserve (UrgentReserve) for a permit.
	untried int
	// pendingFor counts the queued urgent candidates whose reserve
	// answer has not come (cand.pending), per budget, and
	// pendingWaitersFor the waiters among them; pendingFresh and
	// pendingWaiting in all. The shared seekers ask for none of them.
	pendingFor, pendingWaitersFor map[throttle.Keyed]int
	pendingFresh, pendingWaiting  int
	// reserveHolding: the reserve's seeker holds a permit for want of a
	// worker (counted in holding too).
	reserveHolding int
	// reserveFailing: the reserve's last answer was an error other than
	// a refusal (warned once until it answers again).
	reserveFailing bool
	holding        int
	// holdingFor counts the seekers holding a permit per budget.
	holdingFor map[throttle.Keyed]int
	// tenants holds every tenant with candidates, and idle ones whose
	// finish tag is ahead of vtime (swept).
	tenants map[string]*tenant
	swept   int
	active  tenantHeap // tenants with normal candidates
	urgent  candQueue  // urgent candidates, in the order they came
	direct  candQueue  // fresh records that need no permit
	vtime   int64      // start tag of the last tenant served
	seq     uint64
	// lead is how far urgent records are ahead of their share: each
	// urgent permit adds 1 − share, each normal one takes share off;
	// an urgent record goes first while lead is not above 0. A class
	// with no record for a permit saves up no lead or lag.
	lead float64
	// needs counts the queued candidates that need a permit, per budget,
	// and waitersFor the waiters among them; fresh and waiting in all;
	// seekingFor the outstanding requests per budget, seeking in all.
	needs, waitersFor, seekingFor map[throttle.Keyed]int
	fresh, waiting                int
	seeking, seekers              int
	idle                          int // seekers waiting for demand
	// depth is how many requests to keep outstanding now (adapt).
	depth int
	// taken counts fresh records handed to workers and not yet ended:
	// the in-flight bound.
	taken int
	quit  bool
	ctx   context.Context
	stopC context.CancelFunc
	wg    sync.WaitGroup
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
	waiters       candQueue
	fresh         candQueue
}

const fairScale = 1 << 24

// leadSlack is how far above 0 fair.lead may be from rounding alone: an
// urgent record still goes first then.
const leadSlack = 1e-9

// rebaseAt is the virtual time past which the tags are moved back to
// start from 0 (rebase): a tenant alone moves it on by up to fairScale
// per permit, and int64 would overflow after 2^39 permits.
const rebaseAt = 1 << 62

// cand is a record waiting for a permit.
type cand struct {
	p *partition
	s *slot
	k throttle.Keyed // the budget its permit comes from
	w *waiter        // nil for a fresh record
	// since is when a fresh record became a candidate: its wait for a
	// permit counts from there (Stats.PermitWait).
	since time.Time
	// tried: the reserve was asked for a permit for it (UrgentReserve);
	// pending: it is queued, and the reserve has not answered for it
	// yet: the shared seekers ask for no permit for it meanwhile, since
	// one asked would find no record when the reserve's came first.
	tried, pending bool
}

// waiter is a record in work waiting for its permit.
type waiter struct {
	ch     chan grant
	queued bool // still in a queue (under fair.mu)
}

// grant is a permit (or the error asking for it met) for a record.
type grant struct {
	k       throttle.Keyed
	release func() // gives back the concurrency slot, if any
	err     error
	permit  bool // a permit was taken (see drop)
	// useBy is until when the permit may be used, on its limiter's clock
	// (its time and the bucket's margin); zero: no bound.
	useBy time.Time
}

// drop gives back g's concurrency slot, if any, and counts its permit,
// if any, as unused (Stats.PermitsUnused): its record or its call went
// away.
func (g *grant) drop(c *Consumer) {
	g.release()
	if g.permit {
		c.permitsUnused.Add(1)
	}
}

// stale reports whether g's permit can no longer be used: its margin has
// passed (a call made now could arrive beyond the bucket's guarantee).
func (g *grant) stale() bool {
	return !g.useBy.IsZero() && capability.KeyedLimiter(g.k).Clock().Now().After(g.useBy)
}

func newFair(c *Consumer, cfg *fairConfig) *fair {
	f := &fair{
		c:          c,
		cfg:        cfg,
		tenants:    make(map[string]*tenant),
		needs:      make(map[throttle.Keyed]int),
		waitersFor: make(map[throttle.Keyed]int),
		seekingFor: make(map[throttle.Keyed]int),
		holdingFor: make(map[throttle.Keyed]int),
		depth:      1,
	}
	if cfg.reserve != nil {
		f.pendingFor, f.pendingWaitersFor = make(map[throttle.Keyed]int), make(map[throttle.Keyed]int)
	}
	f.wanted.L, f.freed.L, f.untriedC.L = &f.mu, &f.mu, &f.mu
	return f
}

// start sets the context the seekers' permit requests are made under.
func (f *fair) start(base context.Context) {
	f.mu.Lock()
	f.ctx, f.stopC = context.WithCancel(base)
	if f.cfg.reserve != nil {
		f.wg.Add(1)
		go f.seekReserve()
	}
	f.mu.Unlock()
}

// stop ends the seekers and waits for them.
func (f *fair) stop() {
	f.mu.Lock()
	f.quit = true
	if f.stopC != nil {
		f.stopC()
	}
	f.wanted.Broadcast()
	f.freed.Broadcast()
	f.untriedC.Broadcast()
	f.mu.Unlock()
	f.wg.Wait()
}

// classify sets s's tenant and urgency once, and returns its candidate
// for a first attempt; direct reports that it needs no permit (no
// budget, a function that panicked, a parked unit). p.mu is held.
func (f *fair) classify(p *partition, s *slot) (cd *cand, direct bool) {
	if !s.classified {
		s.classified = true
		s.tenant = f.tenantOf(&s.rec)
		if f.cfg.urgent != nil {
			s.urgent = f.urgentOf(&s.rec)
		}
	}
	cd = &cand{p: p, s: s}
	k, err := f.c.limiterOf(&s.rec)
	if err != nil || capability.KeyedLimiter(k).None() && f.c.cfg.slots == nil || p.parks && s.unit != nil && s.unit.parked {
		return cd, true // its worker meets what it meets without a permit
	}
	cd.k = k
	return cd, false
}

func (f *fair) tenantOf(rec *kgo.Record) (t string) {
	defer func() {
		if v := recover(); v != nil {
			f.c.log.Error("consumer: WithFairness tenant function panicked; the record counts as tenant \"\"", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset,
				"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			t = ""
		}
	}()
	return f.cfg.tenant(rec)
}

func (f *fair) urgentOf(rec *kgo.Record) (u bool) {
	defer func() {
		if v := recover(); v != nil {
			f.c.log.Error("consumer: WithFairness Urgent function panicked; the record counts as normal", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset,
				"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			u = false
		}
	}()
	return f.cfg.urgent(rec)
}

// offer moves p's ready records into the scheduler; p.mu is held.
func (f *fair) offer(p *partition) {
	var cb, db [4]*cand // most offers are one record's
	cands, directs := cb[:0], db[:0]
	now := time.Now()
	for p.ready.len() > 0 {
		cd, direct := f.classify(p, p.ready.pop())
		cd.since = now
		if direct {
			directs = append(directs, cd)
		} else {
			cands = append(cands, cd)
		}
	}
	p.ready.reset()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, cd := range directs {
		f.direct.push(cd)
	}
	for _, cd := range cands {
		f.add(cd)
	}
	f.handDirect()
	f.kick()
}

// add queues cd; f.mu is held.
func (f *fair) add(cd *cand) {
	f.needs[cd.k]++
	if cd.w != nil {
		f.waiting++
		f.waitersFor[cd.k]++
		cd.w.queued = true
	} else {
		f.fresh++
		cd.p.waiting.Add(1) // Stats: a waiter counts itself
		f.c.waitingRecords.Add(1)
	}
	if cd.s.urgent {
		f.urgent.push(cd)
		if f.cfg.reserve != nil {
			f.untried++
			cd.pending = true
			f.pendingFor[cd.k]++
			if cd.w != nil {
				f.pendingWaiting++
				f.pendingWaitersFor[cd.k]++
			} else {
				f.pendingFresh++
			}
			f.untriedC.Signal()
		}
		return
	}
	t := f.tenants[cd.s.tenant]
	if t == nil {
		w := 1
		if n, ok := f.cfg.weights[cd.s.tenant]; ok {
			w = n
		}
		t = &tenant{name: cd.s.tenant, step: fairScale / int64(w), finish: math.MinInt64, idx: -1}
		f.tenants[t.name] = t
	}
	if cd.w != nil {
		t.waiters.push(cd)
	} else {
		t.fresh.push(cd)
	}
	if t.idx < 0 {
		t.start = max(f.vtime, t.finish)
		f.seq++
		t.seq = f.seq
		heap.Push(&f.active, t)
	}
}

// unqueued forgets cd's counts, once it left its queue; f.mu is held.
func (f *fair) unqueued(cd *cand) {
	if cd.s.urgent && f.cfg.reserve != nil && !cd.tried {
		f.untried--
	}
	f.answered(cd)
	if n := f.needs[cd.k] - 1; n > 0 {
		f.needs[cd.k] = n
	} else {
		delete(f.needs, cd.k)
	}
	if cd.w != nil {
		f.waiting--
		if n := f.waitersFor[cd.k] - 1; n > 0 {
			f.waitersFor[cd.k] = n
		} else {
			delete(f.waitersFor, cd.k)
		}
		cd.w.queued = false
	} else {
		f.fresh--
		cd.p.waiting.Add(-1)
		f.c.waitingRecords.Add(-1)
	}
}

// answered notes that cd is no longer waiting for the reserve's answer
// (it came, or cd left its queue); f.mu is held.
func (f *fair) answered(cd *cand) {
	if !cd.pending {
		return
	}
	cd.pending = false
	dec := func(m map[throttle.Keyed]int) {
		if n := m[cd.k] - 1; n > 0 {
			m[cd.k] = n
		} else {
			delete(m, cd.k)
		}
	}
	dec(f.pendingFor)
	if cd.w != nil {
		f.pendingWaiting--
		dec(f.pendingWaitersFor)
	} else {
		f.pendingFresh--
	}
}

// demand is how many more permits of the shared seekers the queued
// candidates can use now: the waiters, and fresh records for which a
// worker is free, but for the urgent records waiting for the reserve's
// answer (whose fresh ones would take the first workers free); f.mu is
// held.
func (f *fair) demand() int {
	return f.waiting - f.pendingWaiting + min(f.fresh-f.pendingFresh, max(f.c.cfg.maxInFlight-f.taken-f.pendingFresh, 0))
}

// kick wakes or starts a seeker when a budget's candidates need more
// requests than are outstanding for it, and the reserve's seeker when
// urgent records have not asked it (a worker may have freed for one);
// f.mu is held.
func (f *fair) kick() {
	if f.quit || f.ctx == nil {
		return
	}
	if f.untried > 0 {
		f.untriedC.Signal()
	}
	if _, ok := f.budget(); !ok {
		return
	}
	if f.idle > 0 {
		f.wanted.Signal()
		return
	}
	if f.seekers-(f.holding-f.reserveHolding) < f.c.cfg.maxInFlight { // a seeker that holds a permit asks for none
		f.seekers++
		f.wg.Add(1)
		go f.seek()
	}
}

// handDirect hands fresh records that need no permit to workers while
// one is free; f.mu is held.
func (f *fair) handDirect() {
	for f.direct.len() > 0 && f.taken < f.c.cfg.maxInFlight && !f.quit {
		cd := f.direct.pop()
		f.taken++
		f.hand(cd, nil)
	}
}

// hand gives a fresh record to a worker, with its grant (nil: none);
// f.mu is held (the sched's lock is taken under it).
func (f *fair) hand(cd *cand, g *grant) {
	if !f.c.sched.enqueueJob(job{p: cd.p, s: cd.s, g: g}) {
		f.taken--
		if g != nil {
			g.drop(f.c)
		}
	}
}

// untake is called by a worker done with a fresh record it was handed.
func (f *fair) untake() {
	f.mu.Lock()
	f.taken--
	f.handDirect()
	if f.holding > 0 {
		f.freed.Broadcast() // a seeker holds a permit for want of a worker
	}
	f.kick()
	f.mu.Unlock()
}

// budget returns the budget the next permit request is for: the one of
// the record that would be chosen now, unless the requests outstanding
// for it cover its candidates or reach the depth; then any budget whose
// candidates need more. False when none does, or the candidates that can
// use a permit now are covered. A request beyond a budget's waiters is
// for its fresh records, which need a worker: such requests (and the
// permits held for want of a worker) are at most the workers free, so
// that while every worker is busy the requests are for the records in
// work, whatever budget the records ahead in turn need. Each budget has
// its own requests, so a budget that grants nothing (a tenant's own
// budget, spent) holds up no other; all of them are at most
// WithMaxInFlight. f.mu is held.
func (f *fair) budget() (throttle.Keyed, bool) {
	if f.demand() <= f.seeking || f.seeking >= f.c.cfg.maxInFlight {
		return throttle.Keyed{}, false
	}
	freshAsked := f.holding
	for b, n := range f.seekingFor {
		freshAsked += max(n-f.waitersFor[b], 0)
	}
	free := f.c.cfg.maxInFlight - f.taken - f.pendingFresh
	wants := func(k throttle.Keyed) bool {
		n := f.seekingFor[k]
		return n < f.depth && (f.waitersFor[k]-f.pendingWaitersFor[k] > n || f.needs[k]-f.pendingFor[k] > n && freshAsked < free)
	}
	var k throttle.Keyed
	switch {
	case f.urgent.len() > 0:
		k = f.urgent.at(0).k
	case f.active.Len() > 0:
		t := f.active[0]
		if t.waiters.len() > 0 {
			k = t.waiters.at(0).k
		} else {
			k = t.fresh.at(0).k
		}
	}
	if wants(k) {
		return k, true
	}
	if len(f.needs) <= 1 { // k's alone
		return throttle.Keyed{}, false
	}
	for b := range f.needs {
		if wants(b) {
			return b, true
		}
	}
	return throttle.Keyed{}, false
}

// seek is a seeker: it asks for a permit while candidates need one, and
// gives each permit to the record pick chooses when it comes.
func (f *fair) seek() {
	defer f.wg.Done()
	f.mu.Lock()
	defer f.mu.Unlock()
	// note learns whether the limiter paced a grant; its context is
	// made once per seeker (f.ctx is set before any seeker starts).
	var note capability.PaceNote
	var base, ctx context.Context
	for {
		var k throttle.Keyed
		for !f.quit {
			var ok bool
			if k, ok = f.budget(); ok {
				break
			}
			f.idle++
			f.wanted.Wait()
			f.idle--
		}
		if f.quit {
			return
		}
		f.seeking++
		f.seekingFor[k]++
		f.kick() // another budget, or this one's depth, may want a request too
		if base != f.ctx {
			base = f.ctx
			ctx = capability.WithPaceNote(base, &note)
		}
		note.Reset()
		f.mu.Unlock()
		g := f.acquire(ctx, k)
		f.mu.Lock()
		if g.err == nil {
			f.adapt(note.Paced())
		}
		f.seeking--
		if n := f.seekingFor[k] - 1; n > 0 {
			f.seekingFor[k] = n
		} else {
			delete(f.seekingFor, k)
		}
		f.give(g, false)
	}
}

// seekReserve asks the reserve (UrgentReserve) for a permit, to be had at
// once, for each urgent candidate in turn (reserveNext), and gives each
// permit to the oldest urgent record that can take it now.
func (f *fair) seekReserve() {
	defer f.wg.Done()
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		var next *cand
		for !f.quit {
			if next = f.reserveNext(); next != nil {
				break
			}
			f.untriedC.Wait() // a candidate comes, or a worker frees
		}
		if f.quit {
			return
		}
		next.tried = true
		f.untried--
		k, ctx := next.k, f.ctx
		f.mu.Unlock()
		g := f.take(ctx, k, f.cfg.reserve.Key(""), 0)
		f.mu.Lock()
		f.answered(next) // if still queued, the shared seekers may ask for it now
		f.noteReserve(ctx, g.err)
		if g.err == nil {
			f.give(g, true)
		}
		f.kick()
	}
}

// noteReserve warns, once until the reserve answers again, when asking
// it failed otherwise than by a refusal (an error not matching
// throttle.ErrTimeout: its store failing under FailClosed, a Limiter
// misconfigured): the urgent records then take shared permits, and the
// part of the limit the reserve stands for goes unused. f.mu is held.
func (f *fair) noteReserve(ctx context.Context, err error) {
	switch {
	case err == nil || errors.Is(err, throttle.ErrTimeout):
		f.reserveFailing = false
	case ctx.Err() != nil || f.reserveFailing:
	default:
		f.reserveFailing = true
		f.c.log.Warn("consumer: WithFairness UrgentReserve: asking the reserve for a permit failed; urgent records take shared permits until it answers again", "err", err)
	}
}

// reserveNext returns the oldest urgent candidate the reserve has not
// been asked for that can take a permit now: a waiter, or a fresh record
// while a worker is free for it (a permit held for want of a worker
// waits for the handlers in work, and past its time's margin it is not
// used at all); nil if none. f.mu is held.
func (f *fair) reserveNext() *cand {
	if f.untried == 0 {
		return nil
	}
	worker := f.taken+f.holding < f.c.cfg.maxInFlight
	untried := false
	for i := range f.urgent.len() {
		if cd := f.urgent.at(i); !cd.tried {
			if cd.w != nil || worker {
				return cd
			}
			untried = true
		}
	}
	if !untried { // the count is wrong: never wait on it
		f.untried = 0
	}
	return nil
}

// adapt sets how many requests to keep outstanding after a grant: one
// fewer (at least one) when the limiter paced it, one more (at most
// fairSeekers) when it came as fast as the store answered; f.mu is held.
func (f *fair) adapt(paced bool) {
	if paced {
		f.depth = max(f.depth-1, 1)
	} else {
		f.depth = min(f.depth+1, fairSeekers)
	}
}

// give hands g to the record pick chooses (with reserved, g is a permit
// of the reserve: urgent records first, whatever their share); f.mu is
// held. With no worker
// free for the fresh record chosen, it waits for one, or for a record in
// work that asks for a permit of g's budget (at most fairSeekers seekers
// do; the others' permits are not used, so that the seekers that
// ask for the records in work are never all waiting); with no record of
// g's budget left, the permit is not used.
func (f *fair) give(g grant, reserved bool) {
	for {
		if f.quit {
			g.drop(f.c)
			return
		}
		cd, needWorker := f.pick(g.k, f.taken < f.c.cfg.maxInFlight, reserved)
		switch {
		case cd == nil && needWorker && f.holding < fairSeekers:
			f.holding++
			f.holdingFor[g.k]++
			if reserved {
				f.reserveHolding++ // no shared seeker's
			}
			f.kick()       // the records in work may need a request this one was counted for
			f.freed.Wait() // a fresh record waits for a worker, or a waiter came
			f.holding--
			if reserved {
				f.reserveHolding--
			}
			if n := f.holdingFor[g.k] - 1; n > 0 {
				f.holdingFor[g.k] = n
			} else {
				delete(f.holdingFor, g.k)
			}
			if g.stale() {
				// Held past its margin: used now, its call could come
				// late. Its seeker asks again.
				f.c.permitsStale.Add(1)
				g.drop(f.c)
				f.kick()
				return
			}
			continue
		case cd == nil:
			g.drop(f.c) // its record went away: the permit is not used
			if f.untried > 0 && !f.quit {
				f.untriedC.Signal() // a worker it waited for may be free for an urgent record
			}
			return
		case cd.w != nil:
			cd.w.ch <- g // buffered, one grant per waiter
		default:
			f.c.permitWait.Add(int64(time.Since(cd.since)))
			f.taken++
			f.hand(cd, &g)
		}
		f.kick()
		return
	}
}

// acquire takes a slot of the concurrency cap, if any, and a permit of k,
// waiting at most WithPermitWait's wait, or the shaping bound with
// WithShaping; an error (a timeout included) is the record's the permit
// would have gone to, to handle as its policies say (grant.err).
func (f *fair) acquire(ctx context.Context, k throttle.Keyed) grant {
	wait := f.c.cfg.maxWait
	if f.c.cfg.shaping != "" {
		wait = min(wait, f.c.cfg.shapingBound)
	}
	return f.take(ctx, k, k, wait)
}

// take takes a slot of k's key of the concurrency cap, if any, and a
// permit of from (k's budget, or the reserve), waiting at most wait; the
// grant is for k's records.
func (f *fair) take(ctx context.Context, k, from throttle.Keyed, wait time.Duration) grant {
	g := grant{k: k, release: noRelease}
	if s := f.c.cfg.slots; s != nil {
		began := time.Now()
		r, err := s.Hold(ctx, k.Key(), wait)
		if err != nil {
			g.err = fmt.Errorf("concurrency slot: %w", err)
			return g
		}
		g.release = r
		if wait != throttle.Forever {
			wait = max(wait-time.Since(began), 0)
		}
	}
	if !capability.KeyedLimiter(from).None() {
		var err error
		if g.useBy, err = acquireUseBy(ctx, from, wait); err != nil {
			g.release()
			g.release, g.err = noRelease, err
		} else {
			g.permit = true
		}
	}
	return g
}

// acquireUseBy acquires a permit of k, waiting at most wait, and returns
// until when it may be used (zero: no bound).
func acquireUseBy(ctx context.Context, k throttle.Keyed, wait time.Duration) (time.Time, error) {
	n := capability.NoteOf(ctx)
	if n == nil {
		n = new(capability.PaceNote)
		ctx = capability.WithPaceNote(ctx, n)
	}
	if err := k.Acquire(ctx, wait); err != nil {
		return time.Time{}, err
	}
	return n.UseBy(), nil
}

// pick removes and returns the candidate the next permit of budget k goes
// to: an urgent one within the urgent share (any urgent one, and outside
// the share, for a permit of the reserve: reserved), else the next of
// the tenant whose turn it is. Fresh records count only when worker (a
// worker is free). needWorker reports that none was chosen for want of a
// worker. f.mu is held.
func (f *fair) pick(k throttle.Keyed, worker, reserved bool) (cd *cand, needWorker bool) {
	if f.vtime >= rebaseAt {
		f.rebase()
	}
	// Urgent first, within the share; beyond it only when no normal
	// record can take the permit.
	ui := f.urgent.find(k, worker)
	if ui >= 0 && reserved {
		cd = f.urgent.remove(ui)
		f.unqueued(cd)
		return cd, false
	}
	t, ti, fromWaiters := f.next(k, worker)
	if ui >= 0 && (f.lead <= leadSlack || t == nil) {
		if t == nil {
			f.lead = min(f.lead, 0)
		}
		f.lead += 1 - f.cfg.share
		cd = f.urgent.remove(ui)
		f.unqueued(cd)
		return cd, false
	}
	if t == nil {
		// No waiter of k (it would have been chosen): only a fresh
		// record of k can take the permit, once a worker is free.
		return nil, !worker && f.needs[k] > 0
	}
	if ui < 0 {
		f.lead = max(f.lead, 0)
	}
	f.lead -= f.cfg.share
	if fromWaiters {
		cd = t.waiters.remove(ti)
	} else {
		cd = t.fresh.remove(ti)
	}
	f.unqueued(cd)
	f.vtime = t.start
	t.finish = t.start + t.step
	if t.waiters.len()+t.fresh.len() > 0 {
		t.start = t.finish
		heap.Fix(&f.active, t.idx)
	} else {
		heap.Remove(&f.active, t.idx)
		f.sweep()
	}
	return cd, false
}

// next returns the active tenant with the earliest start tag that has a
// candidate for a permit of k (a fresh one only when worker), and where
// that candidate is; f.mu is held.
func (f *fair) next(k throttle.Keyed, worker bool) (best *tenant, i int, fromWaiters bool) {
	has := func(t *tenant) (int, bool) {
		if i := t.waiters.find(k, true); i >= 0 {
			return i, true
		}
		if worker {
			return t.fresh.find(k, true), false
		}
		return -1, false
	}
	if f.active.Len() == 0 {
		return nil, -1, false
	}
	if i, w := has(f.active[0]); i >= 0 {
		return f.active[0], i, w
	}
	for _, t := range f.active {
		if best != nil && !t.before(best) {
			continue
		}
		if j, w := has(t); j >= 0 {
			best, i, fromWaiters = t, j, w
		}
	}
	return best, i, fromWaiters
}

// rebase moves every tag back by vtime, so that vtime is 0: the order of
// the tags is kept, and the tags stay far from int64's end. Every start
// tag is at least vtime; a finish tag at most vtime is unset instead (the
// tenant starts at vtime either way), so none underflows, however many
// rebases an idle tenant stays through; f.mu is held.
func (f *fair) rebase() {
	d := f.vtime
	for _, t := range f.tenants {
		if t.idx >= 0 {
			t.start -= d
		}
		if t.finish <= d {
			t.finish = math.MinInt64
		} else {
			t.finish -= d
		}
	}
	f.vtime = 0
}

// sweep forgets idle tenants whose finish tag vtime has reached (they
// would start at vtime anyway), once the map has doubled since the last
// sweep; f.mu is held.
func (f *fair) sweep() {
	if len(f.tenants) < 2*f.swept+64 {
		return
	}
	for name, t := range f.tenants {
		if t.idx < 0 && t.finish <= f.vtime {
			delete(f.tenants, name)
		}
	}
	f.swept = len(f.tenants)
}

// wait queues the record in work s for a permit of k and waits for it,
// at most wait (not throttle.Forever), or until p stops.
func (f *fair) wait(p *partition, s *slot, k throttle.Keyed, wait time.Duration) grant {
	w := &waiter{ch: make(chan grant, 1)}
	f.mu.Lock()
	f.add(&cand{p: p, s: s, k: k, w: w})
	if f.holdingFor[k] > 0 {
		// A seeker holds a permit of k for want of a worker: it is
		// this record's (or another waiter's of k; the seeker asks
		// again for what is left). Asking anew instead would leave
		// the record, and with WithConcurrency the slot the permit
		// holds, waiting for a worker this record keeps busy.
		f.freed.Broadcast()
	} else {
		f.kick()
	}
	f.mu.Unlock()
	var timeout <-chan time.Time
	if wait != throttle.Forever {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	var err error
	select {
	case g := <-w.ch:
		return g
	case <-timeout:
		err = fmt.Errorf("consumer: no permit within %v (the wait includes the record's turn among tenants): %w", wait, throttle.ErrTimeout)
	case <-p.soft.Done():
		err = p.soft.Err()
	}
	f.mu.Lock()
	if w.queued {
		f.remove(s, w)
		f.mu.Unlock()
		return grant{k: k, release: noRelease, err: err}
	}
	f.mu.Unlock()
	g := <-w.ch // given meanwhile
	if p.soft.Err() != nil {
		g.drop(p.c) // the permit is not used
		return grant{k: k, release: noRelease, err: err}
	}
	return g
}

// remove takes waiter w of s out of its queue; f.mu is held.
func (f *fair) remove(s *slot, w *waiter) {
	if s.urgent {
		cd := f.urgent.remove(f.urgent.index(w))
		f.unqueued(cd)
		return
	}
	t := f.tenants[s.tenant]
	cd := t.waiters.remove(t.waiters.index(w))
	f.unqueued(cd)
	if t.waiters.len()+t.fresh.len() == 0 {
		heap.Remove(&f.active, t.idx)
	}
}

// drop takes p's fresh records out of the scheduler (p stopped) and
// returns them; p.mu is held.
func (f *fair) drop(p *partition) []*slot {
	var out []*slot
	of := func(c *cand) bool {
		if c.p == p && c.w == nil {
			out = append(out, c.s)
			return true
		}
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, cd := range f.urgent.filter(of) {
		f.unqueued(cd)
	}
	f.direct.filter(of)
	for _, t := range f.tenants {
		if t.idx < 0 {
			continue
		}
		for _, cd := range t.fresh.filter(of) {
			f.unqueued(cd)
		}
	}
	for i := 0; i < f.active.Len(); {
		if t := f.active[i]; t.waiters.len()+t.fresh.len() == 0 {
			heap.Remove(&f.active, i)
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

// tenantHeap is a min-heap of active tenants by start tag.
type tenantHeap []*tenant

func (h tenantHeap) Len() int           { return len(h) }
func (h tenantHeap) Less(i, j int) bool { return h[i].before(h[j]) }
func (h tenantHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *tenantHeap) Push(x any) {
	t := x.(*tenant)
	t.idx = len(*h)
	*h = append(*h, t)
}
func (h *tenantHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.idx = -1
	return t
}

// candQueue is a FIFO of candidates that also removes from its middle
// (a waiter that gave up, a record of another budget).
type candQueue struct {
	buf  []*cand
	head int
}

func (q *candQueue) len() int       { return len(q.buf) - q.head }
func (q *candQueue) at(i int) *cand { return q.buf[q.head+i] }
func (q *candQueue) push(c *cand)   { q.buf = append(q.buf, c) }
func (q *candQueue) pop() *cand     { return q.remove(0) }

// find returns the place of the first candidate for a permit of k (a
// fresh one only when fresh), -1 if none.
func (q *candQueue) find(k throttle.Keyed, fresh bool) int {
	for i := q.head; i < len(q.buf); i++ {
		if c := q.buf[i]; c.k == k && (fresh || c.w != nil) {
			return i - q.head
		}
	}
	return -1
}

// index returns the place of the candidate of waiter w.
func (q *candQueue) index(w *waiter) int {
	for i := q.head; i < len(q.buf); i++ {
		if q.buf[i].w == w {
			return i - q.head
		}
	}
	return -1
}

// remove removes and returns the i-th candidate.
func (q *candQueue) remove(i int) *cand {
	c := q.buf[q.head+i]
	if i == 0 {
		q.buf[q.head] = nil
		q.head++
	} else {
		copy(q.buf[q.head+i:], q.buf[q.head+i+1:])
		q.buf[len(q.buf)-1] = nil
		q.buf = q.buf[:len(q.buf)-1]
	}
	if q.head == len(q.buf) {
		q.buf, q.head = q.buf[:0], 0
		if cap(q.buf) >= minShrink {
			q.buf = nil
		}
	} else if q.head >= 1024 && q.head*2 >= len(q.buf) {
		n := copy(q.buf, q.buf[q.head:])
		clear(q.buf[n:])
		q.buf, q.head = q.buf[:n], 0
	}
	return c
}

// filter removes and returns the candidates of, keeping the others'
// order.
func (q *candQueue) filter(of func(*cand) bool) []*cand {
	var out []*cand
	kept := q.buf[:0]
	for _, c := range q.buf[q.head:] {
		if of(c) {
			out = append(out, c)
		} else {
			kept = append(kept, c)
		}
	}
	clear(q.buf[len(kept):])
	q.buf, q.head = kept, 0
	return out
}
