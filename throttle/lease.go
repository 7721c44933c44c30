package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Leasing configures a Limiter's leasing ([WithLeasing]): the Limiter takes
// permits from its bucket in batches (leases), one per key, and hands them
// out from memory, so that most decisions cost no round trip to the
// shared store. Each instance of a fleet leases from the fleet's shared
// bucket on its own.
//
// A permit is served from the key's lease while the lease holds enough
// unexpired permits: one compare-and-swap, no lock, no call. When the
// lease runs dry, one caller of the key refills it with one call to the
// bucket that also covers its own permits (the others wait for it); a
// refusal is handled as any refusal of the bucket. Each batch is what the
// key's measured demand uses in Horizon, at most four times the last
// batch (so a new key starts with just its own permits), at most Share of
// the bucket's limit (Decision.Limit; 16 permits when it reports none),
// at most what the demand uses in TTL (when set), and, for a lease that
// ends with a period, at most what the demand can use before the period
// ends. A lease is not handed back: what it holds
// when demand stops expires with it (at most about a Horizon's worth).
//
// A lease is valid until the earlier of t0 + Reset of the grant and t0 +
// TTL, t0 being this instance's clock just before the refill was sent
// (before the bucket decided). A bucket whose permits have a time and a
// margin (Decision.Delay and Decision.Margin: package bucket's TokenBucket
// and Budget) gives a batch one time: the refill asks for it within the
// refilling caller's wait, as a caller without leasing is placed, so the
// bucket paces the batches; the batch's permits are handed over at that
// time (a caller sleeps until it; one that leaves first puts its permit
// back) and only until its margin after it. A caller whose wait ends
// before that time, or who wants several permits at one time, asks the
// bucket for its own, as without leasing. So every leased permit is used
// within the margin of its time, and the bucket's guarantee holds for the
// calls exactly as without leasing. Once the bucket places a batch ahead
// (the fleet is at its limit), a batch would be a burst at one time: the
// callers the lease cannot serve then ask the bucket each for their own
// permits (the bucket shares round trips among concurrent takes), until
// one is free at once again; meanwhile a caller whose wait ends before the
// bucket's next place, as its last refusal or grant named it
// (Decision.Next), is refused from memory. For buckets whose Reset is the
// end of their period (fixed window, counter), every permit is handed out
// within the period it was taken in, and the bucket's guarantee holds
// exactly. For GCRA and [Local] (Reset is the time until full), a permit
// held for h shifts its grant by up to h: "≤ burst + rate·t in any span t"
// becomes "≤ burst + rate·(t+h)"; set TTL to bound h. For a sliding log of
// window W, TTL h keeps at most limit in any window of W−h. A bucket that
// reports no Reset, with no TTL, leases nothing.
//
// With the failure policy: permits leased before an outage are the
// store's already, and are handed out during it first (they owe the store
// nothing); after an outage, a lease's batch counts against the key's
// first-back cap, so a lease never holds permits the cap would not let
// out. A pause ([Limiter.Report] with a retry time) drops the key's lease
// at once.
type Leasing struct {
	// Horizon is how far ahead the Limiter leases (see above). Default
	// (0): 50 ms. Longer means fewer round trips and more permits held per
	// instance (more left unused when a period ends); must not be negative.
	Horizon time.Duration
	// TTL bounds how long leased permits stay valid. Default (0): no
	// bound but the bucket's Decision.Reset, right for token buckets,
	// fixed windows and counters. Set it for GCRA, Local and sliding-log
	// buckets (see above); must not be negative.
	TTL time.Duration
	// Share caps a batch at this fraction of the bucket's limit. A fleet
	// of k busy instances leaves at most about k·Share·limit unused at a
	// period's end. Default (0): 0.1; must be in (0, 1] otherwise.
	Share float64
}

// WithLeasing makes a Limiter lease permits from its bucket in batches
// and hand them out from memory (see [Leasing]); a zero Leasing has the
// defaults. A bad Leasing makes every call of the Limiter fail with an
// error matching [ErrInvalid] that names the field.
func WithLeasing(c Leasing) LimiterOption {
	return limiterOnly(func(cfg *config) { cfg.leasing = &c })
}

func (c Leasing) validate() error {
	switch {
	case c.Horizon < 0:
		return invalid("throttle: WithLeasing", "Horizon", c.Horizon, "must be positive, or 0 for the default 50ms")
	case c.TTL < 0:
		return invalid("throttle: WithLeasing", "TTL", c.TTL, "must be positive, or 0 for no bound but the bucket's Reset")
	case c.Share != 0 && !(c.Share > 0 && c.Share <= 1):
		return invalid("throttle: WithLeasing", "Share", c.Share, "must be in (0, 1], or 0 for the default 0.1")
	}
	return nil
}

