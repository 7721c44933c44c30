package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/internal/capability"
	"github.com/headway-go/headway/throttle"
)

// process takes permits for s's record and handles it, retrying as
// configured, until it is handled or dead-lettered (finished), parked in
// the shaping topic (parked), or the partition stops or the consumer
// fails (stopped).
//
// With shaping on, a record is parked, rather than waiting or retrying,
// once its unit has held the partition for the shaping bound, and at once
// if its unit is parked; a failure of the limiter's store parks nothing
// (every unit waits alike). A record the shaping topic refuses as too
// large is handled in place, once its unit's parked records have been.
func (p *partition) process(w *worker, s *slot) outcome {
	c := p.c
	rec := &s.rec
	var (
		attempts = s.attempts // made before the record was parked
		delays   int          // permit timeouts or limiter failures in a row
		// waits: calls in a row whose handler's own client had no permit
		// within the call's deadline (TimeoutRetry): not reset by the
		// consumer's permit, so that their back-off grows.
		waits   int
		lastErr error
		parkAt  time.Time
		shaping = p.parks // s may be parked
		// first: s began its unit's hold and has not asked for a permit
		// yet. It asks at least once before it is parked: a worker that
		// reaches s late (a busy machine) must not park a record whose
		// permit is free.
		first bool
	)
	// park parks s (done), or, when the shaping topic refuses it as too
	// large, waits for its unit's parked records to be handled and goes
	// on with s in place (not done).
	park := func() (out outcome, done bool) {
		if out = p.park(s, attempts); out != inPlace {
			return out, true
		}
		shaping = false
		if !p.waitUnparked(s) {
			return stopped, true
		}
		return 0, false
	}
	if shaping && p.parkedUnit(s) {
		if out, done := park(); done {
			return out
		}
	}
	if shaping {
		parkAt, first = p.holdDeadline(s)
	}
	// late reports whether waiting d more would take the unit past the
	// shaping bound.
	late := func(d time.Duration) bool { return shaping && !time.Now().Add(d).Before(parkAt) }
	// backOff waits d after a permit timeout before the record asks
	// again: parked instead when d would take its unit past the shaping
	// bound (done, unless the record stays in place), stopped when the
	// partition stops first (done).
	backOff := func(d time.Duration) (out outcome, done bool) {
		if late(d) {
			if out, done := park(); done {
				return out, true
			}
		}
		if !p.sleep(d) {
			return stopped, true
		}
		return 0, false
	}
	for {
		wait, bounded := c.cfg.maxWait, false
		if shaping {
			left := time.Until(parkAt)
			if left <= 0 && !first {
				if out, done := park(); done {
					return out
				}
				continue
			}
			if left < wait {
				wait, bounded = max(left, 0), true
			}
		}
		first = false
		k, release, now, useBy, err := p.acquire(w, s, wait)
		switch {
		case err == nil && !useBy.IsZero() && capability.KeyedLimiter(k).Clock().Now().After(useBy):
			// The permit's margin passed before its call: made now, the
			// call could arrive beyond the bucket's guarantee. Another.
			release()
			c.permitsStale.Add(1)
			c.permitsUnused.Add(1)
			continue
		case err == nil:
			delays = 0
			attempts++
			lastErr = p.call(w, rec, k, now, useBy)
			release()
			if lastErr == nil {
				c.handled.Add(1)
				return finished
			}
			c.reportAnswer(p.soft, rec, lastErr) // the adaptive rate (answer.go)
			if c.cfg.onTimeout == TimeoutRetry && errors.Is(lastErr, throttle.ErrTimeout) && p.soft.Err() == nil {
				// The handler's client had no permit within the call's
				// deadline: a permit timeout, no fault of the record's.
				// Back off, growing, and call again; no attempt used.
				attempts--
				c.permitTimeouts.Add(1)
				waits++
				if out, done := backOff(c.permitBackoff(waits)); done {
					return out
				}
				continue
			}
		case p.soft.Err() != nil:
			return stopped
		case errors.Is(err, throttle.ErrTimeout) && bounded:
			if out, done := park(); done {
				return out
			}
			continue
		case errors.Is(err, throttle.ErrTimeout):
			c.permitTimeouts.Add(1)
			if c.cfg.onTimeout == TimeoutRetry {
				delays++
				if out, done := backOff(c.permitBackoff(delays)); done {
					return out
				}
				continue
			}
			attempts++
			lastErr = err
		case isPanic(err):
			// WithLimiterFor panicked on this record: a failed attempt.
			attempts++
			lastErr = err
		case refusedRecord(err):
			// The record's own key or cost is refused: no wait or
			// retry can help, and no other record is at fault. It
			// fails for good, with the refusal as its cause.
			c.refused.Add(1)
			attempts++
			lastErr = fmt.Errorf("consumer: permit for record %s[%d]@%d refused: %w", rec.Topic, rec.Partition, rec.Offset, err)
			if p.exhausted(rec, attempts, lastErr) {
				return finished
			}
			return stopped
		case errors.Is(err, throttle.ErrInvalid):
			// Waiting cannot help, and every record would meet it:
			// the limiter is misconfigured (throttle.New's mistakes).
			c.fail(fmt.Errorf("consumer: permit for record %s[%d]@%d: %w", rec.Topic, rec.Partition, rec.Offset, err))
			return stopped
		default:
			// The limiter's store failed. That is no fault of the record's, so it uses up no
			// attempt; back off and ask again.
			c.limiterErrors.Add(1)
			delays++
			d := c.permitBackoff(delays)
			c.log.Warn("consumer: limiter failed; retrying", "topic", p.topic, "partition", p.id, "in", d, "err", err)
			if !p.sleep(d) {
				return stopped
			}
			continue
		}

		// The attempt failed.
		if p.soft.Err() != nil {
			return stopped // no longer ours to retry; the next owner will
		}
		if attempts < c.cfg.attempts {
			d := c.backoff(attempts)
			if late(d) {
				if out, done := park(); done {
					return out // the shaping topic retries it
				}
			}
			c.log.Debug("consumer: attempt failed; retrying", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "attempt", attempts, "in", d, "err", lastErr)
			if !p.sleep(d) {
				return stopped // no retry: not counted
			}
			c.retried.Add(1)
			continue
		}
		if p.exhausted(rec, attempts, lastErr) {
			return finished
		}
		return stopped
	}
}

