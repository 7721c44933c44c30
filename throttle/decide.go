package throttle

import (
	"context"
	"errors"
	"time"
)

// The decision stage: one round's decision for the caller's permits, from
// the key's lease (lease.go), the bucket (unless the key's next place
// refuses the caller from memory, place.go), or, while the bucket's store
// fails, the failure policy (failure.go, degraded.go); for a Cost, from its
// CostBucket (cost.go). The decision is one value (decision) that the
// bucket call's answer becomes and that the stages after it read and
// refine in order: the lease's refill, FailLocal's accounting
// (afterShared), the gate, the outcome (wait.go).

// source says where a decision came from.
type source uint8

const (
	fromStore  source = iota // the bucket decided (or the key's first-back cap)
	fromLease                // the key's lease, in memory
	fromPolicy               // the failure policy: the store failed
	fromHeld                 // the caller's held permits (ContextWithPermit)
)

// decision is one round's decision in the making.
type decision struct {
	Decision        // the answer, as the stages refined it
	src      source // where it came from
	err      error  // why there is none

	// n permits were asked for the caller and want more for the key's
	// lease, all or nothing; got is how many of want were granted (want
	// may be cut to the first-back cap's room).
	n, want, got int64
	// FailLocal's accounting of the store call: when it was sent, the
	// debt it carried, and the end of the first-back cap's period it
	// reserved n+want in (0: none).
	sent, debt, reserved int64
	// answered is when the bucket's answer came back, or when the key's
	// lease served the grant (0: neither), from which a grant's Delay and
	// Margin count.
	answered int64
	// batch is the lease's batch the grant is in, which takes back the
	// permits of a caller that leaves them unused (nil: none).
	batch *leaseBatch
	// The gate's reading of a refusal (waiter.leaveGate): ask again in
	// retryIn; shared: the refusal holds for every caller of the key;
	// alone: it holds for this caller's wait only (refused beyond its
	// wait, askPlaced), never shared.
	retryIn time.Duration
	shared  bool
	alone   bool
}

// decide is the decision stage of w's round for st's key.
func (w *waiter) decide(st *keyState) decision {
	l := w.l
	switch {
	case w.cost != nil:
		return l.decideCost(w)
	case l.leasing != nil:
		return l.leased(w, st)
	}
	return l.askPlaced(w, st)
}

// ask asks the bucket for n permits of st's key, and up to want more for
// the key's lease, all or nothing, within w's wait. While the store fails,
// the failure policy decides for the n permits instead (fromPolicy).
func (l *Limiter) ask(w *waiter, st *keyState, n, want int64) decision {
	c := decision{n: n, want: want}
	if l.caps.immediate {
		c.Decision, c.err = l.take(w.ctx, st.key, n+want, w.bookAhead(w.left()))
		c.answered = l.tb.now()
		if c.err == nil {
			st.noteLimit(c.Decision)
			if c.Granted {
				c.got = want
			}
		}
		return c
	}
	o := &l.outage
	probe := false
	if o.since.Load() != 0 {
		if !o.probing.CompareAndSwap(false, true) {
			// Someone is asking the store: decide without it.
			c.src = fromPolicy
			c.Decision, c.err = l.degrade(w, st, n, o.err(), false)
			return c
		}
		probe = true
		defer o.probing.Store(false)
	}
	if l.cfg.policy == FailLocal && st.out.faulted.Load() {
		// (A probe is never capped: it must find out whether the store
		// answers again. Its lease's batch is, as a cap would be.)
		refusal, refused, until, fit := st.out.reserveRecovery(n, want, l.tb.now(), probe)
		if refused {
			c.Decision = refusal
			return c
		}
		c.reserved, c.want = until, fit
	}
	c.sent = l.tb.now()
	if l.cfg.policy == FailLocal && st.out.faulted.Load() {
		// The call (the probe, or the key's first call after it) carries
		// the key's local grants not yet charged (claimDebt).
		st.out.mu.Lock()
		c.debt = st.out.claimDebt(c.sent)
		st.out.mu.Unlock()
	}
	cut, err := c.call(w, st)
	c.answered = l.tb.now()
	if err == nil {
		if o.end() {
			l.cfg.logger.Info("throttle: bucket store answers again; shared limit resumed", "policy", l.cfg.policy.String())
		}
		if c.Granted {
			c.got = c.want
		}
		st.noteLimit(c.Decision)
		if l.cfg.policy == FailLocal && (st.out.faulted.Load() || c.Reset > 0 && l.caps.fallbacker != nil) {
			l.afterShared(w, st, &c)
		}
		return c
	}
	c.unreserve(st)
	w.storeFailure(&c, st, cut, probe, err)
	return c
}

