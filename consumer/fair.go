package consumer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

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

// fair runs WithFairness: records ready in their partitions and records
// in work asking for a later attempt's permit wait in its fairQueue,
// which chooses the record each permit goes to; its permit pump
// (permits.go) asks the limiter for the permits. A fresh record is handed
// to a worker with its permit; a record in work gets it through its
// cand's reply channel.
//
// Lock order: partition.mu, then fair.mu, then sched.mu (hand); a
// seeker holds none while it asks the limiter.
type fair struct {
	c   *Consumer
	cfg *fairConfig

	mu     sync.Mutex
	q      *fairQueue
	pump   permitPump
	direct fifo[*cand] // fresh records that need no permit
	// taken counts fresh records handed to workers and not yet ended:
	// the in-flight bound.
	taken int
	quit  bool
}

func newFair(c *Consumer, cfg *fairConfig) *fair {
	f := &fair{c: c, cfg: cfg, q: newFairQueue(cfg.weights, cfg.share, cfg.reserve != nil)}
	pp := &f.pump
	pp.seekingFor, pp.holdingFor, pp.depth = make(budgetCounts), make(budgetCounts), 1
	pp.wanted.L, pp.freed.L, pp.untried.L = &f.mu, &f.mu, &f.mu
	return f
}

// start sets the context the seekers' permit requests are made under.
func (f *fair) start(base context.Context) {
	f.mu.Lock()
	f.pump.ctx, f.pump.stopC = context.WithCancel(base)
	if f.cfg.reserve != nil {
		f.pump.wg.Add(1)
		go f.seekReserve()
	}
	f.mu.Unlock()
}

// stop ends the seekers and waits for them.
func (f *fair) stop() {
	pp := &f.pump
	f.mu.Lock()
	f.quit = true
	if pp.stopC != nil {
		pp.stopC()
	}
	pp.wanted.Broadcast()
	pp.freed.Broadcast()
	pp.untried.Broadcast()
	f.mu.Unlock()
	pp.wg.Wait()
}

// classify sets r's tenant and urgency once (a function that panics
// counts the record as tenant "", as normal), and returns its candidate
// for a first attempt; direct reports that it needs no permit (no
// budget, a function that panicked, a parked unit). p.mu is held.
func (f *fair) classify(p *partition, r *record) (cd *cand, direct bool) {
	if !r.classified {
		r.classified = true
		r.tenant, _ = guarded(f.c, "consumer: WithFairness tenant function panicked; the record counts as tenant \"\"", &r.rec, f.cfg.tenant)
		if f.cfg.urgent != nil {
			r.urgent, _ = guarded(f.c, "consumer: WithFairness Urgent function panicked; the record counts as normal", &r.rec, f.cfg.urgent)
		}
	}
	cd = &cand{p: p, r: r, tenant: r.tenant, urgent: r.urgent}
	k, err := f.c.limiterOf(&r.rec)
	if err != nil || k.Limiter() == nil && f.c.cfg.slots == nil || p.parks && r.unit != nil && r.unit.parked {
		return cd, true // its worker meets what it meets without a permit
	}
	cd.k = k
	return cd, false
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

// add queues cd, counts a fresh record as waiting (Stats: a record in
// work counts itself), and wakes the reserve's seeker for an urgent one;
// f.mu is held.
func (f *fair) add(cd *cand) {
	f.q.add(cd)
	if cd.reply == nil {
		cd.p.waiting.Add(1)
		f.c.waitingRecords.Add(1)
	}
	if cd.pending {
		f.pump.untried.Signal()
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
	if !f.c.sched.enqueueJob(job{p: cd.p, r: cd.r, g: g}) {
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
	if f.pump.holding > 0 {
		f.pump.freed.Broadcast() // a seeker holds a permit for want of a worker
	}
	f.kick()
	f.mu.Unlock()
}

// wait queues the record in work r for a permit of k and waits for it,
// at most wait (not throttle.Forever), or until p stops.
func (f *fair) wait(p *partition, r *record, k throttle.Keyed, wait time.Duration) grant {
	cd := &cand{p: p, r: r, tenant: r.tenant, urgent: r.urgent, k: k, reply: make(chan grant, 1)}
	f.mu.Lock()
	f.add(cd)
	if f.pump.holdingFor[k] > 0 {
		// A seeker holds a permit of k for want of a worker: it is
		// this record's (or another's in work of k; the seeker asks
		// again for what is left). Asking anew instead would leave
		// the record, and with WithConcurrency the slot the permit
		// holds, waiting for a worker this record keeps busy.
		f.pump.freed.Broadcast()
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
	case g := <-cd.reply:
		return g
	case <-timeout:
		err = fmt.Errorf("consumer: no permit within %v (the wait includes the record's turn among tenants): %w", wait, throttle.ErrTimeout)
	case <-p.soft.Done():
		err = p.soft.Err()
	}
	f.mu.Lock()
	if cd.queued {
		f.q.remove(cd)
		f.mu.Unlock()
		return grant{k: k, release: noRelease, err: err}
	}
	f.mu.Unlock()
	g := <-cd.reply // given meanwhile
	if p.soft.Err() != nil {
		g.drop(p.c) // the permit is not used
		return grant{k: k, release: noRelease, err: err}
	}
	return g
}

// withdraw takes p's fresh records out of the scheduler (p stopped) and
// returns them; p.mu is held.
func (f *fair) withdraw(p *partition) []*record {
	var out []*record
	of := func(cd *cand) bool { return cd.p == p }
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, cd := range f.direct.filter(of) {
		out = append(out, cd.r)
	}
	for _, cd := range f.q.removeFresh(of) {
		cd.p.waiting.Add(-1)
		f.c.waitingRecords.Add(-1)
		out = append(out, cd.r)
	}
	return out
}
