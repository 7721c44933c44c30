package throttle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
)

// eventClock is a fake clock that a driver moves from one event to the
// next (eventDriver): it knows when each of its timers ends, which of
// them a goroutine blocks on (NewTimer) and which run a function
// (AfterFunc), and tells the driver of every change.
type eventClock struct {
	*clockwork.FakeClock
	mu      sync.Mutex
	timers  map[*eventTimer]struct{}
	running int // AfterFunc functions started and not ended
	changed chan struct{}
}

func newEventClock() *eventClock {
	return &eventClock{FakeClock: clockwork.NewFakeClock(), timers: map[*eventTimer]struct{}{}, changed: make(chan struct{}, 1)}
}

type eventTimer struct {
	clockwork.Timer
	c     *eventClock
	at    time.Time
	isFun bool
}

func (c *eventClock) signal() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

func (c *eventClock) NewTimer(d time.Duration) clockwork.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &eventTimer{Timer: c.FakeClock.NewTimer(d), c: c, at: c.FakeClock.Now().Add(d)}
	c.timers[t] = struct{}{}
	c.signal()
	return t
}

func (c *eventClock) AfterFunc(d time.Duration, f func()) clockwork.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &eventTimer{c: c, at: c.FakeClock.Now().Add(d), isFun: true}
	t.Timer = c.FakeClock.AfterFunc(d, func() {
		f()
		c.mu.Lock()
		c.running--
		c.mu.Unlock()
		c.signal()
	})
	c.timers[t] = struct{}{}
	c.signal()
	return t
}

func (c *eventClock) After(d time.Duration) <-chan time.Time { return c.NewTimer(d).Chan() }
func (c *eventClock) Sleep(d time.Duration)                  { <-c.After(d) }

func (t *eventTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	delete(t.c.timers, t)
	t.c.signal()
	return t.Timer.Stop()
}

func (t *eventTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.at = t.c.FakeClock.Now().Add(d)
	t.c.timers[t] = struct{}{}
	t.c.signal()
	return t.Timer.Reset(d)
}

// next returns the earliest end of a pending timer, and whether a
// goroutine is blocked on one (a NewTimer is pending) and no AfterFunc
// function runs.
func (c *eventClock) next() (at time.Time, blocked bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running > 0 {
		return time.Time{}, false
	}
	for t := range c.timers {
		if at.IsZero() || t.at.Before(at) {
			at = t.at
		}
		blocked = blocked || !t.isFun
	}
	return at, blocked
}

// advanceTo moves the clock to at, firing the timers that end by then.
func (c *eventClock) advanceTo(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t := range c.timers {
		if !t.at.After(at) {
			delete(c.timers, t)
			if t.isFun {
				c.running++
			}
		}
	}
	if d := at.Sub(c.FakeClock.Now()); d > 0 {
		c.FakeClock.Advance(d)
	} else {
		c.FakeClock.Advance(0)
	}
}

// drive runs one call on c until it returns: while the call is blocked on
// a timer (or, gated says, queued at a gate that an AfterFunc reopens),
// it moves the clock to the next event, a timer's end or the
// stop at stopAt (zero: none), which it fires by calling stop. After the
// stop, time stands still: the call must return without it. It returns
// when the call's done is closed, or fails the trial if that takes 10 s.
func (c *eventClock) drive(done <-chan struct{}, stopAt time.Time, stop func(), gated func() bool) error {
	stopped := false
	giveUp := time.After(10 * time.Second)
	for {
		at, blocked := c.next()
		if !blocked && !at.IsZero() && gated() {
			c.mu.Lock()
			blocked = c.running == 0
			c.mu.Unlock()
		}
		if !stopped && blocked {
			if !stopAt.IsZero() && !stopAt.After(at) {
				c.advanceTo(stopAt)
				stop()
				stopped = true
				continue
			}
			c.advanceTo(at)
		}
		select {
		case <-done:
			return nil
		case <-c.changed:
		case <-giveUp:
			return errors.New("the call did not return within 10 s (real time)")
		}
	}
}

// latencyStore is a bucket over a Local, a CostBucket of one dimension
// ("tokens") over the same Local, and an adaptive store, whose Take,
// TakeCost and PaceAdaptive take their latency on an eventClock: half
// before the store decides, half after; a call whose context ends (its
// deadline, read as a duration at the call's start, or a stop) ends then,
// with or without a decision made in the store. With down set, Take and
// TakeCost fail (a store error) once their first half has passed. It is
// no Immediate: the failure policy decides when a call is cut or fails.
type latencyStore struct {
	shared   *sharedAdaptive
	clock    *eventClock
	takeLat  time.Duration
	paceLat  time.Duration
	down     atomic.Bool
	granted  atomic.Int64
	returned atomic.Int64
}

// callEnd is when a call under ctx must end on the store's clock: its
// deadline, a real-time duration from now, taken on the fake clock at the
// call's start; zero for none.
func (s *latencyStore) callEnd(ctx context.Context) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return s.clock.Now().Add(time.Until(dl))
	}
	return time.Time{}
}

