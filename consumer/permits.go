package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/headway-go/headway/internal/admit"
	"github.com/headway-go/headway/internal/pacenote"
	"github.com/headway-go/headway/throttle"
)

// fairSeekers is the most permit requests an instance keeps outstanding
// at once under WithFairness (fewer when fewer records wait). How many it
// keeps adapts (fair.adapt): one fewer, down to one, after each grant the
// limiter paced (it waited for the grant's place in the period, a
// refusal's retry time, or the adaptive pace), one more after each grant
// that came as fast as the store answers (more requests then make more
// permits). The limiter tells which (pacenote.Note): how long a
// grant took does not, since a paced grant of a busy limit can take as
// little as the store's answer to another. Few requests keep what they
// reserve small and spread: the record that gets a permit is chosen when
// the permit comes, but the instance's next permit is the earliest place
// its requests hold, and many requests of one instance take places in a
// row, leaving the instance without a grant while the others' pass (and
// an urgent record that comes then waiting for them).
const fairSeekers = 8

// permitPump is the state of the goroutines that ask the limiter for
// permits under WithFairness and give each to the record the fairQueue
// picks when it comes: the seekers (at most WithMaxInFlight), which ask
// while a budget's candidates need more than those already asked for it,
// up to depth per budget, and with UrgentReserve the reserve's seeker.
// Its fields are under fair.mu; a seeker holds no lock while it asks.
type permitPump struct {
	// wanted wakes a seeker waiting for candidates (idle of them);
	// freed wakes the seekers that hold a permit for want of a worker
	// (holding of them); untried wakes the reserve's seeker.
	wanted, freed, untried sync.Cond
	seekers, idle          int
	// seeking counts the requests outstanding, seekingFor per budget.
	seeking    int
	seekingFor budgetCounts
	// depth is how many requests to keep outstanding now (adapt).
	depth int
	// holdingFor counts the seekers holding a permit per budget, holding
	// in all, and reserveHolding the reserve's seeker among them.
	holding, reserveHolding int
	holdingFor              budgetCounts
	// reserveFailing: the reserve's last answer was an error other than
	// a refusal (warned once until it answers again).
	reserveFailing bool
	ctx            context.Context
	stopC          context.CancelFunc
	wg             sync.WaitGroup
}

// grant is a permit (or the error asking for it met) for a record.
type grant struct {
	k       throttle.Keyed
	release func() // gives back the concurrency slot, if any
	err     error
	permit  bool // a permit was taken (see drop)
	asked   bool // its limiter was asked for the permit, granted or not
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
	return !g.useBy.IsZero() && g.k.Limiter().Clock().Now().After(g.useBy)
}

// demand is how many more permits of the shared seekers the queued
// candidates can use now: those in work, and fresh records for which a
// worker is free, but for the urgent records waiting for the reserve's
// answer (whose fresh ones would take the first workers free); f.mu is
// held.
func (f *fair) demand() int {
	queued, pending := &f.q.queued, &f.q.pending
	return queued.inWork - pending.inWork + min(queued.fresh-pending.fresh, max(f.c.cfg.maxInFlight-f.taken-pending.fresh, 0))
}

// kick wakes or starts a seeker when a budget's candidates need more
// requests than are outstanding for it, and the reserve's seeker when
// urgent records have not asked it (a worker may have freed for one);
// f.mu is held.
func (f *fair) kick() {
	pp := &f.pump
	if f.quit || pp.ctx == nil {
		return
	}
	if f.q.untried > 0 {
		pp.untried.Signal()
	}
	if _, ok := f.budget(); !ok {
		return
	}
	if pp.idle > 0 {
		pp.wanted.Signal()
		return
	}
	if pp.seekers-(pp.holding-pp.reserveHolding) < f.c.cfg.maxInFlight { // a seeker that holds a permit asks for none
		pp.seekers++
		pp.wg.Add(1)
		go f.seek()
	}
}

