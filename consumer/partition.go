package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/throttle"
)

// partition is one assigned partition. The poll loop appends its records
// to pending (offset order) and, by the ordering, either to ready or to
// the queue of a key that already has a record ready or in flight. One
// goroutine (run) takes ready records, each with a slot of the consumer's
// in-flight bound, and starts a worker per record; a worker takes permits,
// calls the handler, retries, and finishes the record. Finished records at
// the front of pending are the watermark: the last of them is marked for
// commit.
type partition struct {
	c     *Consumer
	cl    *kgo.Client
	topic string
	id    int32

	// soft ends permit waits and retry delays: cancelled on revoke, loss
	// and shutdown. hard ends the handler's calls: cancelled only when a
	// stop gives up waiting for them (fence), or when run exits. hard is
	// split in shards, so that many calls starting at once do not all
	// register with one parent context (and contend for its lock).
	soft       context.Context
	cancelSoft context.CancelFunc
	hard       [hardShards]context.Context
	cancelHard [hardShards]context.CancelFunc
	calls      atomic.Uint32 // picks a shard of hard per call

	done chan struct{} // closed when run and every worker have exited
	wake chan struct{} // a record became ready; capacity 1
	// after holds the goroutines of earlier ownerships of this partition
	// that had not exited when this one was assigned; run waits for them.
	after []*partition

	workers sync.WaitGroup

	mu sync.Mutex
	// pending holds every record taken from Kafka and not yet behind the
	// watermark, in offset order: queued, in flight, or finished after an
	// unfinished one.
	pending []*slot
	// ready holds records whose turn has come, oldest first.
	ready []*slot
	// keys holds, for each key with a record ready or in flight, the
	// key's later records (ByKey and ByPartition only).
	keys    map[string]*keyQueue
	waiting atomic.Int32 // workers waiting for a permit
	paused  bool         // this partition's fetches are paused
	closed  bool         // no more records are queued, no more pause or resume
	fenced  bool         // no more marks: the partition is no longer ours
}

// hardShards is how many contexts hard is split in.
const hardShards = 16

// slot is one record in pending.
type slot struct {
	rec  *kgo.Record
	key  string
	done bool // handled or dead-lettered
}

// keyQueue holds a key's records behind the one ready or in flight.
type keyQueue struct {
	next []*slot
}

func newPartition(c *Consumer, cl *kgo.Client, topic string, id int32) *partition {
	p := &partition{
		c:     c,
		cl:    cl,
		topic: topic,
		id:    id,
		done:  make(chan struct{}),
		wake:  make(chan struct{}, 1),
		keys:  make(map[string]*keyQueue),
	}
	p.soft, p.cancelSoft = context.WithCancel(c.base)
	for i := range p.hard {
		p.hard[i], p.cancelHard[i] = context.WithCancel(c.base)
	}
	return p
}

func (p *partition) tps() map[string][]int32 { return map[string][]int32{p.topic: {p.id}} }

// keyOf returns the key that orders rec, and false under Unordered.
func (p *partition) keyOf(rec *kgo.Record) (string, bool) {
	switch p.c.cfg.ordering {
	case ByKey:
		return string(rec.Key), true
	case ByPartition:
		return "", true
	}
	return "", false
}

// push queues records from the poll loop. It never blocks: once the
// partition holds queueSize records its fetches are paused, so that no
// more of its records are polled until it holds half as many.
func (p *partition) push(recs []*kgo.Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	for _, rec := range recs {
		s := &slot{rec: rec}
		p.pending = append(p.pending, s)
		key, ordered := p.keyOf(rec)
		if !ordered {
			p.ready = append(p.ready, s)
			continue
		}
		s.key = key
		if q := p.keys[key]; q != nil {
			q.next = append(q.next, s)
			continue
		}
		p.keys[key] = &keyQueue{}
		p.ready = append(p.ready, s)
	}
	p.c.notePeak(int64(len(p.pending)))
	if !p.paused && len(p.pending) >= p.c.cfg.queueSize {
		p.cl.PauseFetchPartitions(p.tps())
		p.paused = true
	}
	p.signal()
}

// signal wakes run; p.mu is held.
func (p *partition) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// next takes the next ready record, waiting for one; nil once soft has
// ended.
func (p *partition) next() *slot {
	for {
		p.mu.Lock()
		if p.soft.Err() != nil {
			p.mu.Unlock()
			return nil
		}
		if len(p.ready) > 0 {
			s := p.ready[0]
			p.ready[0] = nil
			p.ready = p.ready[1:]
			p.mu.Unlock()
			return s
		}
		p.mu.Unlock()
		select {
		case <-p.wake:
		case <-p.soft.Done():
		}
	}
}

