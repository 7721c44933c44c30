package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/throttle"
)

// partition is one assigned partition: a queue filled by the poll loop and
// one goroutine (run) that takes a permit for each record, then handles it,
// in order.
type partition struct {
	c     *Consumer
	cl    *kgo.Client
	topic string
	id    int32

	// soft ends permit waits and retry delays: cancelled on revoke, loss
	// and shutdown. hard ends the handler's call: cancelled only when a
	// stop gives up waiting for it (fence), or when run exits.
	soft       context.Context
	cancelSoft context.CancelFunc
	hard       context.Context
	cancelHard context.CancelFunc

	done chan struct{} // closed when run has exited
	wake chan struct{} // a push happened; capacity 1
	// after is the goroutine of an earlier ownership of this partition
	// that had not exited when this one was assigned; run waits for it.
	after *partition

	mu      sync.Mutex
	queue   []*kgo.Record
	holding bool // run holds a record taken from the queue
	waiting bool // run waits for a permit
	paused  bool // this partition's fetches are paused
	closed  bool // no more records are queued, no more pause or resume
	fenced  bool // no more marks: the partition is no longer ours
}

func newPartition(c *Consumer, cl *kgo.Client, topic string, id int32) *partition {
	p := &partition{
		c:     c,
		cl:    cl,
		topic: topic,
		id:    id,
		done:  make(chan struct{}),
		wake:  make(chan struct{}, 1),
	}
	p.soft, p.cancelSoft = context.WithCancel(c.base)
	p.hard, p.cancelHard = context.WithCancel(c.base)
	return p
}

func (p *partition) tps() map[string][]int32 { return map[string][]int32{p.topic: {p.id}} }

// push queues records from the poll loop. It never blocks: once the queue
// holds queueSize records the partition's fetches are paused, so that no
// more of its records are polled until run has taken half of them.
func (p *partition) push(recs []*kgo.Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.queue = append(p.queue, recs...)
	n := len(p.queue)
	if p.holding {
		n++
	}
	p.c.notePeak(int64(n))
	if !p.paused && len(p.queue) >= p.c.cfg.queueSize {
		p.cl.PauseFetchPartitions(p.tps())
		p.paused = true
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// pop takes the next record, waiting for one; nil once soft has ended.
func (p *partition) pop() *kgo.Record {
	for {
		p.mu.Lock()
		p.holding = false
		if p.soft.Err() != nil {
			p.mu.Unlock()
			return nil
		}
		if len(p.queue) > 0 {
			rec := p.queue[0]
			p.queue[0] = nil
			p.queue = p.queue[1:]
			p.holding = true
			if p.paused && !p.closed && len(p.queue) <= p.c.cfg.queueSize/2 {
				p.cl.ResumeFetchPartitions(p.tps())
				p.paused = false
			}
			p.mu.Unlock()
			return rec
		}
		p.mu.Unlock()
		select {
		case <-p.wake:
		case <-p.soft.Done():
		}
	}
}

// close stops queueing and cancels waits; run exits after the record in
// hand, if any.
func (p *partition) close() {
	p.mu.Lock()
	p.closed = true
	p.queue = nil
	p.mu.Unlock()
	p.cancelSoft()
}

// fence forbids any further mark and cancels the handler's context.
func (p *partition) fence() {
	p.mu.Lock()
	p.fenced = true
	p.mu.Unlock()
	p.cancelHard()
}

// mark marks rec for commit unless the partition has been fenced. Holding
// p.mu across the mark orders it before or after fence, never across.
func (p *partition) mark(rec *kgo.Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.fenced {
		p.cl.MarkCommitRecords(rec)
	}
}

func (p *partition) run() {
	defer p.c.wg.Done()
	defer close(p.done)
	defer p.c.exited(p)
	defer p.cancelHard()
	defer func() {
		p.mu.Lock()
		p.closed, p.queue, p.holding = true, nil, false
		p.mu.Unlock()
	}()
	if p.after != nil {
		select {
		case <-p.after.done:
		case <-p.soft.Done():
			return
		}
	}
	for {
		rec := p.pop()
		if rec == nil || !p.process(rec) {
			return
		}
	}
}

// process takes permits for rec and handles it, retrying as configured,
// until it is handled or dead-lettered (true), or the partition stops or
// the consumer fails (false). On false rec is not marked.
func (p *partition) process(rec *kgo.Record) bool {
	c := p.c
	var (
		attempts int
		delays   int // permit timeouts or limiter failures in a row
		lastErr  error
	)
	for {
		err := p.acquire(rec)
		switch {
		case err == nil:
			delays = 0
			attempts++
			if lastErr = p.call(rec); lastErr == nil {
				p.mark(rec)
				c.handled.Add(1)
				return true
			}
		case p.soft.Err() != nil:
			return false
		case errors.Is(err, throttle.ErrTimeout):
			c.permitTimeouts.Add(1)
			if c.cfg.onTimeout == TimeoutRetry {
				delays++
				if !p.sleep(c.backoff(delays)) {
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
			d := c.backoff(delays)
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
			c.retried.Add(1)
			d := c.backoff(attempts)
			c.log.Debug("consumer: attempt failed; retrying", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "attempt", attempts, "in", d, "err", lastErr)
			if !p.sleep(d) {
				return false
			}
			continue
		}
		return p.exhausted(rec, attempts, lastErr)
	}
}

// acquire waits for rec's permit.
func (p *partition) acquire(rec *kgo.Record) error {
	c := p.c
	k := c.cfg.limiterFor(rec)
	p.setWaiting(true)
	c.waiting.Add(1)
	start := time.Now()
	err := k.Acquire(p.soft, c.cfg.maxWait)
	c.permitWait.Add(int64(time.Since(start)))
	c.waiting.Add(-1)
	p.setWaiting(false)
	return err
}

func (p *partition) setWaiting(w bool) {
	p.mu.Lock()
	p.waiting = w
	p.mu.Unlock()
}

// call runs the handler once, within the handler timeout.
func (p *partition) call(rec *kgo.Record) error {
	c := p.c
	ctx, cancel := context.WithTimeout(p.hard, c.cfg.handlerTimeout)
	defer cancel()
	c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
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
func (p *partition) exhausted(rec *kgo.Record, attempts int, lastErr error) bool {
	c := p.c
	herr := &HandlerError{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Attempts: attempts, Err: lastErr}
	if c.cfg.deadLetter == "" {
		c.fail(herr)
		return false
	}
	dl := deadLetter(c.cfg.deadLetter, rec, attempts, lastErr)
	if err := p.cl.ProduceSync(p.soft, dl).FirstErr(); err != nil {
		if p.soft.Err() != nil {
			return false
		}
		c.fail(fmt.Errorf("consumer: dead-lettering record %s[%d]@%d to %s: %w (record error: %w)", rec.Topic, rec.Partition, rec.Offset, c.cfg.deadLetter, err, lastErr))
		return false
	}
	p.mark(rec)
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
		kgo.RecordHeader{Key: HeaderError, Value: []byte(lastErr.Error())},
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