// budget returns the budget the next permit request is for: the one of
// the record that would be chosen now, unless the requests outstanding
// for it cover its candidates or reach the depth; then any budget whose
// candidates need more. False when none does, or the candidates that can
// use a permit now are covered. A request beyond a budget's candidates in
// work is for its fresh records, which need a worker: such requests (and
// the permits held for want of a worker) are at most the workers free, so
// that while every worker is busy the requests are for the records in
// work, whatever budget the records ahead in turn need. Each budget has
// its own requests, so a budget that grants nothing (a tenant's own
// budget, spent) holds up no other; all of them are at most
// WithMaxInFlight. f.mu is held.
func (f *fair) budget() (throttle.Keyed, bool) {
	queued, pending, pp := &f.q.queued, &f.q.pending, &f.pump
	if f.demand() <= pp.seeking || pp.seeking >= f.c.cfg.maxInFlight {
		return throttle.Keyed{}, false
	}
	freshAsked := pp.holding
	for b, n := range pp.seekingFor {
		freshAsked += max(n-queued.inWorkByBudget[b], 0)
	}
	free := f.c.cfg.maxInFlight - f.taken - pending.fresh
	wants := func(k throttle.Keyed) bool {
		n := pp.seekingFor[k]
		return n < pp.depth && (queued.inWorkByBudget[k]-pending.inWorkByBudget[k] > n || queued.byBudget[k]-pending.byBudget[k] > n && freshAsked < free)
	}
	if k := f.q.nextBudget(); wants(k) {
		return k, true
	}
	if len(queued.byBudget) <= 1 { // the next budget's alone
		return throttle.Keyed{}, false
	}
	for b := range queued.byBudget {
		if wants(b) {
			return b, true
		}
	}
	return throttle.Keyed{}, false
}

// seek is a seeker: it asks for a permit while candidates need one, and
// gives each permit to the record the fairQueue picks when it comes.
func (f *fair) seek() {
	pp := &f.pump
	defer pp.wg.Done()
	f.mu.Lock()
	defer f.mu.Unlock()
	// note learns whether the limiter paced a grant; its context is
	// made once per seeker (pp.ctx is set before any seeker starts).
	var note pacenote.Note
	var base, ctx context.Context
	for {
		var k throttle.Keyed
		for !f.quit {
			var ok bool
			if k, ok = f.budget(); ok {
				break
			}
			pp.idle++
			pp.wanted.Wait()
			pp.idle--
		}
		if f.quit {
			return
		}
		pp.seeking++
		pp.seekingFor.add(k, 1)
		f.kick() // another budget, or this one's depth, may want a request too
		if base != pp.ctx {
			base = pp.ctx
			ctx = pacenote.With(base, &note)
		}
		note.Reset()
		f.mu.Unlock()
		g := f.acquire(ctx, k)
		f.mu.Lock()
		if g.err == nil {
			f.adapt(note.Paced())
		}
		pp.seeking--
		pp.seekingFor.add(k, -1)
		f.give(g, false)
	}
}

// seekReserve asks the reserve (UrgentReserve) for a permit, to be had at
// once, for each urgent candidate in turn (reserveNext), and
// gives each permit to the oldest urgent record that can take it now.
func (f *fair) seekReserve() {
	pp := &f.pump
	defer pp.wg.Done()
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		var next *cand
		for !f.quit {
			if next = f.reserveNext(); next != nil {
				break
			}
			pp.untried.Wait() // a candidate comes, or a worker frees
		}
		if f.quit {
			return
		}
		next.tried = true
		f.q.untried--
		k, ctx := next.k, pp.ctx
		f.mu.Unlock()
		g := f.c.admit(ctx, k, f.cfg.reserve.Key(""), 0)
		f.mu.Lock()
		f.q.answered(next) // if still queued, the shared seekers may ask for it now
		f.noteReserve(ctx, g.err)
		if g.err == nil {
			f.give(g, true)
		}
		f.kick()
	}
}

// reserveNext returns the oldest urgent candidate the reserve can be
// asked for now: a fresh one only while a worker is free for it, counting
// the permits held for want of one; f.mu is held.
func (f *fair) reserveNext() *cand {
	return f.q.reserveNext(f.taken+f.pump.holding < f.c.cfg.maxInFlight)
}

// noteReserve warns, once until the reserve answers again, when asking
// it failed otherwise than by a refusal (an error not matching
// throttle.ErrTimeout: its store failing under FailClosed, a Limiter
// misconfigured): the urgent records then take shared permits, and the
// part of the limit the reserve stands for goes unused. f.mu is held.
func (f *fair) noteReserve(ctx context.Context, err error) {
	switch {
	case err == nil || errors.Is(err, throttle.ErrTimeout):
		f.pump.reserveFailing = false
	case ctx.Err() != nil || f.pump.reserveFailing:
	default:
		f.pump.reserveFailing = true
		f.c.log.Warn("consumer: WithFairness UrgentReserve: asking the reserve for a permit failed; urgent records take shared permits until it answers again", "err", err)
	}
}

