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
// without a round trip, by the adaptive pace too (its answer would be the
// same refusal; a caller of n > 1 permits only when n is within the key's
// limit as last reported, so that a bucket whose burst is its limit, the
// token bucket's, tells one that asks for more than it ever grants). A place
// counts from when the call that named it was sent: the bucket decided
// after that, so the place remembered is never later than the bucket's.
//
// It is forgotten when a permit may be free sooner:
//   - a give-back of the key to the bucket begins (a caller's, a cost's,
//     a lease refill's, a cost settled below its estimate; it opens the
//     key's gate too, gate.go);
//   - a grant names none while the bucket's grants name it (a permit is
//     free now), is free at once, or is placed before it;
//   - a call ran beside a give-back of the key: its place may count the
//     permit given back, so it is not remembered.
//
// A remembered place that comes too early only costs the round trip that
// finds the later one; one that comes too late refuses callers the bucket
// would have granted, which the rules above prevent for this Limiter's
// own give-backs. Permits given back by another process, a limit raised
// live, or a give-back the store applies after its call timed out
// (giveBackTimeout) may bring the place sooner unseen: short waits are
// then refused until the place remembered, never beyond it.

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
// remembered. A caller of n > 1 permits is refused only when the key's
// limit is known to hold them: the bucket must tell one that asks for
// more than it can ever grant (ErrExceedsLimit).
func (p *nextPlace) refusal(w *waiter, st *keyState) (c decision, ok bool) {
	at := p.at.Load()
	if at == 0 || w.gateDeadline() >= at || w.n > 1 && w.n > st.limit.Load() {
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
	var at int64
	switch {
	case from == 0:
		return
	case !c.Granted:
		if w.n > 1 || c.Delay <= 0 {
			// (A refusal of n permits says nothing of one permit's
			// place: it may come sooner.)
			return
		}
		at = addSat(from, c.Delay)
	case c.Next > 0:
		if !p.named.Load() {
			p.named.Store(true)
		}
		at = addSat(from, c.Next)
	case c.Delay == 0 || p.named.Load():
		p.forget() // a permit is free now
		return
	case addSat(c.answered, c.Delay) < p.at.Load():
		p.forget() // placed before it: permits were given back
		return
	default:
		return
	}
	if p.backs.Load() != 0 {
		p.forget() // a give-back under way as the answer came
		return
	}
	p.at.Store(at)
	if p.turns.Load() != mark {
		// A give-back began since the call was sent (one that begins
		// after this reading forgets the place itself).
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
//
// A refusal beyond w's wait from a bucket that places its permits (its
// grants name the next place, or w refills a lease that books ahead) is
// w's alone: the key's gate stays open for callers with longer waits,
// which the bucket can place at once, and the next place holds back the
// shorter ones (unless it was named beside a give-back of the key, which
// may have freed an earlier one: they then ask the bucket until a place
// is remembered again). Any other refusal of one permit closes the gate
// (waiter.leaveGate).
func (l *Limiter) askPlaced(w *waiter, st *keyState) decision {
	if c, ok := st.next.refusal(w, st); ok {
		return c
	}
	mark := st.next.mark()
	c := l.ask(w, st, w.n, 0)
	st.next.learn(w, &c, mark)
	c.alone = (w.ahead || st.next.named.Load()) && c.src == fromStore && c.err == nil && !c.Granted && (w.noWait() || c.Delay > w.left())
	return c
}