// leaseConfig is a valid Leasing with its defaults, in ns.
type leaseConfig struct {
	horizon, ttl int64
	share        float64
}

const (
	defaultLeaseHorizon = 50 * time.Millisecond
	defaultLeaseShare   = 0.1
	// leaseCapUnknown caps batches when the bucket reports no limit.
	leaseCapUnknown = 16
	// leaseGrowth bounds how much a batch may grow from one refill to the next.
	leaseGrowth = 4
)

func newLeaseConfig(c Leasing) *leaseConfig {
	lc := &leaseConfig{horizon: int64(c.Horizon), ttl: int64(c.TTL), share: c.Share}
	if lc.horizon == 0 {
		lc.horizon = int64(defaultLeaseHorizon)
	}
	if lc.share == 0 {
		lc.share = defaultLeaseShare
	}
	return lc
}

// lease is a key's lease and its demand. Lock rule: cur's batch is
// taken from with atomics and dryUntil is an atomic, both without a lock;
// the refill and the demand are under mu.
type lease struct {
	// cur is the current batch; nil before the first refill.
	cur atomic.Pointer[leaseBatch]
	// dryUntil: before this time the bucket refused (or a pause holds the
	// key): every call is refused from memory until then, so that the
	// callers that waited on a refill the bucket refused do not each ask
	// it again.
	dryUntil atomic.Int64
	// atLimit: the bucket placed the key's last batch ahead (askAtLimit).
	atLimit atomic.Bool

	// Under mu, which guards nothing else:
	mu       sync.Mutex
	fill     *leaseFill  // the refill in progress, if any
	rate     float64     // measured demand, permits per ns
	measured *leaseBatch // the batch rate was measured on
	limit    int64       // Decision.Limit last seen; 0 unknown
	noLease  bool        // the bucket gives no Reset and no TTL is set
	// ahead: the bucket's batches have a margin: a refill asks for the
	// batch's place within the refiller's wait (waiter.ahead).
	ahead  bool
	tooBig int64 // smallest batch the bucket refused as too big; 0 none
}

// leaseBatch is one batch. Only left changes after it is published.
type leaseBatch struct {
	left     atomic.Int64
	size     int64 // permits fetched, the refiller's own included
	start    int64 // t0 on the Limiter's time base
	from     int64 // the batch's place: its permits may not be used before
	placed   bool  // the bucket placed it after its answer: the key is at its limit
	expires  int64
	limit    int64 // Decision.Limit
	periodic bool  // expires with the bucket's period (Reset)
	margin   int64 // expires with its permits' margin (Decision.Margin), ns; 0 none
}

// leaseFill is a refill in progress, for the callers that wait on it.
type leaseFill struct{ done chan struct{} }

// granted is the Decision of a grant from b at now, left permits left in
// it: with the Delay until b's place, and, for a batch that lives its
// permits' margin, how long after it they may be used (Margin), so that a
// holder of one (the consumer's scheduler, a handler's held permit) does
// not send it later.
func (b *leaseBatch) granted(left, now int64) Decision {
	d := Decision{Granted: true, Limit: b.limit, Remaining: left, Reset: time.Duration(max(b.expires-now, 0))}
	at := max(now, b.from)
	d.Delay = time.Duration(at - now)
	if b.margin > 0 {
		d.Margin = time.Duration(max(b.expires-at, 1))
	}
	return d
}

// back returns n permits of b that their caller leaves unused, while they
// can still be used; it reports whether it did.
func (b *leaseBatch) back(n, now int64) bool {
	if now >= b.expires {
		return false
	}
	b.left.Add(n)
	return true
}

// holds reports whether the lease holds valid permits, or a refusal, at
// now.
func (ls *lease) holds(now int64) bool {
	if now < ls.dryUntil.Load() {
		return true
	}
	b := ls.cur.Load()
	return b != nil && now < b.expires && b.left.Load() > 0
}

// filling reports whether a refill of the lease is in progress.
func (ls *lease) filling() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.fill != nil
}

// dry refuses the key from memory until until.
func (ls *lease) dry(until int64) { atLeast(&ls.dryUntil, until) }

// pause holds the key until until and drops what the lease holds.
func (ls *lease) pause(until int64) {
	ls.dry(until)
	if b := ls.cur.Load(); b != nil {
		b.left.Store(0)
	}
}

