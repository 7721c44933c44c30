package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/internal/pacenote"
	"github.com/headway-go/headway/throttle"
)

// process takes permits for r's record and handles it, retrying as
// configured, until it is handled or dead-lettered (finished), parked in
// the shaping topic (parked), or the partition stops or the consumer
// fails (stopped).
//
// With shaping on, a record is parked, rather than waiting or retrying,
// once its unit has held the partition for the shaping bound, and at once
// if its unit is parked; a failure of the limiter's store parks nothing
// (every unit waits alike). A record the shaping topic refuses as too
// large is handled in place, once its unit's parked records have been.
func (p *partition) process(w *worker, r *record) outcome {
	h := &handling{p: p, w: w, r: r, attempts: r.attempts, shaping: p.parks}
	if h.shaping && p.parkedUnit(r) {
		if out, done := h.park(); done {
			return out
		}
	}
	for {
		if out, done := h.attempt(); done {
			return out
		}
	}
}

// handling is one record's way through process. Its steps return done
// with the record's outcome, or not done: the record asks for a permit
// again.
type handling struct {
	p *partition
	w *worker
	r *record
	// attempts were made, those before the record was parked included.
	attempts int
	delays   int // permit timeouts or limiter failures in a row
	// waits: calls in a row whose handler's own client had no permit
	// within the call's deadline (TimeoutRetry): not reset by the
	// consumer's permit, so that their back-off grows.
	waits   int
	lastErr error
	// parkAt is when r's unit's hold of the partition ends (permitWait);
	// zero until r first asks for a permit.
	parkAt  time.Time
	shaping bool // r may be parked
}

// attempt asks for a permit and makes an attempt with it, or parks the
// record once its unit's hold of the partition is over.
func (h *handling) attempt() (outcome, bool) {
	wait, bounded, ok := h.permitWait()
	if !ok {
		return h.park()
	}
	g, now := h.p.acquire(h.w, h.r, wait)
	if g.err != nil {
		return h.noPermit(g.err, bounded)
	}
	return h.call(g, now)
}

// permitWait returns how long the record may wait for its permit:
// WithPermitWait's wait, or less when its unit's hold of the partition
// ends first (bounded); false when the hold is over and the record has
// asked once. The hold ends the shaping bound after a worker took the
// unit's first record of its run (holdSince; r itself under Unordered),
// as read at r's first ask. A record that began the hold asks at least
// once before it is parked: a worker that reaches it late (a busy
// machine) must not park a record whose permit is free.
func (h *handling) permitWait() (wait time.Duration, bounded, ok bool) {
	wait = h.p.c.cfg.maxWait
	if !h.shaping {
		return wait, false, true
	}
	first := false
	if h.parkAt.IsZero() {
		since := h.r.began
		if u := h.r.unit; u != nil {
			h.p.mu.Lock()
			since = u.holdSince
			h.p.mu.Unlock()
		}
		h.parkAt, first = since.Add(h.p.c.cfg.shapingBound), since.Equal(h.r.began)
	}
	left := time.Until(h.parkAt)
	if left <= 0 && !first {
		return 0, false, false
	}
	if left < wait {
		return max(left, 0), true, true
	}
	return wait, false, true
}

// park parks the record (done), or, when the shaping topic refuses it as
// too large, waits for its unit's parked records to be handled and goes
// on with it in place (not done).
func (h *handling) park() (out outcome, done bool) {
	if out = h.p.park(h.r, h.attempts); out != inPlace {
		return out, true
	}
	h.shaping = false
	if !h.p.waitUnparked(h.r) {
		return stopped, true
	}
	return 0, false
}

// late reports whether waiting d more would take the unit past the
// shaping bound.
func (h *handling) late(d time.Duration) bool {
	return h.shaping && !time.Now().Add(d).Before(h.parkAt)
}

// backOff waits d after a permit timeout before the record asks again:
// parked instead when d would take its unit past the shaping bound (done,
// unless the record stays in place), stopped when the partition stops
// first (done).
func (h *handling) backOff(d time.Duration) (outcome, bool) {
	if h.late(d) {
		if out, done := h.park(); done {
			return out, true
		}
	}
	if !h.p.sleep(d) {
		return stopped, true
	}
	return 0, false
}

