package throttle

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/headway-go/headway/internal/waitstop"
)

// Slots caps the calls in flight per key: a call holds a slot from Hold
// until it calls the release function Hold returned.
//
// A rate limit says how often calls may start; a cap on slots says how
// many may run at once. A call that needs both holds a slot first, then
// takes its permit (and gives the slot back if the permit does not come):
// a call paced by the rate goes out right after its permit, so arrivals
// stay paced, and a call never holds a permit while it waits for a slot.
//
// [NewLocalSlots] caps one process; package bucket's Concurrency caps a
// fleet through Redis.
type Slots interface {
	// Hold waits at most maxWait (0: only a slot free now; [Forever]: no
	// bound) for one slot of key ("" is the cap's own key), callers served
	// in arrival order, and returns the function that gives the slot back
	// (idempotent, safe from any goroutine). Errors: [ErrTimeout]
	// (wrapped) when no slot comes within maxWait, the context's error
	// (naming a wait stop's cause, see [ContextWithWaitStop]), a
	// *[BackendError] when the store fails, [ErrInvalid] for bad
	// arguments, and also [ErrInvalidKey] for a key the store cannot
	// use.
	Hold(ctx context.Context, key string, maxWait time.Duration) (release func(), err error)
}

// localSlots is the Slots of NewLocalSlots.
type localSlots struct {
	capacity int64
	mu       sync.Mutex
	keys     map[string]*slotQueue
}

// slotQueue is one key's state: its holders and its waiters, oldest first.
type slotQueue struct {
	held    int64
	waiters []*slotWaiter
}

// slotWaiter is a caller waiting for a slot; ready is closed when the slot
// is handed to it.
type slotWaiter struct {
	ready   chan struct{}
	granted bool
}

// NewLocalSlots returns [Slots] that cap the calls in flight per key
// within one process, in memory: at most capacity holders of each key at
// once. capacity must be at least 1.
//
// Waiting callers are served in arrival order: a released slot is handed
// to the oldest waiter directly, so a caller arriving later cannot take it
// first. A waiter sleeps on a channel until then; nothing polls. Keys each
// get their own cap of capacity slots; a key with no holder and no waiter
// is forgotten. The Slots are safe for concurrent use.
func NewLocalSlots(capacity int64) (Slots, error) {
	if capacity < 1 {
		return nil, invalid("throttle: NewLocalSlots", "capacity", capacity, "must be at least 1")
	}
	return &localSlots{capacity: capacity, keys: make(map[string]*slotQueue)}, nil
}

// Hold implements [Slots].
func (s *localSlots) Hold(ctx context.Context, key string, maxWait time.Duration) (func(), error) {
	if maxWait < 0 {
		return nil, invalid("throttle: Slots.Hold", "maxWait", maxWait, "must be 0 (no wait), positive, or throttle.Forever")
	}
	ctx, cancel := waitstop.Context(ctx)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return nil, waitCtxErr(ctx)
	}
	s.mu.Lock()
	q := s.keys[key]
	if q == nil {
		q = &slotQueue{}
		s.keys[key] = q
	}
	if q.held < s.capacity && len(q.waiters) == 0 {
		q.held++
		s.mu.Unlock()
		return s.releaser(key), nil
	}
	if maxWait == 0 {
		s.mu.Unlock()
		return nil, fmt.Errorf("throttle: local slots: no slot of key %q free: %w", key, ErrTimeout)
	}
	w := &slotWaiter{ready: make(chan struct{})}
	q.waiters = append(q.waiters, w)
	s.mu.Unlock()

	var expired <-chan time.Time
	if maxWait != Forever {
		t := time.NewTimer(maxWait)
		defer t.Stop()
		expired = t.C
	}
	var err error
	select {
	case <-w.ready:
		return s.releaser(key), nil
	case <-expired:
		err = fmt.Errorf("throttle: local slots: no slot of key %q within %v: %w", key, maxWait, ErrTimeout)
	case <-ctx.Done():
		err = waitCtxErr(ctx)
	}
	s.mu.Lock()
	if w.granted {
		// The slot came as the wait ended: pass it on.
		s.mu.Unlock()
		s.releaser(key)()
		return nil, err
	}
	for i, o := range q.waiters {
		if o == w {
			q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
			break
		}
	}
	s.forget(key, q)
	s.mu.Unlock()
	return nil, err
}

// waitCtxErr is the error of a wait that ctx ended: the context's error,
// and also ErrTimeout when ctx's deadline was the bound.
func waitCtxErr(ctx context.Context) error {
	err := ctx.Err()
	if err == context.DeadlineExceeded {
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	}
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%w (%w)", err, cause)
	}
	return err
}

// releaser returns the idempotent function that gives one slot of key
// back: to the oldest waiter if there is one, else to the free pool.
func (s *localSlots) releaser(key string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			q := s.keys[key]
			if len(q.waiters) > 0 {
				w := q.waiters[0]
				q.waiters[0] = nil
				q.waiters = q.waiters[1:]
				w.granted = true
				close(w.ready)
				return
			}
			q.held--
			s.forget(key, q)
		})
	}
}

// forget drops key's state when nobody holds or waits. s.mu is held.
func (s *localSlots) forget(key string, q *slotQueue) {
	if q.held == 0 && len(q.waiters) == 0 {
		delete(s.keys, key)
	}
}

// state returns how many slots of key are held and how many callers wait.
func (s *localSlots) state(key string) (held int64, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.keys[key]; q != nil {
		return q.held, len(q.waiters)
	}
	return 0, 0
}
