package throttle

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/internal/pacenote"
)

// The gate's times are on its Limiter's time base (ns since its epoch,
// monotonic): a wall clock that steps back cannot keep a gate closed.

// admitWave is how many queued callers of one key a Limiter lets ask the
// bucket at once after a refusal. When the bucket has permits again, each
// caller granted lets the next one in, so the queue drains at the bucket's
// pace; when it refuses again, at most admitWave-1 other calls were spent
// learning it.
const admitWave = 8

const noDeadline = int64(^uint64(0) >> 1)

// addSat returns t + d, saturating at noDeadline instead of overflowing.
func addSat(t int64, d time.Duration) int64 {
	if d >= time.Duration(noDeadline-t) {
		return noDeadline
	}
	return t + int64(d)
}

// queue is the gate's stage: it returns at once while the key's gate is
// open; after a refusal, it queues the caller (first in line on a retry)
// until the gate lets it in. gated reports that the caller holds an
// admission, to end with gate.leave.
func (w *waiter) queue(st *keyState, retry bool) (gated bool, err error) {
	if st.gate.open() {
		return false, nil
	}
	err = st.gate.enter(w.ctx, retry, w.gateDeadline(), w.tb)
	return err == nil, err
}

// leaveGate is the gate's reading of a round's decision c (of permits of
// st's key): when to ask again after a refusal (c.retryIn), and whether
// the refusal holds for every caller of the
// key (c.shared): only one that says something about one permit from the
// shared bucket, not one of the failure policy (the bucket may answer at
// the next call), nor one for n > 1 (a single permit may come sooner),
// nor one marked as the caller's alone (c.alone). A shared refusal closes
// the key's gate; an admission (gated) ends. A cost (st nil) has no gate:
// its refusals are its caller's alone.
func (w *waiter) leaveGate(st *keyState, c *decision, gated bool) {
	refused := c.err == nil && !c.Granted
	if refused {
		c.retryIn = c.Delay
		if c.retryIn <= 0 {
			c.retryIn = retryFloor
		}
	}
	c.shared = st != nil && c.src != fromPolicy && w.n == 1 && !c.alone
	var closes time.Duration
	if refused && c.shared {
		closes = c.retryIn
	}
	if gated || closes > 0 {
		st.gate.leave(gated, closes)
	}
}

// gate coordinates a Limiter's callers of one key once the bucket has
// refused: instead of every caller sleeping until the time the bucket
// named and then asking all at once (a herd of round trips that mostly
// come back refused), callers queue in order, the gate sleeps once until
// the bucket's time, and then admits them a few at a time. While the
// bucket grants freely, callers pass the gate with two atomic loads.
//
// A give-back of the key (place.go) may free a permit before the time
// the bucket named: one that begins or ends after the refusal closed the
// gate opens it, and lets the callers queued in when it ends; not before
// the end of a pause reported for the key (its permits are no use until
// then). A grant does not open it: its answer may have been decided
// before the refusal's.
//
// A pause reported for the key closes the gate until the pause's end
// (hold), and no refusal opens it sooner: the provider asked the whole
// process to wait, whether the bucket paused or not.
type gate struct {
	tb *timeBase
	st *keyState // the gate's: its next place's turns count its give-backs
	// closedUntil is the time before which the bucket said asking is
	// useless, unless the key's give-back turns have moved from
	// closedTurns (their low bits) since; queued is len(q), for the
	// lock-free check.
	closedUntil atomic.Int64
	queued      atomic.Int32
	closedTurns atomic.Uint32

	mu      sync.Mutex
	q       []*gateWaiter // FIFO
	active  int           // admitted callers whose bucket call is in flight
	timer   clockwork.Timer
	timerAt int64 // when timer fires
}

type gateWaiter struct {
	ready    chan struct{} // gets a value when admitted or turned away
	admitted bool          // under gate.mu
	// deadline is the time the caller waits until at most; err, set before ready when the gate turns the caller away
	// because it will not reopen by then.
	deadline int64
	timeout  timeoutBound
	err      error
}

// until is the time the gate is closed until, 0 if open.
func (g *gate) until() int64 {
	until := g.closedUntil.Load()
	if until != 0 && g.closedTurns.Load() != uint32(g.st.next.turns.Load()) {
		return min(until, g.st.pausedUntil.Load()) // a give-back since
	}
	return until
}

// open reports whether a caller may ask the bucket without queueing. It
// reads the clock only while the gate has a closing time: the first
// caller past it resets it to 0 (admitLocked), unless another holds the
// lock.
func (g *gate) open() bool {
	if g.queued.Load() != 0 {
		return false
	}
	until := g.until()
	if until == 0 {
		return true
	}
	if until > g.tb.now() {
		return false
	}
	if g.mu.TryLock() {
		g.admitLocked()
		g.mu.Unlock()
	}
	return true
}