// measure records the key's demand on the batch prev, once per batch: the
// permits used from it over the time since it was taken. The caller holds
// ls.mu.
func (ls *lease) measure(prev *leaseBatch, now int64) {
	if prev == nil || ls.measured == prev {
		return
	}
	ls.measured = prev
	used := max(prev.size-max(prev.left.Load(), 0), 0)
	ls.rate = float64(used) / float64(max(now-prev.start, 1))
}

// want is the size of the next batch beyond the caller's own need permits.
// The caller holds ls.mu.
func (ls *lease) want(c *leaseConfig, prev *leaseBatch, need, now int64) int64 {
	if prev == nil || ls.noLease || prev.placed {
		// Start small: the first refill fetches only its own. And at the
		// limit (placed), each caller's permit has a place of its own: a
		// batch's permits would share one, a burst.
		return 0
	}
	w := min(ls.rate*float64(c.horizon), float64(leaseGrowth*max(prev.size, 1)))
	periodLeft := int64(0)
	if prev.periodic && now < prev.expires {
		// The next batch most likely belongs to the same period.
		periodLeft = prev.expires - now
	}
	// The next batch lives at most until the period's end, its permits'
	// margin or TTL: take no more than the demand uses in that, or the
	// rest expires unused, lost to the whole fleet.
	for _, life := range []int64{periodLeft, prev.margin, c.ttl} {
		if life > 0 {
			w = min(w, math.Ceil(ls.rate*float64(life)))
		}
	}
	capN := int64(leaseCapUnknown)
	if ls.limit > 0 {
		capN = max(int64(c.share*float64(ls.limit)), 1)
	}
	if ls.tooBig > 0 {
		capN = min(capN, ls.tooBig-1-need)
	}
	return max(min(int64(w), capN), 0)
}

// leased is the decision stage with leasing: w's permits from st's lease,
// or a refill that fetches them with the next batch. One caller per key
// refills; the others wait for it (within their wait), then try the new
// lease.
func (l *Limiter) leased(w *waiter, st *keyState) decision {
	ls, n := &st.lease, w.n
	c, ok, later := w.fromLease(ls, l.tb.now())
	switch {
	case ok:
		return c
	case later || ls.atLimit.Load():
		return l.askAtLimit(w, st)
	}
	for pass := 0; ; pass++ {
		if pass > 0 && w.measured && w.left() <= 0 {
			// Each pass bounds its store call, or its wait on another
			// caller's refill, by what is left of the wait.
			return decision{n: n, err: w.refillRanOut()}
		}
		st.lease.mu.Lock()
		now := l.tb.now()
		c, ok, later := w.fromLease(ls, now)
		switch {
		case ok:
			st.lease.mu.Unlock()
			return c
		case later || ls.atLimit.Load() || ls.ahead && n > 1:
			// The lease's batch comes after the caller's wait, or the key
			// is at its limit, or the caller wants several permits at one
			// time (held ones of the last batch would be sent at the next
			// batch's, past their margin): it asks for its own place.
			st.lease.mu.Unlock()
			return l.askAtLimit(w, st)
		}
		if f := ls.fill; f != nil {
			st.lease.mu.Unlock()
			if !l.caps.immediate && l.outage.since.Load() != 0 {
				// The store fails, and this refill is probing it: decide
				// by the failure policy rather than wait for the probe.
				c := decision{src: fromPolicy, n: n}
				c.Decision, c.err = l.degrade(w, st, n, l.outage.err(), false)
				return c
			}
			if err := w.waitFill(f); err != nil {
				return decision{n: n, err: err}
			}
			continue // granted, refused or failed: try the lease (or the store) again
		}
		if ls.limit > 0 && n > ls.limit {
			// More than a lease ever holds (a bucket's burst may be above
			// its limit per interval): the bucket decides for the n
			// alone, as without leasing, and says if it can never grant
			// them.
			st.lease.mu.Unlock()
			return l.askPlaced(w, st)
		}
		// This caller refills: it uses what the lease still holds and
		// fetches the rest.
		f := &leaseFill{done: make(chan struct{})}
		ls.fill = f
		prev := ls.cur.Load()
		ls.measure(prev, now)
		var held int64
		if prev != nil && now < prev.expires {
			held = prev.left.Swap(0) // < n, or serve would have succeeded
		}
		want := ls.want(l.leasing, prev, n-held, now)
		w.ahead = ls.ahead
		st.lease.mu.Unlock()

		c, again := l.refill(w, st, prev, held, want)
		w.ahead = false

		st.lease.mu.Lock()
		ls.fill = nil
		close(f.done)
		st.lease.mu.Unlock()
		if !again {
			return c
		}
	}
}