// finish records the outcome of s's worker. A finished record (ok) lets
// the next record of its key become ready and, if it closes the gap at
// the front of pending, moves the watermark: the last finished record of
// the unbroken run from the front is marked for commit. An unfinished one
// (the partition stopped or the consumer failed) is left as it is: its
// key and the watermark stay behind it, so neither it nor anything after
// it is committed.
func (p *partition) finish(s *slot, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !ok {
		return
	}
	s.done = true
	if q := p.keys[s.key]; q != nil && p.c.cfg.ordering != Unordered {
		if len(q.next) > 0 {
			n := q.next[0]
			q.next[0] = nil
			q.next = q.next[1:]
			p.ready = append(p.ready, n)
			p.signal()
		} else {
			delete(p.keys, s.key)
		}
	}
	var last *slot
	for len(p.pending) > 0 && p.pending[0].done {
		last = p.pending[0]
		p.pending[0] = nil
		p.pending = p.pending[1:]
	}
	if last == nil {
		return
	}
	if !p.fenced {
		p.cl.MarkCommitRecords(last.rec)
	}
	if p.paused && !p.closed && len(p.pending) <= p.c.cfg.queueSize/2 {
		p.cl.ResumeFetchPartitions(p.tps())
		p.paused = false
	}
}

// close stops queueing and cancels waits; run exits once the records in
// hand are done.
func (p *partition) close() {
	p.mu.Lock()
	p.closed = true
	p.ready, p.keys = nil, nil
	p.mu.Unlock()
	p.cancelSoft()
}

// fence forbids any further mark and cancels the handlers' contexts.
func (p *partition) fence() {
	p.mu.Lock()
	p.fenced = true
	p.mu.Unlock()
	p.endCalls()
}

// endCalls cancels every handler call's context.
func (p *partition) endCalls() {
	for _, cancel := range p.cancelHard {
		cancel()
	}
}

// isFenced reports whether fence was called.
func (p *partition) isFenced() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fenced
}

// run hands ready records to workers, each with a slot of the consumer's
// in-flight bound, until the partition stops; then it waits for its
// workers.
func (p *partition) run() {
	defer p.c.wg.Done()
	defer close(p.done)
	defer p.c.exited(p)
	defer p.endCalls()
	defer func() {
		p.workers.Wait()
		p.mu.Lock()
		p.closed = true
		p.pending, p.ready, p.keys = nil, nil, nil
		p.mu.Unlock()
	}()
	for _, earlier := range p.after {
		select {
		case <-earlier.done:
		case <-p.soft.Done():
			return
		}
	}
	c := p.c
	for {
		s := p.next()
		if s == nil {
			return
		}
		select {
		case c.slots <- struct{}{}:
		case <-p.soft.Done():
			return
		}
		p.workers.Add(1)
		go p.work(s)
	}
}

// work handles one record in its own goroutine, holding a slot.
//
// When s is done and another record of the partition is ready, the worker
// goes on with it, keeping its slot, as long as another slot of the
// consumer is free (then no other partition waits for one): one goroutine
// serves many
// records in a row, as fast as a pool, and a partition with work always
// queued cannot keep slots that other partitions wait for.
func (p *partition) work(s *slot) {
	c := p.c
	defer func() {
		<-c.slots
		p.workers.Done()
	}()
	for s != nil {
		c.active.Add(1)
		p.finish(s, p.process(s.rec))
		c.active.Add(-1)
		s = nil
		if len(c.slots) < cap(c.slots) {
			s = p.take()
		}
	}
}

// take pops a ready record without waiting; nil if none is ready or soft
// has ended.
func (p *partition) take() *slot {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ready) == 0 || p.soft.Err() != nil {
		return nil
	}
	s := p.ready[0]
	p.ready[0] = nil
	p.ready = p.ready[1:]
	return s
}

// process takes permits for rec and handles it, retrying as configured,
// until it is handled or dead-lettered (true), or the partition stops or
// the consumer fails (false).
func (p *partition) process(rec *kgo.Record) bool {
	c := p.c
	var (
		attempts int
		delays   int // permit timeouts or limiter failures in a row
		lastErr  error
	)
	for {
		k, err := p.acquire(rec)
		switch {
		case err == nil:
			delays = 0
			attempts++
			if lastErr = p.call(rec, k); lastErr == nil {
				c.handled.Add(1)
				return true
			}
			c.reportAnswer(p.soft, rec, lastErr) // the adaptive rate (answer.go)
		case p.soft.Err() != nil:
			return false
		case errors.Is(err, throttle.ErrTimeout):
			c.permitTimeouts.Add(1)
			if c.cfg.onTimeout == TimeoutRetry {
				delays++
				if !p.sleep(c.permitBackoff(delays)) {
					return false
				}
				continue
			}
			attempts++
			lastErr = err
		case errors.Is(err, throttle.ErrInvalid), errors.Is(err, throttle.ErrExceedsLimit):
			// Waiting cannot help: the limiter is misconfigured.
			c.fail(fmt.Errorf("consumer: permit for record %s[%d]@%d: %w", rec.Topic, rec.Partition, rec.Offset, err))
			return false
		default:
			// The limiter's store failed. That is no fault of the
			// record's, so it uses up no attempt; back off and ask
			// again.
			c.limiterErrors.Add(1)
			delays++
			d := c.permitBackoff(delays)
			c.log.Warn("consumer: limiter failed; retrying", "topic", p.topic, "partition", p.id, "in", d, "err", err)
			if !p.sleep(d) {
				return false
			}
			continue
		}

		// The attempt failed.
		if p.soft.Err() != nil {
			return false // no longer ours to retry; the next owner will
		}
		if attempts < c.cfg.attempts {
			d := c.backoff(attempts)
			c.log.Debug("consumer: attempt failed; retrying", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "attempt", attempts, "in", d, "err", lastErr)
			if !p.sleep(d) {
				return false // no retry: not counted
			}
			c.retried.Add(1)
			continue
		}
		return p.exhausted(rec, attempts, lastErr)
	}
}