// adapt sets how many requests to keep outstanding after a grant: one
// fewer (at least one) when the limiter paced it, one more (at most
// fairSeekers) when it came as fast as the store answered; f.mu is held.
func (f *fair) adapt(paced bool) {
	if paced {
		f.pump.depth = max(f.pump.depth-1, 1)
	} else {
		f.pump.depth = min(f.pump.depth+1, fairSeekers)
	}
}

// give hands g to the record the fairQueue picks (with reserved, g is a
// permit of the reserve: urgent records first, whatever their share);
// f.mu is held. With no worker free for the fresh record chosen, it waits
// for one, or for a record in work that asks for a permit of g's budget
// (at most fairSeekers seekers do; the others' permits are not used, so
// that the seekers that ask for the records in work are never all
// waiting); with no record of g's budget left, the permit is not used.
func (f *fair) give(g grant, reserved bool) {
	for {
		if f.quit {
			g.drop(f.c)
			return
		}
		cd, needWorker := f.q.pick(g.k, f.taken < f.c.cfg.maxInFlight, reserved)
		switch {
		case cd == nil && needWorker && f.pump.holding < fairSeekers:
			if !f.holdForWorker(g, reserved) {
				return
			}
			continue
		case cd == nil:
			g.drop(f.c) // its record went away: the permit is not used
			if f.q.untried > 0 && !f.quit {
				f.pump.untried.Signal() // a worker it waited for may be free for an urgent record
			}
			return
		case cd.reply != nil:
			cd.reply <- g // buffered, one grant per record in work
		default:
			cd.p.waiting.Add(-1) // it counted as waiting since fair.add
			f.c.waitingRecords.Add(-1)
			f.c.permitWait.Add(int64(time.Since(cd.since)))
			f.taken++
			f.hand(cd, &g)
		}
		f.kick()
		return
	}
}

// holdForWorker holds g until a worker frees or a record in work asks
// for a permit; false when g can no longer be used (dropped: held past
// its margin, its call could come late; its seeker asks again). f.mu is
// held.
func (f *fair) holdForWorker(g grant, reserved bool) bool {
	pp := &f.pump
	pp.holding++
	pp.holdingFor.add(g.k, 1)
	if reserved {
		pp.reserveHolding++ // no shared seeker's
	}
	f.kick()        // the records in work may need a request this one was counted for
	pp.freed.Wait() // a fresh record waits for a worker, or a record in work came
	pp.holding--
	if reserved {
		pp.reserveHolding--
	}
	pp.holdingFor.add(g.k, -1)
	if g.stale() {
		f.c.permitsStale.Add(1)
		g.drop(f.c)
		f.kick()
		return false
	}
	return true
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
	return f.c.admit(ctx, k, k, wait)
}

// admit takes a slot of k's key of the concurrency cap, if any, and a
// permit of from (k's budget, or the reserve, or none when it has no
// limiter), waiting at most wait for both; the grant is for k's records.
// On an error nothing is held.
func (c *Consumer) admit(ctx context.Context, k, from throttle.Keyed, wait time.Duration) grant {
	g := grant{k: k, release: noRelease}
	var hold func(time.Duration) (func(), error)
	if s := c.cfg.slots; s != nil {
		hold = func(d time.Duration) (func(), error) {
			r, err := s.Hold(ctx, k.Key(), d)
			if err != nil {
				return nil, fmt.Errorf("concurrency slot: %w", err)
			}
			return r, nil
		}
	}
	release, err := admit.SlotThenPermit(wait, time.Now, hold, func(d time.Duration) error {
		if from.Limiter() == nil {
			return nil
		}
		g.asked = true
		n := pacenote.Of(ctx)
		if n == nil {
			n = new(pacenote.Note)
			ctx = pacenote.With(ctx, n)
		}
		if err := from.Acquire(ctx, d); err != nil {
			return err
		}
		g.permit, g.useBy = true, n.UseBy()
		return nil
	})
	if g.err = err; release != nil {
		g.release = release
	}
	return g
}
