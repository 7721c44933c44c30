package consumer

import (
	"context"
	"sync"
	"sync/atomic"
)

// sched hands partitions with ready records to the consumer's workers.
// There are at most WithMaxInFlight workers, started as needed and kept
// until Run ends; a worker holds one record at a time, from the moment it
// takes it (before its permit wait) to the moment it finishes it, so the
// workers are the in-flight bound. A partition is queued once however
// many records it has ready, and queued again after each record a worker
// takes from it: partitions with ready records take turns.
type sched struct {
	c    *Consumer
	mu   sync.Mutex
	cond sync.Cond
	// queue holds the partitions with ready records, in turn; jobs the
	// records WithFairness hands to workers, each with its permit.
	queue fifo[*partition]
	jobs  fifo[job]
	// workers counts the workers started; idle those waiting for a
	// partition, and woken those of them signalled and not yet awake.
	workers, idle, woken int
	quit                 bool
	wg                   sync.WaitGroup
	// all holds every worker started, for endCalls.
	all []*worker
}

// worker is one of the sched's goroutines.
type worker struct {
	s *sched
	// call is the context of the handler call running, if any.
	call atomic.Pointer[callCtx]
	// pre is the permit its record was handed with (WithFairness), for
	// the record's first attempt.
	pre *grant
}

// job is work for a worker: a partition to take a ready record from, or
// (WithFairness) record r of p, with the permit g (nil: it needs none).
type job struct {
	p *partition
	r *record
	g *grant
}

func (s *sched) init(c *Consumer) {
	s.c = c
	s.cond.L = &s.mu
}

// enqueue queues p, unless it is queued already, and wakes or starts a
// worker for it.
//
// A partition popped by next is marked unqueued before its worker takes a
// record from it; a record made ready meanwhile is seen by that take, so
// an enqueue that still sees the mark may skip the lock.
func (s *sched) enqueue(p *partition) {
	if p.queued.Load() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.quit || !p.queued.CompareAndSwap(false, true) {
		return
	}
	s.queue.push(p)
	s.wake()
}

// enqueueJob queues j for a worker, and wakes or starts one; false once
// stop was called.
func (s *sched) enqueueJob(j job) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.quit {
		return false
	}
	s.jobs.push(j)
	s.wake()
	return true
}

// wake wakes or starts a worker; s.mu is held.
func (s *sched) wake() {
	switch {
	case s.idle > s.woken:
		s.woken++
		s.cond.Signal()
	case s.workers < s.c.cfg.maxInFlight:
		s.workers++
		s.wg.Add(1)
		w := &worker{s: s}
		s.all = append(s.all, w)
		go w.work()
	}
}

// next returns the next job (a record handed with its permit, or a
// queued partition), waiting for one; a zero job once stop was called.
func (s *sched) next() job {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.queue.len() == 0 && s.jobs.len() == 0 && !s.quit {
		s.idle++
		s.cond.Wait()
		s.idle--
		if s.woken > 0 {
			s.woken--
		}
	}
	if s.quit {
		return job{}
	}
	if s.jobs.len() > 0 {
		return s.jobs.pop()
	}
	p := s.queue.pop()
	p.queued.Store(false)
	return job{p: p}
}

// work is a worker: it takes a ready record of the next queued partition
// and processes it, until stop.
func (w *worker) work() {
	s := w.s
	defer s.wg.Done()
	c := s.c
	for {
		j := s.next()
		p := j.p
		if p == nil {
			return
		}
		if j.r != nil {
			w.runHanded(j)
			continue
		}
		r := p.begin()
		if r == nil {
			continue
		}
		c.active.Add(1)
		out := p.process(w, r)
		c.active.Add(-1)
		p.end(r, out)
	}
}

// runHanded processes a record WithFairness handed to the worker, with
// its permit.
func (w *worker) runHanded(j job) {
	c, p := w.s.c, j.p
	defer c.fair.untake()
	if !p.take(j.r) {
		if j.g != nil {
			j.g.drop(c) // its partition stopped: the permit is not used
		}
		return
	}
	w.pre = j.g
	c.active.Add(1)
	out := p.process(w, j.r)
	c.active.Add(-1)
	if w.pre != nil {
		w.pre.drop(c) // not used (the record was parked)
		w.pre = nil
	}
	p.end(j.r, out)
}

// endCalls cancels the running handler calls of p. p.callsEnded is set
// first, and a worker publishes its call before it checks the flag, so a
// call that starts meanwhile is cancelled by one or the other.
func (s *sched) endCalls(p *partition) {
	s.mu.Lock()
	all := s.all
	s.mu.Unlock()
	for _, w := range all {
		if call := w.call.Load(); call != nil && call.p == p {
			call.cancel(context.Canceled)
		}
	}
}

// stop ends the workers once they are done with their records, and
// waits for them.
func (s *sched) stop() {
	s.mu.Lock()
	s.quit = true
	for s.jobs.len() > 0 {
		if g := s.jobs.pop().g; g != nil {
			g.drop(s.c) // never taken: its concurrency slot goes back, its permit unused
		}
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	s.wg.Wait()
}
