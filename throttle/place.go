package throttle

import (
	"sync/atomic"
	"time"
)

// The key's next place.
//
// A bucket that places its permits (the token bucket) names, when it
// refuses one permit and when it grants one (Decision.Next), the earliest
// place one more permit of the key can have. A Limiter remembers it for
// the key: until then, a caller whose wait ends before it is refused
// without a round trip (its answer would be the same refusal). A place
// counts from when the call that named it was sent: the bucket decided
// after that, so the place remembered is never later than the bucket's.
//
// It is forgotten when a permit may be free sooner:
//   - a give-back of the key to the bucket begins;
//   - a grant names none while the bucket's grants name it (a permit is
//     free now), is free at once, or is placed before it;
//   - a call ran beside a give-back of the key: its place may count the
//     permit given back, so it is not remembered.
//
// A remembered place that comes too early only costs the round trip that
// finds the later one; one that comes too late refuses callers the bucket
// would have granted, which the rules above prevent.

// nextPlace is a key's next place (keyState.next). Lock-free.
type nextPlace struct {
	// at is the place, on the Limiter's time base; 0: none.
	at atomic.Int64
	// named: the bucket's grants name their next place, so one that
	// names none says a permit is free now.
	named atomic.Bool
	// backs counts the key's give-backs under way; turns changes when
	// one begins or ends.
	backs atomic.Int32
	turns atomic.Uint64
}

// refusal is w's refusal from memory at the key's next place, if its
// wait ends before it (ok). It reads the clock only while a place is
// remembered.
func (p *nextPlace) refusal(w *waiter) (c decision, ok bool) {
	at := p.at.Load()
	if at == 0 || w.gateDeadline() >= at {
		return decision{}, false
	}
	now := w.l.tb.now()
	if at <= now {
		return decision{}, false
	}
	return decision{n: w.n, err: w.tb.err(time.Duration(at - now))}, true
}

// mark is read before a call is sent; learn gets it back, to tell
// whether a give-back of the key ran beside the call.
func (p *nextPlace) mark() uint64 { return p.turns.Load() }

// learn reads the next place that c, a decision for w's permits asked for
// after mark, names, by the rules above.
func (p *nextPlace) learn(w *waiter, c *decision, mark uint64) {
	if c.src != fromStore || c.err != nil {
		return
	}
	from := c.sent // (a bucket in memory: no call sent, answered at once)
	if from == 0 {
		from = c.answered
	}
	if p.turns.Load() != mark || p.backs.Load() != 0 {
		p.forget()
		return
	}
	switch {
	case from == 0:
	case !c.Granted:
		if w.n == 1 && c.Delay > 0 {
			// (A refusal of n permits says nothing of one permit's
			// place: it may come sooner.)
			p.set(addSat(from, c.Delay), mark)
		}
	case c.Next > 0:
		if !p.named.Load() {
			p.named.Store(true)
		}
		p.set(addSat(from, c.Next), mark)
	case c.Delay == 0 || p.named.Load():
		p.forget() // a permit is free now
	case addSat(c.answered, c.Delay) < p.at.Load():
		p.forget() // placed before it: permits were given back
	}
}

// set remembers the place at, unless a give-back of the key began since
// mark: one that began as it was set forgets it (givingBack), one that
// began before is seen here.
func (p *nextPlace) set(at int64, mark uint64) {
	p.at.Store(at)
	if p.turns.Load() != mark {
		p.forget()
	}
}

// forget forgets the place. (A key's callers below its limit forget it
// at every grant: the load spares them a store to a shared cache line.)
func (p *nextPlace) forget() {
	if p.at.Load() != 0 {
		p.at.Store(0)
	}
}

// givingBack records that a give-back of the key to its bucket begins,
// and forgets the place; end records that it ended.
func (p *nextPlace) givingBack() (end func()) {
	p.backs.Add(1)
	p.turns.Add(1)
	p.forget()
	return func() {
		p.turns.Add(1)
		p.backs.Add(-1)
	}
}

// idle reports whether p holds nothing worth keeping at now: no place
// ahead, no give-back under way.
func (p *nextPlace) idle(now int64) bool {
	return p.at.Load() <= now && p.backs.Load() == 0
}

// askPlaced asks the bucket for w's permits of st's key, unless the key's
// next place refuses them from memory, and learns the place the answer
// names.
func (l *Limiter) askPlaced(w *waiter, st *keyState) decision {
	if c, ok := st.next.refusal(w); ok {
		return c
	}
	mark := st.next.mark()
	c := l.ask(w, st, w.n, 0)
	st.next.learn(w, &c, mark)
	return c
}