// unparkPoll is how often a record that could not be parked checks
// whether its unit's parked records have been handled.
const unparkPoll = 100 * time.Millisecond

// waitUnparked waits until s's unit has no record parked and not handled;
// false if the partition stopped first.
func (p *partition) waitUnparked(s *slot) bool {
	for p.parkedUnit(s) {
		if !p.sleep(unparkPoll) {
			return false
		}
	}
	return true
}

// acquire waits up to wait for the concurrency slot (WithConcurrency) of
// s's record, then for its permit, and returns the budget it came from,
// the function that gives the slot back (to call when the handler
// returns; a no-op without a cap), and the time it returned. A zero
// Keyed (no limiter for the record) takes no permit. On an error nothing
// is held. With WithFairness, the permit w was handed with serves the
// record's first attempt, and the record waits for the others in the
// scheduler's queue, with the other tenants' records.
func (p *partition) acquire(w *worker, s *slot, wait time.Duration) (k throttle.Keyed, release func(), now, useBy time.Time, err error) {
	c := p.c
	if g := w.pre; g != nil {
		w.pre = nil
		return g.k, g.release, time.Now(), g.useBy, g.err
	}
	rec := &s.rec
	k, err = c.limiterOf(rec)
	if err != nil || capability.KeyedLimiter(k).None() && c.cfg.slots == nil {
		return k, noRelease, time.Now(), time.Time{}, err
	}
	if f := c.fair; f != nil && wait > 0 {
		p.waiting.Add(1)
		c.waitingRecords.Add(1)
		start := time.Now()
		if !s.classified { // a record handed without a permit
			p.mu.Lock()
			f.classify(p, s)
			p.mu.Unlock()
		}
		g := f.wait(p, s, k, wait)
		now := time.Now()
		c.permitWait.Add(int64(now.Sub(start)))
		c.waitingRecords.Add(-1)
		p.waiting.Add(-1)
		return g.k, g.release, now, g.useBy, g.err
	}
	p.waiting.Add(1)
	c.waitingRecords.Add(1)
	defer func() {
		c.waitingRecords.Add(-1)
		p.waiting.Add(-1)
	}()
	start := time.Now()
	release = noRelease
	if c.cfg.slots != nil {
		if release, err = c.cfg.slots.Hold(p.soft, k.Key(), wait); err != nil {
			return k, noRelease, time.Now(), time.Time{}, fmt.Errorf("concurrency slot: %w", err)
		}
		if wait != throttle.Forever {
			wait = max(wait-time.Since(start), 0)
		}
	}
	if capability.KeyedLimiter(k).None() {
		return k, release, time.Now(), time.Time{}, nil
	}
	useBy, err = acquireUseBy(p.soft, k, wait)
	now = time.Now()
	c.permitWait.Add(int64(now.Sub(start)))
	if err != nil {
		release()
		return k, noRelease, now, time.Time{}, err
	}
	return k, release, now, useBy, nil
}

