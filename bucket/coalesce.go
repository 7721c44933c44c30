package bucket

import (
	"cmp"
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/throttle"
)

// Coalesced takes: what they do and guarantee is in the package doc.

// upTo is one coalesced call's answer: got callers are granted, the first
// got unless delays says otherwise (caller i's Delay is delays[i] when
// set: the token bucket's places or GCRA's slots, each within its caller's
// own wait, a negative one for a caller refused; with step > 0, max(first
// + i·step, floor, 0): GCRA's slots within the batch's least wait; else
// granted's); the others get rest.
// An all-or-nothing take's answer is granted alone.
type upTo struct {
	granted throttle.Decision // the grants' template; Remaining counts after all got (may be negative: forCaller clamps it)
	got     int64
	delays  []time.Duration
	after   []int64 // with delays: how many are granted after caller i
	first   time.Duration
	step    time.Duration
	floor   time.Duration
	rest    throttle.Decision // for the callers not granted
	at      int64             // when the store decided, µs on its clock (the token bucket's; 0 unknown)
	// cancel, when set, is caller i's Decision.Cancel.
	cancel func(i int64) func(context.Context) error
}

// forCaller is the Decision of caller i (0-based) of a batch.
func (u *upTo) forCaller(i int64) throttle.Decision {
	if u.delays != nil && (i >= int64(len(u.delays)) || u.delays[i] < 0) || u.delays == nil && i >= u.got {
		return u.rest
	}
	d := u.granted
	if u.after != nil {
		d.Remaining += u.after[i]
	} else {
		d.Remaining += u.got - 1 - i
	}
	d.Remaining = max(d.Remaining, 0)
	if d.Limit > 0 {
		d.Remaining = min(d.Remaining, d.Limit)
	}
	switch {
	case u.delays != nil:
		d.Delay = u.delays[i]
	case u.step > 0:
		d.Delay = max(u.first+time.Duration(i)*u.step, u.floor, 0)
	}
	if u.cancel != nil {
		d.Cancel = u.cancel(i)
	}
	return d
}

// eachCaller sets delays and after from places, each caller's place in µs
// from the store's now, in batch order, -1 for a caller refused.
func (u *upTo) eachCaller(places []int64) {
	u.delays, u.after = make([]time.Duration, len(places)), make([]int64, len(places))
	granted := int64(0)
	for i := len(places) - 1; i >= 0; i-- {
		u.delays[i], u.after[i] = us(places[i]), granted
		if places[i] >= 0 {
			granted++
		}
	}
}

// waitGroups is a batch's waits (ascending, as serve passes them) as a
// script's arguments, in the unit conv gives: the waits in one span of
// grid go as one group, a pair of the group's least wait (its first
// caller's, exact) and how many callers it has; nil when all are in one
// group (the batch's least wait, maxWait, then bounds each caller). A
// caller is so placed within its own wait, and refused a place only when
// that place is past its wait, or within grid of its wait's end and past
// a shorter wait in its group. grid: see waitGrid.
func waitGroups(waits []time.Duration, grid time.Duration, conv func(time.Duration) int64) []any {
	var args []any
	var group time.Duration
	least, count := int64(0), int64(0)
	for _, w := range waits {
		g := w.Truncate(grid)
		if count > 0 && g == group {
			count++
			continue
		}
		if count > 0 {
			args = append(args, least, count)
		}
		group, least, count = g, conv(w), 1
	}
	if len(args) == 0 {
		return nil // one group, or none
	}
	return append(args, least, count)
}

// waitGrid is waitGroups' grid for places spacing apart: a millisecond
// when they are closer than that (under load a batch's waits differ by
// microseconds, and sent one each, they cost a third of the throughput),
// else a microsecond.
func waitGrid(spacing time.Duration) time.Duration {
	if spacing < time.Millisecond {
		return time.Millisecond
	}
	return time.Microsecond
}

// roundTrip is a bucket's one round trip for key: n permits, all or
// nothing, or for n < 0 up to -n, each reserved at most maxWait ahead
// (buckets that never reserve ignore maxWait). For n < 0, waits, when
// set, is each caller's own wait, in ascending order (maxWait is the
// first): a bucket may place caller i's permit within waits[i] instead
// (waitGroups), and refuse it alone (upTo.delays).
type roundTrip func(ctx context.Context, key string, n int64, maxWait time.Duration, waits []time.Duration) (upTo, error)