// acquire waits for rec's permit and returns the budget it came from; a
// zero Keyed (no limiter for rec) takes no permit.
func (p *partition) acquire(rec *kgo.Record) (throttle.Keyed, error) {
	c := p.c
	k := c.cfg.limiterFor(rec)
	if k.Limiter() == nil {
		return k, nil
	}
	p.waiting.Add(1)
	c.waitingRecords.Add(1)
	start := time.Now()
	err := k.Acquire(p.soft, c.cfg.maxWait)
	c.permitWait.Add(int64(time.Since(start)))
	c.waitingRecords.Add(-1)
	p.waiting.Add(-1)
	return k, err
}

// call runs the handler once, within the handler timeout. Its context
// holds the attempt's permit (k's), so that a client on the same budget
// inside the handler uses it rather than taking a second one.
func (p *partition) call(rec *kgo.Record, k throttle.Keyed) error {
	c := p.c
	hard := p.hard[p.calls.Add(1)%hardShards]
	ctx, cancel := context.WithTimeout(hard, c.cfg.handlerTimeout)
	defer cancel()
	ctx = k.ContextWithPermit(ctx, 1)
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

// exhausted deals with a record whose every attempt failed: to the
// dead-letter topic, or stop the consumer.
//
// The dead-letter write's context is the consumer's, not the partition's,
// and has no deadline of its own: kgo fails a whole produce batch when its
// first record's context ends, and dead-letter records of several
// partitions share batches, so a context that one partition's revocation
// (or a per-write timeout) could end would fail the other partitions'
// writes, and stop the consumer. The write ends when the broker answers,
// kgo's own delivery limits give up (kgo.RecordDeliveryTimeout,
// kgo.RecordRetries), or the client closes at the end of Run. A revoked
// partition waits for its write like for a handler call, and abandons it
// at the handler timeout (its record is then never committed).
func (p *partition) exhausted(rec *kgo.Record, attempts int, lastErr error) bool {
	c := p.c
	herr := &HandlerError{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Attempts: attempts, Err: lastErr}
	if c.cfg.deadLetter == "" {
		c.fail(herr)
		return false
	}
	dl := deadLetter(c.cfg.deadLetter, rec, attempts, lastErr)
	if err := p.cl.ProduceSync(c.base, dl).FirstErr(); err != nil {
		if p.soft.Err() != nil {
			return false
		}
		c.fail(fmt.Errorf("consumer: dead-lettering record %s[%d]@%d to %s: %w (record error: %w)", rec.Topic, rec.Partition, rec.Offset, c.cfg.deadLetter, err, lastErr))
		return false
	}
	c.deadLettered.Add(1)
	c.log.Warn("consumer: record dead-lettered", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "to", c.cfg.deadLetter, "attempts", attempts, "err", lastErr)
	return true
}

// deadLetter builds the dead-letter copy of rec.
func deadLetter(topic string, rec *kgo.Record, attempts int, lastErr error) *kgo.Record {
	headers := make([]kgo.RecordHeader, 0, len(rec.Headers)+5)
	headers = append(headers, rec.Headers...)
	headers = append(headers,
		kgo.RecordHeader{Key: HeaderTopic, Value: []byte(rec.Topic)},
		kgo.RecordHeader{Key: HeaderPartition, Value: strconv.AppendInt(nil, int64(rec.Partition), 10)},
		kgo.RecordHeader{Key: HeaderOffset, Value: strconv.AppendInt(nil, rec.Offset, 10)},
		kgo.RecordHeader{Key: HeaderError, Value: errorText(lastErr)},
		kgo.RecordHeader{Key: HeaderAttempts, Value: strconv.AppendInt(nil, int64(attempts), 10)},
	)
	return &kgo.Record{
		Topic:     topic,
		Key:       rec.Key,
		Value:     rec.Value,
		Headers:   headers,
		Timestamp: rec.Timestamp,
	}
}
