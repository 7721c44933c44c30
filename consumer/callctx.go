package consumer

import (
	"context"
	"sync"
	"time"
)

// callCtx is the context of one handler call. It carries the values of
// Run's context and reports the call's deadline, and it is done when the
// deadline passes, when the call has returned, or when the partition gives
// up on its calls (endCalls). Unlike context.WithTimeout it starts a timer
// only once something waits for it (Done or AfterFunc, as net/http and
// context.WithCancel do): a handler that never waits costs no timer.
type callCtx struct {
	parent   context.Context
	deadline time.Time
	p        *partition

	lazyDone
	timer *time.Timer // started by the first Done or AfterFunc

	stop callStop // the call's permit-wait stop (call sets it up)
}

// lazyDone is the end both call contexts share: its done channel is
// made by the first Done, and the watch that ends it (arm) starts only
// once something waits (Done or AfterFunc).
type lazyDone struct {
	mu     sync.Mutex
	done   chan struct{} // made by the first Done
	err    error
	afters []*afterCall // to run once ended, each in its own goroutine
}

type afterCall struct{ f func() }

// doneLocked is Done; l.mu is held.
func (l *lazyDone) doneLocked(arm func()) <-chan struct{} {
	if l.done == nil {
		l.done = make(chan struct{})
		if l.err != nil {
			close(l.done)
		} else {
			arm()
		}
	}
	return l.done
}

// afterFuncLocked is AfterFunc: f runs in its own goroutine once l has
// ended, and stop unregisters f and reports whether it did so before f
// was started; l.mu is held.
func (l *lazyDone) afterFuncLocked(f, arm func()) (stop func() bool) {
	if l.err != nil {
		go f()
		return func() bool { return false }
	}
	a := &afterCall{f}
	l.afters = append(l.afters, a)
	arm()
	return func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, b := range l.afters {
			if b == a {
				l.afters = append(l.afters[:i], l.afters[i+1:]...)
				return true
			}
		}
		return false
	}
}

// endWithLocked ends l, not yet ended, with err; l.mu is held.
func (l *lazyDone) endWithLocked(err error) {
	l.err = err
	if l.done != nil {
		close(l.done)
	}
	for _, a := range l.afters {
		go a.f()
	}
	l.afters = nil
}

func newCallCtx(parent context.Context, p *partition, now time.Time, timeout time.Duration) *callCtx {
	return &callCtx{parent: parent, p: p, deadline: now.Add(timeout)}
}

// Deadline implements context.Context.
func (c *callCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// Value implements context.Context.
func (c *callCtx) Value(key any) any { return c.parent.Value(key) }

// Done implements context.Context.
func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.doneLocked(c.watchLocked)
}

// Err implements context.Context.
func (c *callCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil && !time.Now().Before(c.deadline) {
		c.cancelLocked(context.DeadlineExceeded)
	}
	return c.err
}

// AfterFunc arranges for f to run in its own goroutine once c is done,
// like context.AfterFunc, which (with context.WithCancel and friends)
// calls it. stop unregisters f and reports whether it did so before f
// was started.
func (c *callCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.afterFuncLocked(f, c.watchLocked)
}

// String names the context, as the standard library's do.
func (c *callCtx) String() string { return "consumer.handlerContext" }

// watchLocked starts the deadline's timer, once; c.mu is held and c is
// not done.
func (c *callCtx) watchLocked() {
	if c.timer != nil {
		return
	}
	d := time.Until(c.deadline)
	if d <= 0 {
		c.cancelLocked(context.DeadlineExceeded)
		return
	}
	c.timer = time.AfterFunc(d, func() { c.cancel(context.DeadlineExceeded) })
}

// cancel ends c with err, unless it has ended already.
func (c *callCtx) cancel(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancelLocked(err)
}

func (c *callCtx) cancelLocked(err error) {
	if c.err != nil {
		return
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	c.endWithLocked(err)
}

// callStop ends the permit waits of one handler call
// (throttle.ContextWithWaitStop) when its partition's soft context ends
// while the call runs; disarm, when the call returns, leaves later waits
// (work the handler left behind) alone. Like callCtx it costs nothing
// until a wait asks for it (Done or AfterFunc): a call whose permit
// needs no wait (the consumer's own, passed down) registers nothing on
// soft.
type callStop struct {
	soft context.Context

	lazyDone             // err: context.Canceled once ended
	cause    error       // soft's cause
	unhook   func() bool // the registration on soft, once armed
	disarmed bool
}

// Deadline implements context.Context: a stop has none.
func (s *callStop) Deadline() (time.Time, bool) { return time.Time{}, false }

// Value implements context.Context: a stop carries no values.
func (s *callStop) Value(any) any { return nil }

// Done implements context.Context.
func (s *callStop) Done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.doneLocked(s.armLocked)
}

// Err implements context.Context.
func (s *callStop) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil && !s.disarmed && s.soft.Err() != nil {
		s.endLocked()
	}
	return s.err
}

// Cause is why the stop ended (the partition's soft cause), for the
// error of a stopped wait.
func (s *callStop) Cause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cause
}

// AfterFunc arranges for f to run in its own goroutine once s has ended,
// as context.AfterFunc (which calls it) does.
func (s *callStop) AfterFunc(f func()) (stop func() bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.afterFuncLocked(f, s.armLocked)
}

// String names the context, as the standard library's do.
func (s *callStop) String() string { return "consumer.handlerWaitStop" }

// armLocked registers s on soft, once, unless disarmed; s.mu is held.
func (s *callStop) armLocked() {
	if s.unhook != nil || s.disarmed {
		return
	}
	s.unhook = context.AfterFunc(s.soft, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.disarmed {
			s.endLocked()
		}
	})
}

func (s *callStop) endLocked() {
	if s.err != nil {
		return
	}
	s.cause = context.Cause(s.soft)
	s.endWithLocked(context.Canceled)
}

// disarm ends s's watch on soft: the call has returned.
func (s *callStop) disarm() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.disarmed = true
	if s.unhook != nil {
		s.unhook()
	}
	s.afters = nil
}