// takeBy is a bucket's Take over its round trip: n permits (at most
// capacity) in a round trip of their own, all or nothing, or (n == 1)
// through the coalescer with maxWait.
func (b *common) takeBy(ctx context.Context, key string, n, capacity int64, maxWait time.Duration, run roundTrip) (throttle.Decision, error) {
	one := func(ctx context.Context) (throttle.Decision, error) {
		if err := b.checkN(n, capacity); err != nil {
			return throttle.Decision{}, err
		}
		u, err := run(ctx, key, n, maxWait, nil)
		return u.granted, err
	}
	if n != 1 {
		return bounded(ctx, b, key, one)
	}
	return b.coalesced(ctx, key, maxWait, one, run)
}

const coalesceShards = 64

// maxBatch bounds the callers of one coalesced call: a crowd of thousands
// on one key goes in several calls, so that no script holds Redis (which
// runs one at a time) for long, nor answers thousands of places at once.
const maxBatch = 1000

// coalescer holds, per key, the callers waiting for the next coalesced
// call. A key is in a shard's map exactly while a call for it is in
// flight.
type coalescer struct {
	seed   maphash.Seed
	shards [coalesceShards]shard
	// stranded counts permits granted to a batch whose callers had all
	// given up, with nobody in line who could take them.
	stranded atomic.Int64
	// stallAfter: see the constant; tests that hold a line set it longer.
	stallAfter time.Duration
	// byWait: the bucket's round trip places each caller within its own
	// wait (roundTrip's waits): batches go least wait first.
	byWait bool
	// beforeBatch, when set (tests only), runs before each coalesced
	// call with its k; afterBatch after its answer came, before it is
	// handed out (a runner descheduled then, on a busy machine).
	beforeBatch func(k int64)
	afterBatch  func()
}

type shard struct {
	mu    sync.Mutex
	lines map[string]*line
}

// line is one key's queue while a call for it is in flight.
type line struct {
	q         []*queuedTake
	since     time.Time // when the call in flight began
	bypassing bool      // a caller asks around a stuck call (at most one)
	// watch checks, while callers are queued, whether the call in flight
	// has stalled (watchStall): one timer per line, not per caller.
	watch    *time.Timer
	watching bool // watch is set to fire
}

// queuedTake is one caller's Take queued in its key's line for the next batch.
type queuedTake struct {
	ctx     context.Context
	maxWait time.Duration // counted from since
	since   time.Time     // when its Take queued
	ch      chan answer   // buffered: the runner never blocks on it
	state   atomic.Int32
}

const (
	waiting int32 = iota // queued for the next batch
	batched              // in a batch whose call is in flight
	gone                 // the caller gave up, or asked on its own
	served               // an answer was sent
)

// stallAfter is how long a call in flight may hold up the callers of its
// key before one of them (one at a time, never a crowd: that would fill
// the connection pool) asks Redis on its own around it: a caller arriving
// while the call has run longer than that, or queued behind it that long.
// It covers a call stuck on a dead connection; a slow store slows every
// call alike, and the others keep waiting in line.
const stallAfter = 50 * time.Millisecond

type answer struct {
	d   throttle.Decision
	err error
	at  time.Time // when the store's answer came (see fresh)
	// bypass: no answer; the call in flight has stalled, and this caller
	// is the one to ask around it (watchStall).
	bypass bool
}

// fresh returns d, a decision of the store's answer that came at at, as of
// now: a grant's time, margin and next place count from when Take returns
// ([throttle.Decision]), so the time the answer took to reach its caller
// (a runner or a caller descheduled on a busy machine, a process stalled)
// comes off them, as the round trip does. A refusal is left as it is: its
// Delay must stay positive, and named a little late it only makes the
// caller ask a little later.
func fresh(d throttle.Decision, at time.Time) throttle.Decision {
	age := time.Since(at)
	if !d.Granted || at.IsZero() || age <= 0 {
		return d
	}
	if late := age - d.Delay; d.Granted && d.Margin > 0 && late > 0 {
		d.Margin = max(d.Margin-late, 1) // 0 would bound nothing
	}
	d.Delay = max(d.Delay-age, 0)
	d.Next = max(d.Next-age, 0)
	return d
}

func newCoalescer() *coalescer {
	return &coalescer{seed: maphash.MakeSeed(), stallAfter: stallAfter}
}

func (c *coalescer) shard(key string) *shard {
	return &c.shards[maphash.String(c.seed, key)%coalesceShards]
}