// enter queues the caller (first in line if retry, as it was already
// admitted once) until the gate admits it, its deadline comes (ErrTimeout,
// at once if the gate opens too late; noDeadline: none), or ctx ends. On
// nil the caller holds an admission and must call leave after asking the
// bucket.
func (g *gate) enter(ctx context.Context, retry bool, deadline int64, tb timeoutBound) error {
	g.mu.Lock()
	now := g.tb.now()
	left := Forever
	if deadline != noDeadline {
		left = time.Duration(max(deadline-now, 0))
	}
	until := g.until()
	if wait := time.Duration(until - now); wait > 0 && wait > left {
		g.mu.Unlock()
		return tb.err(wait)
	}
	// An open gate admits at once while fewer than admitWave are in
	// flight; a caller that may not wait at all is admitted while the
	// gate is open however many are in flight (it cannot queue).
	if until <= now && (left == 0 || len(g.q) == 0 && g.active < admitWave) {
		g.active++
		g.mu.Unlock()
		return nil
	}
	if until > now {
		pacenote.MarkPaced(ctx) // queued behind a refusal's retry time
	}
	w := &gateWaiter{ready: make(chan struct{}, 1), deadline: deadline, timeout: tb}
	if retry {
		g.q = append([]*gateWaiter{w}, g.q...)
	} else {
		g.q = append(g.q, w)
	}
	g.queued.Add(1)
	g.admitLocked()
	g.mu.Unlock()

	// A gate that closes again past our deadline turns us away at once;
	// the timer bounds the wait behind callers in flight (an open gate
	// with admitWave calls to a slow store). It is set from the clock
	// read now, not under the lock: the time between would make it late.
	var end <-chan time.Time
	if deadline != noDeadline {
		t := g.tb.clock.NewTimer(time.Duration(max(deadline-g.tb.now(), 0)))
		defer t.Stop()
		end = t.Chan()
	}
	var err error
	select {
	case <-w.ready:
		return w.err
	case <-ctx.Done():
		err = waitErr(ctx)
	case <-end:
		err = tb.err(left)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if w.err != nil {
		return err // turned away as we gave up
	}
	if w.admitted {
		// Admitted as we gave up: pass the admission on.
		g.active--
		g.admitLocked()
		return err
	}
	for i, x := range g.q {
		if x == w {
			g.q = append(g.q[:i], g.q[i+1:]...)
			g.queued.Add(-1)
			break
		}
	}
	g.admitLocked() // (an open gate left empty keeps no timer)
	return err
}

// leave ends an admission (admitted), and records a refusal that closes
// the gate for d (0: none).
func (g *gate) leave(admitted bool, d time.Duration) {
	g.mu.Lock()
	if admitted {
		g.active--
	}
	if d > 0 {
		g.closeUntil(addSat(g.tb.now(), d))
	}
	g.admitLocked()
	g.mu.Unlock()
}

// hold closes the gate until at least until: the end of a pause reported
// for the key (Limiter.pause), which its callers in this process wait
// out whatever the bucket answers (it may not pause, or its pause may
// have failed).
func (g *gate) hold(until int64) {
	g.mu.Lock()
	if until > g.until() {
		g.closeUntil(until)
	}
	g.admitLocked()
	g.mu.Unlock()
}

// closeUntil closes the gate until at, or the end of a pause reported
// for the key if later. g.mu is held.
func (g *gate) closeUntil(at int64) {
	g.closedTurns.Store(uint32(g.st.next.turns.Load()))
	g.closedUntil.Store(max(at, g.st.pausedUntil.Load()))
}

// admitLocked admits queued callers while the gate is open and fewer than
// admitWave are in flight. While it is closed, it turns away the callers
// whose deadline comes before it reopens, and arms the timer that reopens
// it.
func (g *gate) admitLocked() {
	now := g.tb.now()
	until := g.until()
	if until > now {
		kept := g.q[:0]
		for _, w := range g.q {
			if w.deadline < until {
				w.err = w.timeout.err(time.Duration(until - now))
				w.ready <- struct{}{}
				g.queued.Add(-1)
				continue
			}
			kept = append(kept, w)
		}
		clear(g.q[len(kept):])
		g.q = kept
		if len(g.q) > 0 && g.timer != nil && until < g.timerAt {
			// Reopens sooner than the timer was set for: set it again.
			g.timer.Stop()
			g.timer = nil
		}
		if len(g.q) > 0 && g.timer == nil {
			g.timer, g.timerAt = g.tb.clock.AfterFunc(time.Duration(until-now), g.reopen), until
		}
		return
	}
	if len(g.q) == 0 && g.closedUntil.Load() != 0 {
		// Reopened, nobody waiting: callers may pass without reading
		// the clock (see open), and no timer keeps the key (idle).
		g.closedUntil.Store(0)
		if g.timer != nil {
			g.timer.Stop()
			g.timer = nil
		}
	}
	for len(g.q) > 0 && g.active < admitWave {
		w := g.q[0]
		g.q[0] = nil
		g.q = g.q[1:]
		g.queued.Add(-1)
		w.admitted = true
		g.active++
		w.ready <- struct{}{}
	}
}

// reopen runs when the time the bucket named has come.
func (g *gate) reopen() {
	g.mu.Lock()
	g.timer = nil
	g.admitLocked()
	g.mu.Unlock()
}

// idle reports whether the gate holds nothing worth keeping.
func (g *gate) idle(now int64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.q) == 0 && g.active == 0 && g.timer == nil && g.until() <= now
}

// givingBack records that a give-back of the key to its bucket begins
// (nextPlace.givingBack); end records that it ended, and lets the callers
// queued at the key's gate in if it opened it.
func (st *keyState) givingBack() (end func()) {
	ended := st.next.givingBack()
	return func() {
		ended()
		if st.gate.queued.Load() != 0 {
			st.gate.mu.Lock()
			st.gate.admitLocked()
			st.gate.mu.Unlock()
		}
	}
}