// call makes an attempt with g's permit: the handler's call, unless the
// permit's margin passed before it (made now, the call could arrive
// beyond the bucket's guarantee: another permit is asked for).
func (h *handling) call(g grant, now time.Time) (outcome, bool) {
	p, c := h.p, h.p.c
	if g.stale() {
		c.permitsStale.Add(1)
		g.drop(c)
		return 0, false
	}
	h.delays = 0
	h.attempts++
	h.lastErr = p.call(h.w, &h.r.rec, g, now)
	g.release()
	if h.lastErr == nil {
		c.handled.Add(1)
		return finished, true
	}
	c.reportAnswer(p.soft, &h.r.rec, h.lastErr) // the adaptive rate (answer.go)
	if c.cfg.onTimeout == TimeoutRetry && errors.Is(h.lastErr, throttle.ErrTimeout) && p.soft.Err() == nil {
		// The handler's client had no permit within the call's
		// deadline: a permit timeout, no fault of the record's.
		// Back off, growing, and call again; no attempt used.
		h.attempts--
		c.permitTimeouts.Add(1)
		h.waits++
		return h.backOff(c.permitBackoff(h.waits))
	}
	return h.failed()
}

// noPermit handles err, met asking for the attempt's permit (a wait
// bounded by the unit's hold when bounded), as the policies say.
func (h *handling) noPermit(err error, bounded bool) (outcome, bool) {
	p, c, rec := h.p, h.p.c, &h.r.rec
	switch {
	case p.soft.Err() != nil:
		return stopped, true
	case errors.Is(err, throttle.ErrTimeout) && bounded:
		return h.park()
	case errors.Is(err, throttle.ErrTimeout):
		c.permitTimeouts.Add(1)
		if c.cfg.onTimeout == TimeoutRetry {
			h.delays++
			return h.backOff(c.permitBackoff(h.delays))
		}
		h.attempts++
		h.lastErr = err
	case isPanic(err):
		// WithLimiterFor panicked on this record: a failed attempt.
		h.attempts++
		h.lastErr = err
	case refusedRecord(err):
		// The record's own key or cost is refused: no wait or retry can
		// help, and no other record is at fault. It fails for good, with
		// the refusal as its cause.
		c.refused.Add(1)
		h.attempts++
		h.lastErr = fmt.Errorf("consumer: permit for record %s[%d]@%d refused: %w", rec.Topic, rec.Partition, rec.Offset, err)
		return h.exhausted()
	case errors.Is(err, throttle.ErrInvalid):
		// Waiting cannot help, and every record would meet it: the
		// limiter is misconfigured (throttle.New's mistakes).
		c.fail(fmt.Errorf("consumer: permit for record %s[%d]@%d: %w", rec.Topic, rec.Partition, rec.Offset, err))
		return stopped, true
	default:
		// The limiter's store failed. That is no fault of the record's,
		// so it uses up no attempt; back off and ask again.
		c.limiterErrors.Add(1)
		h.delays++
		d := c.permitBackoff(h.delays)
		c.log.Warn("consumer: limiter failed; retrying", "topic", p.topic, "partition", p.id, "in", d, "err", err)
		if !p.sleep(d) {
			return stopped, true
		}
		return 0, false
	}
	return h.failed()
}

// failed retries the record after its back-off, or parks it when the
// back-off would take its unit past the shaping bound, or, its attempts
// used up, finishes it as exhausted.
func (h *handling) failed() (outcome, bool) {
	p, c, rec := h.p, h.p.c, &h.r.rec
	if p.soft.Err() != nil {
		return stopped, true // no longer ours to retry; the next owner will
	}
	if h.attempts >= c.cfg.attempts {
		return h.exhausted()
	}
	d := c.backoff(h.attempts)
	if h.late(d) {
		if out, done := h.park(); done {
			return out, true // the shaping topic retries it
		}
	}
	c.log.Debug("consumer: attempt failed; retrying", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "attempt", h.attempts, "in", d, "err", h.lastErr)
	if !p.sleep(d) {
		return stopped, true // no retry: not counted
	}
	c.retried.Add(1)
	return 0, false
}

// exhausted ends the record whose attempts are used up: dead-lettered
// (finished), or, without a dead-letter topic or when its write fails,
// stopped (the consumer fails, or the partition stopped).
func (h *handling) exhausted() (outcome, bool) {
	if h.p.exhausted(&h.r.rec, h.attempts, h.lastErr) {
		return finished, true
	}
	return stopped, true
}

// unparkPoll is how often a record that could not be parked checks
// whether its unit's parked records have been handled.
const unparkPoll = 100 * time.Millisecond

// waitUnparked waits until r's unit has no record parked and not handled;
// false if the partition stopped first.
func (p *partition) waitUnparked(r *record) bool {
	for p.parkedUnit(r) {
		if !p.sleep(unparkPoll) {
			return false
		}
	}
	return true
}