// coalesced is Take for n == 1 through the coalescer: one is the uncoalesced
// take (run in the caller's goroutine when no call for key is in flight),
// many the round trip of the coalesced ones.
func (b *common) coalesced(ctx context.Context, key string, maxWait time.Duration,
	one func(context.Context) (throttle.Decision, error), many roundTrip) (throttle.Decision, error) {
	c := b.co
	if c == nil { // coalescing off (benchmarks' baseline)
		return bounded(ctx, b, key, one)
	}
	s := c.shard(key)
	s.mu.Lock()
	now := time.Now()
	ln := s.lines[key]
	if ln == nil {
		if s.lines == nil {
			s.lines = make(map[string]*line)
		}
		s.lines[key] = &line{since: now}
		s.mu.Unlock()
		d, err := bounded(ctx, b, key, one)
		b.handOff(s, key, many)
		return d, err
	}
	stalled := c.stallAfter - now.Sub(ln.since)
	if stalled <= 0 && !ln.bypassing {
		// The call in flight is stuck: ask around it (see stallAfter).
		ln.bypassing = true
		s.mu.Unlock()
		return b.bypass(ctx, s, ln, key, one)
	}
	w := &queuedTake{ctx: ctx, maxWait: maxWait, since: now, ch: make(chan answer, 1)}
	ln.q = append(ln.q, w)
	if !ln.watching {
		b.watchStall(s, key, ln, max(stalled, c.stallAfter/4))
	}
	s.mu.Unlock()
	var a answer
	select {
	case a = <-w.ch:
	case <-ctx.Done():
		if w.state.CompareAndSwap(waiting, gone) || w.state.CompareAndSwap(batched, gone) {
			tag, _ := b.ks.tag(b.name, key)
			return throttle.Decision{}, backend("take", tag, fmt.Errorf("no reply from redis before the context ended: %w", ctx.Err()))
		}
		a = <-w.ch // answered as we gave up: the answer wins
	}
	if a.bypass {
		return b.bypass(ctx, s, ln, key, one)
	}
	return fresh(a.d, a.at), a.err
}

// watchStall sets ln's watch to fire after d (s.mu held): then callers
// that gave up leave the line and, if the call in flight has run
// stallAfter or longer and nobody asks around it, the first caller still
// waiting is told to (see stallAfter); while callers wait, it looks again
// every stallAfter/4 at least. It ends with the line, or when nobody waits.
func (b *common) watchStall(s *shard, key string, ln *line, d time.Duration) {
	ln.watching = true
	if ln.watch != nil {
		ln.watch.Reset(d)
		return
	}
	ln.watch = time.AfterFunc(d, func() {
		c := b.co
		s.mu.Lock()
		defer s.mu.Unlock()
		ln.watching = false
		if s.lines[key] != ln {
			return // the line has ended
		}
		ln.q = slices.DeleteFunc(ln.q, func(w *queuedTake) bool { return w.state.Load() == gone })
		if len(ln.q) == 0 {
			return // nobody to look after: the next caller to queue sets the watch again
		}
		stalled := c.stallAfter - time.Since(ln.since)
		if stalled <= 0 && !ln.bypassing {
			for _, w := range ln.q {
				if w.ctx.Err() == nil && w.state.CompareAndSwap(waiting, gone) {
					ln.bypassing = true
					w.ch <- answer{bypass: true}
					break
				}
			}
		}
		b.watchStall(s, key, ln, max(stalled, c.stallAfter/4))
	})
}

// endLine takes key's line ln out of the map (s.mu held): no call for
// key is in flight any more.
func (s *shard) endLine(key string, ln *line) {
	delete(s.lines, key)
	if ln.watch != nil {
		ln.watch.Stop()
	}
	ln.watching = false
}

// bypass is an uncoalesced take by the one caller of key allowed to ask
// around a stuck call in flight.
func (b *common) bypass(ctx context.Context, s *shard, ln *line, key string, one func(context.Context) (throttle.Decision, error)) (throttle.Decision, error) {
	defer func() {
		s.mu.Lock()
		ln.bypassing = false
		s.mu.Unlock()
	}()
	return bounded(ctx, b, key, one)
}

