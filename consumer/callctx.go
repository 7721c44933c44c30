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

	mu     sync.Mutex
	done   chan struct{} // made by the first Done
	timer  *time.Timer   // started by the first Done or AfterFunc
	err    error
	afters []*afterCall // to run once done, each in its own goroutine
}

type afterCall struct{ f func() }

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
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		} else {
			c.watchLocked()
		}
	}
	return c.done
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
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	a := &afterCall{f}
	c.afters = append(c.afters, a)
	c.watchLocked()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, b := range c.afters {
			if b == a {
				c.afters = append(c.afters[:i], c.afters[i+1:]...)
				return true
			}
		}
		return false
	}
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
	c.err = err
	if c.done != nil {
		close(c.done)
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	for _, a := range c.afters {
		go a.f()
	}
	c.afters = nil
}