// call is c's store call for st's key, bounded by the deadline of w: Take of n+want
// and the debt c carries (apart, if the bucket never grants that much at
// once). It sets c's Decision and returns the store's error.
func (c *decision) call(w *waiter, st *keyState) (storeCut, error) {
	l := w.l
	return w.callStore(func(ctx context.Context, reserve time.Duration) error {
		var err error
		c.Decision, err = l.take(ctx, st.key, c.n+c.want+c.debt, reserve)
		if c.debt > 0 && errors.Is(err, ErrExceedsLimit) {
			st.out.mu.Lock()
			st.out.releaseDebt()
			st.out.mu.Unlock()
			c.debt = 0 // more than the bucket grants at once: settle it apart
			c.Decision, err = l.take(ctx, st.key, c.n+c.want, reserve)
		}
		return err
	})
}

// unreserve gives back, after a failed store call, the debt c carried and
// the first-back cap's room it reserved, to st's key.
func (c *decision) unreserve(st *keyState) {
	if c.debt == 0 && c.reserved == 0 {
		return
	}
	st.out.mu.Lock()
	if c.debt > 0 {
		st.out.releaseDebt()
	}
	if c.reserved != 0 && st.out.recovery != nil {
		st.out.recovery.unreserve(c.n+c.want, c.reserved)
	}
	st.out.mu.Unlock()
}

// noteLimit records the key's limit a shared decision reported.
func (st *keyState) noteLimit(d Decision) {
	if d.Limit > 0 && st.limit.Load() != d.Limit {
		st.limit.Store(d.Limit)
	}
}

// reserveRecovery reserves n permits, and up to want more, of the key's
// room in its first shared period after an outage, before its store call
// at now. It returns the period's end when it reserved (until, 0 when no
// cap applies) and the want that fits, or a refusal until the period's
// end when the room is spent. A probe reserves nothing; the key's first
// call back (no cap yet, a local share owing) gets a want that fits the
// cap it will start: the share less what the key owes and n.
func (o *outageKey) reserveRecovery(n, want, now int64, probe bool) (refusal Decision, refused bool, until, fit int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	rc := o.recovery
	if rc == nil || probe {
		if k := o.local; k != nil && want > 0 {
			want = min(want, max(k.share-k.owed(now)-n, 0))
		}
		return Decision{}, false, 0, want
	}
	refusal, refused, until = rc.reserve(n, now)
	switch {
	case refused:
		return refusal, true, 0, 0
	case until == 0: // the cap has ended
		o.recovery = nil
		if o.local == nil {
			o.faulted.Store(false)
		}
		return Decision{}, false, 0, want
	}
	fit = min(want, rc.room)
	rc.room -= fit
	return Decision{}, false, until, fit
}

// afterShared does FailLocal's accounting after a shared decision c of
// st's key: the ledger notes the period, a carried debt is settled, what
// is still owed is taken from the store (within w's wait), a key that
// granted locally in the outage is capped for its first shared period,
// and what c reserved of the cap is given back if c granted nothing.
func (l *Limiter) afterShared(w *waiter, st *keyState, c *decision) {
	d := c.Decision
	if d.Reset > 0 {
		// The period ends Reset after the store decided, which was after
		// the call was sent: counted from then, as a lease's batch is,
		// the ledger's end is never later than the store's, however long
		// the answer took to come back.
		end, tol := addSat(c.sent, d.Reset), l.interval/2
		if !st.out.ledger.note(end, d.Remaining, tol) {
			st.out.mu.Lock()
			st.out.ledger.start(end, d.Remaining, tol)
			st.out.mu.Unlock()
		}
	}
	if !st.out.faulted.Load() {
		return
	}
	now := l.tb.now()
	st.out.mu.Lock()
	if c.reserved != 0 && !d.Granted && st.out.recovery != nil {
		st.out.recovery.unreserve(c.n+c.want, c.reserved)
	}
	k := st.out.local
	var owed, share, interval int64
	if k != nil {
		owed, share, interval = k.owed(now), k.share, k.interval
	}
	switch {
	case c.debt > 0 && d.Granted:
		st.out.settled() // the debt came with the call's permits
	case c.debt > 0:
		st.out.releaseDebt()
	}
	still := st.out.takeOwed(now) // all of it, or what was granted locally after the claim
	if k != nil && (st.out.recovery == nil || !st.out.recovery.holds(now)) {
		took := int64(0) // from the store: n and a lease's batch
		if d.Granted {
			took = c.n + c.got
		}
		st.out.recovery = newRecoveryCap(d, now, share, owed, took, interval)
	}
	if st.out.local == nil && st.out.recovery == nil {
		st.out.faulted.Store(false)
	}
	st.out.mu.Unlock()
	if still > 0 {
		l.settle(w, st.key, still)
	}
}

// take asks the bucket once, reporting the call to the observer.
func (l *Limiter) take(ctx context.Context, key string, n int64, maxWait time.Duration) (Decision, error) {
	o := l.cfg.observer
	if o == nil {
		return l.bucket.Take(ctx, key, n, maxWait)
	}
	start := l.tb.now()
	d, err := l.bucket.Take(ctx, key, n, maxWait)
	o.BucketCall(key, d, time.Duration(l.tb.now()-start), err)
	return d, err
}
