package throttle

import (
	"context"
	"sync"
	"time"
)

// Giving permits back.
//
// A caller that leaves permits it was granted (a reservation beyond its
// wait, a grant answered after its wait's end, a wait stopped while it
// slept for its grant) gives them back to the bucket: one store call, on
// a context of its own (the caller's may be done), giveBackTimeout long,
// never cut short nor made twice. The caller waits for it at most
// waiter.giveBackBound; the rest goes on in a goroutine of the Limiter,
// which Close waits for. A give-back to an immediate bucket (in memory:
// it cannot hang) is done before the caller returns, so that its permits
// are there for the next caller (a reservation cancelled exactly can be
// so only while nothing was booked after it).

// giveBackTimeout bounds one give-back's store call.
const giveBackTimeout = time.Second

// maxGiveBacks bounds the give-backs going on in the background: with that
// many, a caller waits for its own until it ends, as a store that slow
// calls for (its callers do not pile up more calls on it).
const maxGiveBacks = 64

// giveBacks counts a Limiter's give-backs in the background.
type giveBacks struct {
	mu     sync.Mutex
	idle   sync.Cond // on mu (New sets it), signalled when n drops to 0
	n      int
	closed bool
}

// start reserves room for one more, unless l is closed or the room is
// taken.
func (g *giveBacks) start() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || g.n >= maxGiveBacks {
		return false
	}
	g.n++
	return true
}

// done ends one started with start.
func (g *giveBacks) done() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n--; g.n == 0 {
		g.idle.Broadcast()
	}
}

// close stops new ones and waits for those under way.
func (g *giveBacks) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	for g.n > 0 {
		g.idle.Wait()
	}
}

// giveBack gives back what a caller leaves of key's budget: a cost's
// reservation d by its Settle; n permits by d's Cancel (exact, for a
// reservation) or else the bucket's Refunder. With neither, the permits
// only cost throughput. The caller waits for it at most bound (handBack).
// st is the key's state: a give-back forgets its next place while it is
// under way (place.go), and opens its gate (gate.go).
func (l *Limiter) giveBack(ctx context.Context, bound time.Duration, st *keyState, key string, n int64, cost Cost, d Decision) {
	var give func(context.Context) error
	switch {
	case cost != nil && d.Settle != nil:
		back := make(Cost, len(cost))
		for name, v := range cost {
			back[name] = -v
		}
		give = func(rctx context.Context) error { return d.Settle(rctx, back) }
	case cost != nil || n < 1:
	case d.Cancel != nil:
		give = d.Cancel
	case l.caps.refunder != nil:
		give = func(rctx context.Context) error { return l.caps.refunder.Refund(rctx, key, n) }
	}
	if give == nil {
		return
	}
	end := st.givingBack()
	l.handBack(ctx, bound, func(rctx context.Context) {
		defer end()
		if err := give(rctx); err != nil {
			l.cfg.logger.Warn("throttle: giving back permits failed", "key", key, "what", whatOf(n, cost), "err", err)
		}
	})
}

// handBack runs give, a give-back for a caller under ctx, on a context of
// its own with ctx's values, and waits for it at most bound (see above).
func (l *Limiter) handBack(ctx context.Context, bound time.Duration, give func(context.Context)) {
	run := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
		defer cancel()
		give(rctx)
	}
	if l.caps.immediate || !l.gives.start() {
		run() // in memory; or closed, or a store too slow for more: the caller waits
		return
	}
	done := make(chan struct{})
	go func() {
		defer l.gives.done()
		defer close(done)
		run()
	}()
	select {
	case <-done:
		return
	default:
	}
	if bound <= 0 {
		return
	}
	// On the real clock, as the store call's own timeouts are: what
	// bounds it is the time a real store takes.
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}