// acquire waits up to wait for the concurrency slot (WithConcurrency) of
// r's record, then for its permit, and returns the grant (its release to
// call when the handler returns) and the time it returned. A zero Keyed
// (no limiter for the record) takes no permit. On an error nothing is
// held. With WithFairness, the permit w was handed with serves the
// record's first attempt, and the record waits for the others in the
// scheduler's queue, with the other tenants' records.
func (p *partition) acquire(w *worker, r *record, wait time.Duration) (g grant, now time.Time) {
	c := p.c
	if pre := w.pre; pre != nil {
		w.pre = nil
		return *pre, time.Now()
	}
	k, err := c.limiterOf(&r.rec)
	if err != nil || k.Limiter() == nil && c.cfg.slots == nil {
		return grant{k: k, release: noRelease, err: err}, time.Now()
	}
	p.waiting.Add(1)
	c.waitingRecords.Add(1)
	defer func() {
		c.waitingRecords.Add(-1)
		p.waiting.Add(-1)
	}()
	start := time.Now()
	if f := c.fair; f != nil && wait > 0 {
		if !r.classified { // a record handed without a permit
			p.mu.Lock()
			f.classify(p, r)
			p.mu.Unlock()
		}
		g = f.wait(p, r, k, wait)
		now = time.Now()
		c.permitWait.Add(int64(now.Sub(start)))
		return g, now
	}
	g = c.admit(p.soft, k, k, wait)
	now = time.Now()
	if g.asked { // a slot's wait alone is no permit wait (Stats.PermitWait)
		c.permitWait.Add(int64(now.Sub(start)))
	}
	return g, now
}

func noRelease() {}

// call runs the handler once, within the handler timeout from now. Its context
// holds the attempt's permit (g's), so that a client on the same budget
// inside the handler uses it rather than taking a second one, and, while
// the call runs, its permit waits end with the partition's (soft): a
// handler whose client waits for a permit returns when the partition is
// revoked, and the record goes to the next owner. Work the handler leaves
// behind (a goroutine on a detached context) waits as any caller does
// once the call has returned.
func (p *partition) call(w *worker, rec *kgo.Record, g grant, now time.Time) error {
	c := p.c
	call := newCallCtx(c.base, p, now, c.cfg.handlerTimeout)
	w.call.Store(call)
	if p.callsEnded.Load() {
		call.cancel(context.Canceled)
	}
	defer func() {
		call.cancel(context.Canceled)
		w.call.Store(nil)
	}()
	stop := &call.stop
	stop.soft = p.soft
	defer stop.disarm()
	ctx := g.k.ContextWithPermit(pacenote.WithUseBy(throttle.ContextWithWaitStop(call, stop), g.useBy), 1)
	// The permit is the attempt's: a call made after the handler returned
	// (from a goroutine with a context detached from call's end) takes
	// its own. Deferred after the cancel above, it runs before it. Still
	// held when the handler returns, the permit went unused
	// (Stats.PermitsUnused); held past its margin, stale too: a client
	// call made then took a permit of its own.
	defer func() {
		if g.k.Forfeit(ctx) > 0 {
			c.permitsUnused.Add(1)
			if g.stale() {
				c.permitsStale.Add(1)
			}
		}
	}()
	c.notePeakInFlight(c.inFlight.Add(1))
	defer c.inFlight.Add(-1)
	return c.safeCall(ctx, rec)
}

// safeCall calls the handler and turns a panic into a *PanicError.
func (c *Consumer) safeCall(ctx context.Context, rec *kgo.Record) error {
	err, perr := guarded(c, "consumer: handler panicked", rec, func(rec *kgo.Record) error { return c.handler(ctx, rec) })
	if perr != nil {
		return perr
	}
	return err
}

// guarded calls fn, a function of the user's, for rec; a panic in it is
// logged with msg and returned as a *PanicError, v then zero: the user's
// mistake fails the record, not the consumer.
func guarded[T any](c *Consumer, msg string, rec *kgo.Record, fn func(*kgo.Record) T) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			perr := &PanicError{Value: r, Stack: debug.Stack()}
			c.log.Error(msg, "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset,
				"panic", fmt.Sprint(r), "stack", string(perr.Stack))
			err = perr
		}
	}()
	return fn(rec), nil
}

// sleep waits d, or until soft ends (false).
func (p *partition) sleep(d time.Duration) bool { return sleepCtx(p.soft, d) }

// limiterOf returns rec's budget (WithLimiterFor), and a *PanicError if
// the function panicked.
func (c *Consumer) limiterOf(rec *kgo.Record) (throttle.Keyed, error) {
	return guarded(c, "consumer: WithLimiterFor panicked", rec, c.cfg.limiterFor)
}

// refusedRecord reports whether err, from the limiter or the
// concurrency cap, refuses the record itself: its key (too long for the
// bucket) or its cost (more than the budget can ever grant). Other
// records go on.
func refusedRecord(err error) bool {
	return errors.Is(err, throttle.ErrInvalidKey) || errors.Is(err, throttle.ErrExceedsLimit)
}

func isPanic(err error) bool {
	var perr *PanicError
	return errors.As(err, &perr)
}