// askAtLimit asks the bucket for w's permits alone, placed within w's
// wait, as a caller without leasing is (askPlaced; see Leasing): at the
// limit, a batch's permits would share one place, a burst. A grant free
// at once ends the key's time at its limit: the next refill leases again.
func (l *Limiter) askAtLimit(w *waiter, st *keyState) decision {
	w.ahead = true
	c := l.askPlaced(w, st)
	w.ahead = false
	if c.src == fromStore && c.err == nil && c.Granted && c.Delay == 0 {
		st.lease.atLimit.Store(false)
	}
	return c
}

// fromLease is w's decision from the key's lease ls at now, if it has one
// (ok): a grant from its batch, or a refusal while the key is dry. later
// reports a batch whose time comes after the end of w's wait (now, for a
// wait of none), which serves w nothing.
func (w *waiter) fromLease(ls *lease, now int64) (c decision, ok, later bool) {
	c = decision{src: fromLease, n: w.n, answered: now}
	if dry := ls.dryUntil.Load(); now < dry {
		c.Delay = time.Duration(dry - now)
		return c, true, false
	}
	b := ls.cur.Load()
	if b == nil || now >= b.expires || b.left.Load() < w.n {
		return decision{}, false, false
	}
	if b.from > max(w.gateDeadline(), now) {
		return decision{}, false, true
	}
	left, ok := spend(&b.left, w.n)
	if ok {
		c.Decision, c.batch = b.granted(left, now), b
	}
	return c, ok, false
}

// refillRanOut is the ErrTimeout of a wait that ran out while its key's
// lease was refilled, wrapping context.DeadlineExceeded if ctx's set it.
func (w *waiter) refillRanOut() error {
	err := fmt.Errorf("%w: the wait ran out while the lease of key %q was being refilled", ErrTimeout, w.key)
	if w.tb.ctxBound {
		err = fmt.Errorf("%w (%w)", err, context.DeadlineExceeded)
	}
	return err
}

// waitFill waits for another caller's refill f, at most until the end of
// w's wait (refillBound).
func (w *waiter) waitFill(f *leaseFill) error {
	var end <-chan time.Time
	if d, ok := w.refillBound(); ok {
		t := w.l.cfg.clock.NewTimer(d)
		defer t.Stop()
		end = t.Chan()
	}
	select {
	case <-f.done:
		return nil
	case <-w.ctx.Done():
		return fmt.Errorf("throttle: waiting for the lease of key %q to be refilled: %w", w.key, w.ctx.Err())
	case <-end:
		return w.refillRanOut()
	}
}

// refill takes w's permits but the held ones, and want more, from the
// bucket and publishes the new batch. held permits of prev are the
// caller's too; they go back into prev if the bucket refuses.
//
// Held permits belong to prev's period and may be handed out only before
// prev expires. When the new batch's permits may be used only after that
// (the fetch returned late, the bucket may have begun a new period
// meanwhile, or it placed the batch later), they are dropped, everything
// fetched goes into the new batch, and again is true: the caller must take
// its permits anew, all from the new batch. Otherwise a weighted take
// across a period's end would hand out old permits in a period that also
// grants its full limit.
//
// When the lease books ahead (w.ahead), a refusal beyond w's wait is this
// caller's alone (beyondWait) and does not dry the key.
func (l *Limiter) refill(w *waiter, st *keyState, prev *leaseBatch, held, want int64) (c decision, again bool) {
	ls, need := &st.lease, w.n-held
	restore := func() {
		if held > 0 {
			prev.left.Add(held)
		}
	}
	c, t0 := l.askBatch(w, st, need, want)
	if c.err != nil {
		restore()
		return c, false
	}
	t1 := c.answered // the bucket's Delay and Margin count from it
	if t1 == 0 {
		t1 = l.tb.now()
	}
	placed := w.ahead && c.src == fromStore && c.Granted && c.Margin > 0
	at := t1
	if placed {
		at = addSat(t1, c.Delay)
	}
	expired := held > 0 && at >= prev.expires
	switch {
	case c.src == fromPolicy:
		// The store failed: the failure policy decided for need permits;
		// with the held ones (the store's already), the caller has n.
		if !c.Granted || expired {
			restore()
			return c, expired && c.Granted
		}
		return c, false
	case c.Granted && c.Delay > 0 && !placed:
		// A reservation, though none was asked for: treat it as "not yet".
		l.giveBack(w.ctx, w.giveBackBound(), st, st.key, need+c.got, nil, c.Decision)
		c.Granted = false
	}
	if !c.Granted {
		restore()
		if w.beyondWait(c) {
			ls.atLimit.Store(true)
			return decision{n: w.n, err: w.tb.err(c.Delay)}, false
		}
		if c.Delay > 0 {
			ls.dry(addSat(t1, c.Delay))
		}
		c.Decision = Decision{Delay: c.Delay, Limit: c.Limit, Remaining: max(c.Remaining, 0), Reset: c.Reset}
		return c, false
	}
	b, life := l.leasing.batch(c.Decision, need+c.got, t0, t1, at)
	if expired {
		b.left.Store(need + c.got) // the held permits expired: the caller's come from here
	} else {
		b.left.Store(c.got)
	}
	st.lease.mu.Lock()
	ls.limit = c.Limit
	ls.noLease = life == 0
	ls.ahead = b.margin > 0
	if b.placed {
		ls.atLimit.Store(true)
	}
	extra := int64(0)
	if life == 0 || ls.dryUntil.Load() > t1 {
		// Nothing may be leased, or paused meanwhile: the caller keeps its
		// own permits, the rest goes back. When the held ones expired, all
		// n of the caller's come from this batch, or it asks again (and
		// gives everything back).
		extra = b.left.Swap(0)
		if n := need + held; expired && extra >= n {
			extra, expired = extra-n, false
		}
	}
	ls.cur.Store(b)
	st.lease.mu.Unlock()
	if extra > 0 {
		l.giveBack(w.ctx, w.giveBackBound(), st, st.key, extra, nil, Decision{})
	}
	if expired {
		return decision{}, true
	}
	c.Decision, c.answered, c.batch = b.granted(b.left.Load(), t1), t1, b
	return c, false
}