func noRelease() {}

// call runs the handler once, within the handler timeout from now. Its context
// holds the attempt's permit (k's), so that a client on the same budget
// inside the handler uses it rather than taking a second one, and, while
// the call runs, its permit waits end with the partition's (soft): a
// handler whose client waits for a permit returns when the partition is
// revoked, and the record goes to the next owner. Work the handler leaves
// behind (a goroutine on a detached context) waits as any caller does
// once the call has returned.
func (p *partition) call(w *worker, rec *kgo.Record, k throttle.Keyed, now, useBy time.Time) error {
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
	ctx := k.ContextWithPermit(capability.WithUseBy(throttle.ContextWithWaitStop(call, stop), useBy), 1)
	// The permit is the attempt's: a call made after the handler returned
	// (from a goroutine with a context detached from call's end) takes
	// its own. Deferred after the cancel above, it runs before it. Still
	// held when the handler returns, the permit went unused
	// (Stats.PermitsUnused); held past its margin, stale too: a client
	// call made then took a permit of its own.
	defer func() {
		kl := capability.KeyedLimiter(k)
		if kl.Forfeit(ctx) > 0 {
			c.permitsUnused.Add(1)
			if !useBy.IsZero() && kl.Clock().Now().After(useBy) {
				c.permitsStale.Add(1)
			}
		}
	}()
	c.notePeakInFlight(c.inFlight.Add(1))
	defer c.inFlight.Add(-1)
	return c.safeCall(ctx, rec)
}

// safeCall calls the handler and turns a panic into a *PanicError.
func (c *Consumer) safeCall(ctx context.Context, rec *kgo.Record) (err error) {
	defer func() {
		if v := recover(); v != nil {
			perr := &PanicError{Value: v, Stack: debug.Stack()}
			c.log.Error("consumer: handler panicked", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset,
				"panic", fmt.Sprint(v), "stack", string(perr.Stack))
			err = perr
		}
	}()
	return c.handler(ctx, rec)
}

// sleep waits d, or until soft ends (false).
func (p *partition) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.soft.Done():
		return false
	}
}

// limiterOf returns rec's budget (WithLimiterFor), and a *PanicError if
// the function panicked.
func (c *Consumer) limiterOf(rec *kgo.Record) (k throttle.Keyed, err error) {
	defer func() {
		if v := recover(); v != nil {
			perr := &PanicError{Value: v, Stack: debug.Stack()}
			c.log.Error("consumer: WithLimiterFor panicked", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset,
				"panic", fmt.Sprint(v), "stack", string(perr.Stack))
			err = perr
		}
	}()
	return c.cfg.limiterFor(rec), nil
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