// handOff ends a call for key: if callers queued meanwhile, a runner
// serves them; otherwise the key leaves the map.
func (b *common) handOff(s *shard, key string, many roundTrip) {
	s.mu.Lock()
	ln := s.lines[key]
	if len(ln.q) == 0 {
		s.endLine(key, ln)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	b.calls.inflight.Add(1)
	go b.run(s, key, ln, many)
}

// run serves key's queue, one coalesced call at a time, until it is empty.
// Its lifetime is bounded by the calls it makes, each bounded by the
// latest deadline of its callers.
func (b *common) run(s *shard, key string, ln *line, many roundTrip) {
	defer b.calls.inflight.Add(-1)
	var batch []*queuedTake
	for {
		s.mu.Lock()
		batch = batch[:0]
		now := time.Now()
		taken := 0
		for _, w := range ln.q {
			if len(batch) == maxBatch {
				break // the others go in the next batch
			}
			taken++
			// A caller whose deadline has passed is left out: it
			// returns when its context's timer fires (which may lag
			// the clock on a busy machine), and asking Redis for it
			// would only fail at once.
			if dl, ok := w.ctx.Deadline(); (!ok || dl.After(now)) && w.state.CompareAndSwap(waiting, batched) {
				batch = append(batch, w)
			}
		}
		ln.since = now
		left := copy(ln.q, ln.q[taken:])
		clear(ln.q[left:])
		ln.q = ln.q[:left]
		if len(batch) == 0 {
			s.endLine(key, ln)
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		b.serve(s, ln, key, batch, many)
	}
}

// serve makes one coalesced call for batch and hands out its answer. The
// batch goes in arrival order, or for a byWait bucket least wait left
// first (see the package doc): the earliest places go to those who can
// wait least.
func (b *common) serve(s *shard, ln *line, key string, batch []*queuedTake, many roundTrip) {
	now := time.Now()
	if b.co.byWait {
		slices.SortStableFunc(batch, func(x, y *queuedTake) int {
			return cmp.Compare(x.waitLeft(now), y.waitLeft(now))
		})
	}
	var waits []time.Duration
	least := batch[0].waitLeft(now)
	for _, w := range batch {
		least = min(least, w.waitLeft(now))
		if b.co.byWait {
			waits = append(waits, w.waitLeft(now))
		}
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	k := int64(len(batch))
	if b.co.beforeBatch != nil {
		b.co.beforeBatch(k)
	}
	sent := time.Now()
	u, err := many(ctx, key, -k, least, waits)
	at := time.Now()
	if b.co.afterBatch != nil {
		b.co.afterBatch()
	}
	if err != nil {
		for _, w := range batch {
			w.send(answer{err: err})
		}
		return
	}
	// The permit of a caller that gave up (the earliest such first) goes
	// to the next one refused that can wait for it, or to the first
	// queued for the next batch that can; never to two. A placed permit
	// (byWait: a place, a slot) carries its time, and fresh counts from
	// it for whoever holds it. Any other bucket's permit counts from when
	// the store decided it, in the call: it goes only to a caller queued
	// before the call was sent, so that every grant is decided after its
	// caller asked.
	var spare []int64
	for i, w := range batch {
		d := u.forCaller(int64(i))
		if d.Granted {
			if !w.send(answer{d: d, at: at}) {
				spare = append(spare, int64(i))
			}
			continue
		}
		if len(spare) > 0 {
			if g := u.forCaller(spare[0]); g.Delay <= w.waitLeft(time.Now()) && w.send(answer{d: g, at: at}) {
				spare = spare[1:]
				continue
			}
		}
		w.send(answer{d: d, at: at})
	}
	if len(spare) == 0 {
		return
	}
	s.mu.Lock()
	kept := ln.q[:0]
	for _, w := range ln.q {
		if len(spare) > 0 && (b.co.byWait || w.since.Before(sent)) && w.state.Load() == waiting {
			d := u.forCaller(spare[0])
			if !w.since.Before(sent) {
				// Its caller's own call would be sent after the store
				// decided: a next place counted from that would be late.
				d.Next = 0
			}
			if d.Delay <= w.waitLeft(time.Now()) && w.send(answer{d: d, at: at}) {
				spare = spare[1:]
				continue
			}
		}
		kept = append(kept, w)
	}
	clear(ln.q[len(kept):])
	ln.q = kept
	s.mu.Unlock()
	b.co.stranded.Add(int64(len(spare)))
}

// waitLeft is what is left at now of w's maxWait, which counts from its
// Take: a slot reserved for it must come within that, not within maxWait
// from the moment its batch is sent.
func (w *queuedTake) waitLeft(now time.Time) time.Duration {
	return max(w.maxWait-now.Sub(w.since), 0)
}

// send answers w, in a batch or still queued, unless it gave up; it
// reports whether w got the answer.
func (w *queuedTake) send(a answer) bool {
	if !w.state.CompareAndSwap(batched, served) && !w.state.CompareAndSwap(waiting, served) {
		return false
	}
	w.ch <- a
	return true
}

// batchGrace is how long a coalesced call outlives the latest deadline of
// its callers, so that a caller always sees its own context end (and
// returns as an uncoalesced caller cut off mid-call does) before the call
// fails for the same deadline.
const batchGrace = 5 * time.Millisecond

// batchContext is the context of a coalesced call: it keeps the values of
// the first caller's, ends batchGrace after the latest deadline among the
// callers (none if one has none), and is not cancelled when a caller's
// context is.
func batchContext(batch []*queuedTake) (context.Context, context.CancelFunc) {
	base := context.WithoutCancel(batch[0].ctx)
	var latest time.Time
	for _, w := range batch {
		dl, ok := w.ctx.Deadline()
		if !ok {
			return context.WithCancel(base)
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	return context.WithDeadline(base, latest.Add(batchGrace))
}