// askBatch asks the bucket for w's need permits and want more for st's
// lease; t0 is when the call that answered was sent. A batch too big for
// what is left (or for the bucket) must not cost the caller its own
// permits: it asks again for what can be had.
func (l *Limiter) askBatch(w *waiter, st *keyState, need, want int64) (c decision, t0 int64) {
	ls := &st.lease
	t0 = l.tb.now()
	c = l.ask(w, st, need, want)
	if want <= 0 || c.src != fromStore {
		return c, t0
	}
	retry := int64(0)
	switch {
	case w.beyondWait(c):
		// No place within the wait for the batch: perhaps for the
		// caller's own permits.
		retry = need
	case errors.Is(c.err, ErrExceedsLimit):
		retry = need
		ls.mu.Lock()
		if ls.tooBig == 0 || need+want < ls.tooBig {
			ls.tooBig = need + want // the bucket's burst is below its Limit
		}
		ls.mu.Unlock()
	case c.err == nil && !c.Granted && c.Remaining >= need && c.Remaining < need+want:
		retry = c.Remaining
	case c.err == nil && !c.Granted && c.Remaining < 0:
		retry = need
	}
	if retry <= 0 {
		return c, t0
	}
	if w.measured && w.left() <= 0 {
		return decision{n: need, err: w.refillRanOut()}, t0
	}
	t0 = l.tb.now()
	return l.ask(w, st, need, retry-need), t0
}

// beyondWait reports that c, the answer to a refill that booked ahead
// within w's wait, refused because the bucket's next place comes after the
// wait's end: a refusal of this caller alone, not of the key (a pause's
// refusal names a time within the wait, as any the bucket could place).
func (w *waiter) beyondWait(c decision) bool {
	return w.ahead && c.src == fromStore && c.err == nil && !c.Granted && (w.noWait() || c.Delay > w.left())
}

// batch is a new batch of size permits granted by d, the bucket's answer
// to a call sent at t0 that came back at t1, placed at at (t1 + d's Delay;
// t1 when the batch is free at once), and life, how long it is valid (0:
// it may not be leased): the TTL, or d's Reset when sooner (the batch is
// then periodic), or d's Margin counted from its place (bounded by the
// TTL). The caller stores how many of its permits are left.
func (lc *leaseConfig) batch(d Decision, size, t0, t1, at int64) (b *leaseBatch, life int64) {
	life, periodic, margin := lc.ttl, false, int64(0)
	switch r := int64(d.Reset); {
	case d.Margin > 0:
		margin, life = int64(d.Margin), int64(d.Margin)
		if lc.ttl > 0 {
			life = min(margin, lc.ttl)
		}
	case r > 0 && (life == 0 || r < life):
		life, periodic = r, true
	}
	from := t0 // a margin counts from the place
	if margin > 0 {
		from = at
	}
	return &leaseBatch{size: size, start: t0, from: from, placed: from > t1, expires: addSat(from, time.Duration(life)), limit: d.Limit, periodic: periodic, margin: margin}, life
}