// sleep waits d on the store's clock, or until ctx ends or end (callEnd)
// comes.
func (s *latencyStore) sleep(ctx context.Context, d time.Duration, end time.Time) error {
	cut := false
	if !end.IsZero() {
		if until := end.Sub(s.clock.Now()); until < d {
			d, cut = max(until, 0), true
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	t := s.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.Chan():
		if cut {
			return context.DeadlineExceeded
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *latencyStore) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (Decision, error) {
	end := s.callEnd(ctx)
	if err := s.sleep(ctx, s.takeLat/2, end); err != nil {
		return Decision{}, &BackendError{Op: "take", Err: err}
	}
	if s.down.Load() {
		return Decision{}, &BackendError{Op: "take", Err: errors.New("connection refused")}
	}
	d, err := s.shared.Local.Take(context.Background(), key, n, maxWait)
	if err != nil {
		return d, err
	}
	if err := s.sleep(ctx, s.takeLat-s.takeLat/2, end); err != nil {
		return Decision{}, &BackendError{Op: "take", Err: err}
	}
	return d, nil
}

func (s *latencyStore) TakeCost(ctx context.Context, key string, c Cost, maxWait time.Duration) (Decision, error) {
	if len(c) != 1 || c["tokens"] < 1 {
		return Decision{}, invalid("latencyStore", "cost", c.String(), "must be tokens only")
	}
	d, err := s.Take(ctx, key, c["tokens"], maxWait)
	if err != nil || !d.Granted {
		return d, err
	}
	d.Cancel = nil
	d.Settle = func(context.Context, Cost) error { return nil } // as Local: nothing given back
	return d, nil
}

// Refund gives nothing back, as Local.
func (s *latencyStore) Refund(context.Context, string, int64) error { return nil }

func (s *latencyStore) Fallback() (int64, time.Duration, int64) {
	return s.shared.Fallback()
}

func (s *latencyStore) PaceAdaptive(ctx context.Context, key string, n int64, interval, horizon time.Duration) (AdaptivePace, error) {
	end := s.callEnd(ctx)
	if err := s.sleep(ctx, s.paceLat/2, end); err != nil {
		return AdaptivePace{}, &BackendError{Op: "pace", Err: err}
	}
	p, err := s.shared.PaceAdaptive(ctx, key, n, interval, horizon)
	if err != nil {
		return p, err
	}
	if err := s.sleep(ctx, s.paceLat-s.paceLat/2, end); err != nil {
		return AdaptivePace{}, &BackendError{Op: "pace", Err: err}
	}
	return p, nil
}

func (s *latencyStore) SwapAdaptive(ctx context.Context, key string, old, next AdaptiveState, ttl time.Duration) (AdaptiveState, bool, error) {
	return s.shared.SwapAdaptive(ctx, key, old, next, ttl)
}

// deadlineTrial is one Acquire of the property test, as drawn.
type deadlineTrial struct {
	limit, spent  int64         // the Local's limit per interval, and permits taken before
	rate          float64       // the adaptive rate per interval; 0: not adapting
	slots         int           // paced slots taken before
	takeLat       time.Duration // the store's latencies
	paceLat       time.Duration
	maxWait, stop time.Duration // stop: when the wait stop comes; 0: none
	call          string        // "acquire", "cost" (AcquireCost), "lease" (Acquire, leasing)
	policy        FailurePolicy
	down          bool // the store fails every Take
}

func drawTrial(r *rand.Rand) deadlineTrial {
	ms := func(lo, hi float64) time.Duration {
		return time.Duration((lo + r.Float64()*(hi-lo)) * float64(time.Millisecond))
	}
	t := deadlineTrial{limit: 1 + r.Int64N(20)}
	t.spent = r.Int64N(2 * t.limit)
	if r.IntN(2) == 0 {
		t.rate = 0.5 + r.Float64()*float64(t.limit)
		t.slots = r.IntN(4)
	}
	if r.IntN(3) > 0 {
		t.takeLat = ms(0, 8)
	}
	if r.IntN(3) > 0 {
		t.paceLat = ms(0, 40)
	}
	switch k := r.IntN(10); {
	case k == 0:
		t.maxWait = 0
	case k == 1:
		t.maxWait = Forever
	default:
		t.maxWait = ms(0.05, 60)
	}
	if t.maxWait == Forever || r.IntN(2) == 0 {
		t.stop = ms(0, 70)
	}
	t.call = []string{"acquire", "cost", "lease"}[r.IntN(3)]
	t.policy = []FailurePolicy{FailLocal, FailOpen, FailClosed}[r.IntN(3)]
	switch r.IntN(8) {
	case 0:
		t.down = true
	case 1:
		t.takeLat = ms(90, 150) // around the store timeout
	}
	return t
}

const trialInterval = 20 * time.Millisecond

// run runs t and returns Acquire's error, when it returned after the
// start (on the fake clock), and the end of its wait.
func (t deadlineTrial) run() (err error, took, end time.Duration, _ error) {
	clock := newEventClock()
	loc, lerr := NewLocal(t.limit, trialInterval, WithClock(clock))
	if lerr != nil {
		return nil, 0, 0, lerr
	}
	s := &latencyStore{shared: &sharedAdaptive{Local: loc, clock: clock, mu: make(chan struct{}, 1), mem: map[string]*memAdaptive{}}, clock: clock}
	ctx := context.Background()
	for range t.spent {
		_, _ = loc.Take(ctx, "k", 1, Forever)
	}
	if t.rate > 0 {
		s.shared.state("k").swap(clock.Now(), AdaptiveState{}, AdaptiveState{Rate: t.rate}, time.Hour)
		for range t.slots {
			_, _ = s.shared.PaceAdaptive(ctx, "k", 1, trialInterval, trialInterval)
		}
	}
	opts := []LimiterOption{WithClock(clock), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), WithFailurePolicy(t.policy)}
	if t.call == "lease" {
		opts = append(opts, WithLeasing(Leasing{}))
	}
	lim := New(s, opts...)
	defer lim.Close()
	k := lim.Key("k")
	if _, err := lim.adaptiveState(ctx, "k"); err != nil { // the view, fresh
		return nil, 0, 0, err
	}
	s.takeLat, s.paceLat = t.takeLat, t.paceLat
	s.down.Store(t.down)

	stopCtx, stop := context.WithCancel(ctx)
	defer stop()
	actx := ctx
	var stopAt time.Time
	start := clock.Now()
	end = t.maxWait
	if t.maxWait == 0 {
		end = DefaultStoreTimeout // a call that does not wait may take the store timeout
	}
	if t.stop > 0 {
		actx = ContextWithWaitStop(ctx, stopCtx)
		stopAt = start.Add(t.stop)
		end = min(end, t.stop)
	}
	// A caller queued at the key's gate of a wait with no end (Forever)
	// waits for the gate's AfterFunc alone: it is blocked on the clock
	// too. A wait with an end arms a timer of its own before it blocks
	// (the end, from the time read as it queued), and is blocked on that:
	// counting it as blocked from the moment it queued would move the
	// clock before the timer is armed, which then ends past the wait's end.
	st := lim.stateAt("k", 0)
	defer lim.release(st)
	gated := func() bool { return t.maxWait == Forever && st.gate.queued.Load() > 0 }
	done := make(chan struct{})
	var aerr error
	var atook time.Duration
	go func() {
		defer close(done)
		if t.call == "cost" {
			_, aerr = k.AcquireCost(actx, Cost{"tokens": 1}, t.maxWait)
		} else {
			aerr = k.Acquire(actx, t.maxWait)
		}
		atook = clock.Since(start)
	}()
	if derr := clock.drive(done, stopAt, stop, gated); derr != nil {
		return nil, 0, 0, derr
	}
	return aerr, atook, end, nil
}

// TestAcquireNeverGrantsAfterItsDeadline: with random
// store latencies (the bucket's and the adaptive pace's, some around the
// store timeout), a store that fails, random maxWaits, random wait stops,
// each failure policy, and Acquire, AcquireCost or Acquire with leasing,
// the call never returns a grant after the end of its wait (the earlier
// of maxWait, or the store timeout for a call that does not wait, and the
// stop) and never returns more than 2 ms after it. Time is a fake clock
// moved from event to event, so the scheduler's delay is none.
func TestAcquireNeverGrantsAfterItsDeadline(t *testing.T) {
	const trials = 10000
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	var (
		mu       sync.Mutex
		failures []string
		next     atomic.Int64
		wg       sync.WaitGroup
		outcomes [3]atomic.Int64 // granted, timed out, stopped
	)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			for next.Add(1) <= trials {
				tr := drawTrial(r)
				aerr, took, end, terr := tr.run()
				var bad string
				switch {
				case terr != nil:
					bad = terr.Error()
				case aerr == nil && took > end:
					bad = fmt.Sprintf("granted %v after the start, the wait ended at %v", took, end)
				case took > end+2*time.Millisecond:
					bad = fmt.Sprintf("returned %v after the start (%v), the wait ended at %v", took, aerr, end)
				}
				switch {
				case aerr == nil:
					outcomes[0].Add(1)
				case errors.Is(aerr, ErrTimeout):
					outcomes[1].Add(1)
				case errors.Is(aerr, context.Canceled):
					outcomes[2].Add(1)
				}
				if bad != "" {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%+v: %s", tr, bad))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("granted %d, timed out %d, stopped %d", outcomes[0].Load(), outcomes[1].Load(), outcomes[2].Load())
	for i, f := range failures {
		if i == 10 {
			t.Errorf("... and %d more", len(failures)-10)
			break
		}
		t.Error(f)
	}
	require.Positive(t, outcomes[0].Load(), "some calls are granted")
	require.Positive(t, outcomes[1].Load(), "some time out")
	require.Positive(t, outcomes[2].Load(), "some are stopped")
}
