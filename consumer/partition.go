package consumer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// partition is one assigned partition. The poll loop copies its records
// (record), appends their offsets to span (offset order) and, by the
// ordering, puts them either in ready or in the queue of their unit (key
// or partition) when the unit already has a record ready or in work.
// Workers (sched) take ready records, take permits, call the handler,
// retry, and finish the record: its copy is dropped, and only its entry in
// span is kept. Finished records at the front of span are the watermark:
// the offset after the last of them is marked for commit (by flush).
type partition struct {
	c     *Consumer
	cl    *kgo.Client // the consumer's client
	topic string
	id    int32

	// soft ends permit waits and retry delays, the consumer's and those
	// in handler calls (throttle.ContextWithWaitStop): cancelled on
	// revoke, loss and shutdown. Handler calls are ended only when a stop
	// gives up waiting for them (fence), or when the partition ends:
	// callsEnded, then endCalls.
	soft       context.Context
	cancelSoft context.CancelCauseFunc
	callsEnded atomic.Bool

	done chan struct{} // closed once stopped and no record is in work
	// after holds the earlier ownerships of this partition that had not
	// ended when this one was assigned: its records are handled only once
	// all have (waitAfter).
	after []*partition

	waiting atomic.Int32 // records waiting for a permit: in work, or queued (WithFairness)
	queued  atomic.Bool  // in the scheduler's queue

	mu sync.Mutex
	// span holds the offset of every record taken from Kafka and not yet
	// behind the watermark, in offset order: queued, in work, or finished
	// after an unfinished one. A finished record is only its entry here.
	span span
	// ready holds records whose turn has come, oldest first.
	ready fifo[*record]
	// units holds, under ByKey, each key with a record ready or in work;
	// whole is the partition's one unit under ByPartition.
	units map[string]*unit
	whole unit
	// unitsPeak is the most units held since units was last built: a map
	// keeps the room of its peak, so it is built anew once it holds far
	// fewer (forget).
	unitsPeak int
	// parks: records of this partition may be parked (shaping is on and
	// this is not the shaping topic). shaped: this is the shaping topic.
	parks, shaped bool
	// through is the offset after the last record behind the watermark,
	// -1 before any.
	through int64
	// bytes is what the records of span count for: the key, value and
	// headers of the unfinished ones plus RecordOverhead each, and
	// spanEntryBytes for each finished one.
	bytes  int64
	paused bool // this partition's fetches are paused
	closed bool // no more records are queued, no more pause or resume
	fenced bool // no more marks: the partition is no longer ours
	// started: the earlier ownerships have ended, records may be taken.
	// waited: waitAfter is done (or was never needed). inWork counts
	// records taken by workers and not yet ended. ended: finalize ran.
	started, waited, ended bool
	inWork                 int
	// mark is the last record behind the watermark; dirty says it is not
	// marked for commit yet.
	mark  kgo.Record
	dirty bool
	// first is the offset of the first record taken, marked the offset
	// after the last record marked for commit: -1 before any (offset
	// maps, offsetmap.go); firstEpoch and markedEpoch are the leader
	// epochs of those records. final is the map of the partition as it
	// ended, hasFinal whether it has one.
	first, marked           int64
	firstEpoch, markedEpoch int32
	final                   offsetMap
	hasFinal                bool
	// skip holds the ranges of offsets the last commit's map says were
	// finished: their records are finished as they come, not handled;
	// those not read yet (at or past next, the offset after the last
	// record taken) go into this ownership's own map.
	// skipChecked (under c.mu) says the consumer's restored maps were
	// looked up for this ownership.
	skip        []offRun
	next        int64
	skipChecked bool
}

// RecordOverhead is what each unfinished record the consumer holds counts
// for in the byte bound of a partition ([WithQueueBytes]), besides its
// key, value and headers: the consumer's own bookkeeping. A finished
// record waiting behind an unfinished one keeps only its offset, and
// counts for 16 bytes.
const RecordOverhead = 320

// spanEntryBytes is what a finished record behind an unfinished one
// costs: the size of its entry in the partition's span.
const spanEntryBytes = 16

// record is one record the consumer holds: a copy of the fetched record,
// so that holding it does not hold the fetched batch it came from.
type record struct {
	// rec is what the handler sees: for a record parked in the shaping
	// topic, the record as it was consumed from its own topic.
	rec  kgo.Record
	unit *unit   // nil under Unordered
	next *record // the unit's next queued record
	// seq is the record's place in its partition's span.
	seq int64
	// attempts were made before the record was parked.
	attempts int
	began    time.Time // when a worker took it
	size     int64     // key, value and headers; 0 once finished
	// tenant and urgent are the record's (WithFairness), once classified.
	tenant             string
	urgent, classified bool
}

// unit is an ordering unit: a key under ByKey, the partition under
// ByPartition. One record of a unit is ready or in work at a time; the
// others wait in its queue, in offset order.
type unit struct {
	key        string
	busy       bool    // a record of the unit is ready or in work
	head, tail *record // queued records
	// holdSince is when a worker took the first record of the unit's
	// current run of records (zero when the unit is idle): what the
	// shaping bound measures.
	holdSince time.Time
	// parked: the unit's records go to the shaping topic, the last of
	// them to parkPart at parkOff, until that one has been handled.
	parked   bool
	parkPart int32
	parkOff  int64
}

func (u *unit) push(r *record) {
	if u.tail == nil {
		u.head = r
	} else {
		u.tail.next = r
	}
	u.tail = r
}

// pushFront puts r back at the head of the unit's queue.
func (u *unit) pushFront(r *record) {
	r.next = u.head
	u.head = r
	if u.tail == nil {
		u.tail = r
	}
}

func (u *unit) pop() *record {
	r := u.head
	if r == nil {
		return nil
	}
	u.head, r.next = r.next, nil
	if u.head == nil {
		u.tail = nil
	}
	return r
}

// span is the uncommitted span of a partition: an entry per record taken
// from Kafka and not yet behind the watermark, in offset order, addressed
// by the record's sequence number (its place among every record the
// partition took).
type span struct {
	buf  []spanEntry
	head int
	base int64 // sequence number of buf[head]
}

// spanEntry is a record of the span: its own offset and leader epoch in
// the partition (for the watermark), and whether it is finished.
type spanEntry struct {
	off   int64
	epoch int32
	done  bool
}

func (q *span) len() int { return len(q.buf) - q.head }

// push appends a record and returns its sequence number.
func (q *span) push(off int64, epoch int32) int64 {
	q.buf = append(q.buf, spanEntry{off: off, epoch: epoch})
	return q.base + int64(len(q.buf)-q.head-1)
}

// finish marks the record of sequence number seq, still in the span,
// finished.
func (q *span) finish(seq int64) { q.buf[q.head+int(seq-q.base)].done = true }

// popDone removes the finished records at the front and returns the last
// of them; ok is false if the front record is not finished.
func (q *span) popDone() (last spanEntry, ok bool) {
	i := q.head
	for i < len(q.buf) && q.buf[i].done {
		i++
	}
	if i == q.head {
		return spanEntry{}, false
	}
	last = q.buf[i-1]
	q.base += int64(i - q.head)
	q.head = i
	switch {
	case q.head == len(q.buf):
		q.buf, q.head = q.buf[:0], 0
		if cap(q.buf) >= minShrink {
			q.buf = nil // a long span does not hold its room
		}
	case q.head >= 1024 && q.head*2 >= len(q.buf):
		n := len(q.buf) - q.head
		if cap(q.buf) >= minShrink && n*4 <= cap(q.buf) {
			q.buf = append([]spanEntry(nil), q.buf[q.head:]...)
		} else {
			copy(q.buf, q.buf[q.head:])
			q.buf = q.buf[:n]
		}
		q.head = 0
	}
	return last, true
}

func (q *span) reset() { *q = span{base: q.base} }

func newPartition(c *Consumer, cl *kgo.Client, topic string, id int32) *partition {
	p := &partition{
		c:       c,
		cl:      cl,
		topic:   topic,
		id:      id,
		done:    make(chan struct{}),
		units:   make(map[string]*unit),
		mark:    kgo.Record{Topic: topic, Partition: id},
		through: -1,
		first:   -1,
		marked:  -1,
	}
	if sh := c.cfg.shaping; sh != "" {
		p.shaped = topic == sh
		p.parks = !p.shaped
	}
	p.soft, p.cancelSoft = context.WithCancelCause(c.base)
	return p
}

func (p *partition) tps() map[string][]int32 { return map[string][]int32{p.topic: {p.id}} }

// copyRecord copies rec into r, the key, value and headers into one
// allocation, and returns their size.
func copyRecord(r *record, rec *kgo.Record, topic string) int64 {
	n := len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += len(h.Value)
	}
	buf := make([]byte, 0, n)
	r.rec = kgo.Record{
		Timestamp:     rec.Timestamp,
		Topic:         topic,
		Partition:     rec.Partition,
		Attrs:         rec.Attrs,
		ProducerEpoch: rec.ProducerEpoch,
		ProducerID:    rec.ProducerID,
		LeaderEpoch:   rec.LeaderEpoch,
		Offset:        rec.Offset,
	}
	if rec.Key != nil {
		buf = append(buf, rec.Key...)
		r.rec.Key = buf[:len(buf):len(buf)]
	}
	if rec.Value != nil {
		at := len(buf)
		buf = append(buf, rec.Value...)
		r.rec.Value = buf[at:len(buf):len(buf)]
	}
	if len(rec.Headers) > 0 {
		hs := make([]kgo.RecordHeader, len(rec.Headers))
		for i, h := range rec.Headers {
			at := len(buf)
			buf = append(buf, h.Value...)
			hs[i] = kgo.RecordHeader{Key: strings.Clone(h.Key), Value: buf[at:len(buf):len(buf)]}
			n += len(h.Key)
		}
		r.rec.Headers = hs
	}
	return int64(n)
}

// push queues records from the poll loop. It never blocks: once the
// partition holds its queue size in records or in bytes, its fetches are
// paused, so that no more of its records are polled until it holds half
// as many of both. Records in the ranges of skip (restore) are finished
// at once.
func (p *partition) push(recs []*kgo.Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	c := p.c
	var skipped int64
	for _, rec := range recs {
		if p.first < 0 {
			p.first, p.firstEpoch = rec.Offset, rec.LeaderEpoch
		}
		p.next = rec.Offset + 1
		if p.skip != nil && p.skipped(rec.Offset) {
			p.span.finish(p.span.push(rec.Offset, rec.LeaderEpoch))
			p.bytes += spanEntryBytes
			skipped++
			continue
		}
		r := &record{seq: p.span.push(rec.Offset, rec.LeaderEpoch)}
		r.size = copyRecord(r, rec, p.topic)
		if p.shaped {
			r.attempts = unpark(&r.rec)
		}
		p.bytes += r.size + RecordOverhead
		u := p.unitOf(&r.rec)
		r.unit = u
		switch {
		case u == nil:
			p.ready.push(r)
		case u.busy:
			u.push(r)
		default:
			u.busy = true
			p.ready.push(r)
		}
	}
	if skipped > 0 {
		c.restoredSkips.Add(skipped)
		p.advanceWatermark()
	}
	c.notePeak(int64(p.span.len()), p.bytes)
	if !p.paused && p.full() {
		p.cl.PauseFetchPartitions(p.tps())
		p.paused = true
	}
	p.schedule()
}

// restore sets the ranges of offsets that the last commit's map says
// were finished (offsetmap.go), before the first records are pushed.
func (p *partition) restore(skip []offRun) {
	p.mu.Lock()
	p.skip = skip
	p.mu.Unlock()
}

// skipped reports whether the record at off is in the ranges of skip,
// and drops the ranges behind it; p.mu is held.
func (p *partition) skipped(off int64) bool {
	for len(p.skip) > 0 && p.skip[0].last < off {
		p.skip = p.skip[1:]
	}
	if len(p.skip) == 0 {
		p.skip = nil
		return false
	}
	return p.skip[0].first <= off
}

// unitOf returns rec's ordering unit, nil under Unordered; p.mu is held.
// In the shaping topic, records of different origins are different units
// (rec carries its origin).
func (p *partition) unitOf(rec *kgo.Record) *unit {
	var key string
	switch p.c.cfg.ordering {
	case ByPartition:
		if !p.shaped {
			return &p.whole
		}
		key = originKey(rec, false)
	case ByKey:
		if p.shaped {
			key = originKey(rec, true)
			break
		}
		if u := p.units[string(rec.Key)]; u != nil { // no allocation
			return u
		}
		key = string(rec.Key)
	default:
		return nil
	}
	u := p.units[key]
	if u == nil {
		u = &unit{key: key}
		p.units[key] = u
		p.unitsPeak = max(p.unitsPeak, len(p.units))
	}
	return u
}

// minShrink is the least room (units, records, span entries) a partition
// frees by building a map or buffer anew: below it, the room is kept for
// reuse.
const minShrink = 4096

// forget deletes idle unit u; once the map holds an eighth of its peak, it
// is built anew, so that a burst of keys does not hold its room; p.mu is
// held.
func (p *partition) forget(u *unit) {
	delete(p.units, u.key)
	if p.unitsPeak >= minShrink && len(p.units)*8 <= p.unitsPeak {
		m := make(map[string]*unit, len(p.units)) // maps.Clone would keep the room
		for k, v := range p.units {
			m[k] = v
		}
		p.units = m
		p.unitsPeak = len(p.units)
	}
}

// full reports whether the partition holds its queue size in records or
// bytes; p.mu is held.
func (p *partition) full() bool {
	return p.span.len() >= p.c.cfg.queueSize || p.bytes >= p.c.cfg.queueBytes
}

// drained reports whether the partition holds at most half its queue
// size in records and bytes; p.mu is held.
func (p *partition) drained() bool {
	return p.span.len() <= p.c.cfg.queueSize/2 && p.bytes <= p.c.cfg.queueBytes/2
}

// schedule queues the partition for the workers if it has ready
// records; p.mu is held.
func (p *partition) schedule() {
	if p.started && !p.closed && p.ready.len() > 0 {
		if f := p.c.fair; f != nil {
			f.offer(p)
			return
		}
		p.c.sched.enqueue(p)
	}
}

// begin takes a ready record for a worker; nil if none is ready or the
// partition is stopping. The partition is queued again if it has more.
func (p *partition) begin() *record {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.started || p.closed || p.ready.len() == 0 {
		return nil
	}
	r := p.ready.pop()
	p.startWork(r)
	p.schedule()
	return r
}

// take takes r, which WithFairness chose, for a worker; false if the
// partition is stopping (r is then dropped, as dropQueued would have).
func (p *partition) take(r *record) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.started || p.closed {
		p.drop(r)
		return false
	}
	p.startWork(r)
	return true
}

// startWork counts r in work; the shaping bound counts from here. p.mu
// is held.
func (p *partition) startWork(r *record) {
	p.inWork++
	if p.parks {
		r.began = time.Now()
		if u := r.unit; u != nil && u.holdSince.IsZero() {
			u.holdSince = r.began
		}
	}
}

// outcome is how a worker is done with a record.
type outcome int

const (
	// finished: handled or dead-lettered; end finishes it.
	finished outcome = iota
	// parked: written to the shaping topic and finished already.
	parked
	// stopped: the partition stopped or the consumer failed; the record
	// stays unfinished.
	stopped
	// inPlace: the shaping topic refused the record as too large; it is
	// handled where it is (park's caller goes on with it).
	inPlace
)

// end is r's worker done with it, and ends the partition if it is
// stopped and r was the last record in work. A finished record gives back
// its key, value and headers, lets the next record of its unit become
// ready and moves the watermark past the finished records at the front of
// the span. A stopped one is left as it is: its unit and the watermark
// stay behind it, so neither it nor anything after it is committed.
func (p *partition) end(r *record, out outcome) {
	p.mu.Lock()
	if out == finished {
		p.release(r)
		p.advance(r.unit)
	}
	p.inWork--
	last := p.closed && p.inWork == 0 && p.waited
	p.mu.Unlock()
	if last {
		p.finalize()
	}
}

// release marks a finished record done in the span, where only its
// entry stays, and gives back its key, value and headers (the record itself
// is dropped by the caller); p.mu is held. Behind an unfinished record
// the watermark does not move, but the bytes held drop: fetching resumes
// here too once the partition has drained.
func (p *partition) release(r *record) {
	p.span.finish(r.seq)
	p.bytes -= RecordOverhead - spanEntryBytes
	p.drop(r)
	p.resumeIfDrained()
}

// drop gives back r's key, value and headers, and what they counted for
// (nothing once the partition has ended); p.mu is held.
func (p *partition) drop(r *record) {
	if !p.ended {
		p.bytes -= r.size
	}
	r.size = 0
	r.rec.Key, r.rec.Value, r.rec.Headers = nil, nil, nil
}

// advance lets the next record of u (done with its record in work)
// become ready, and moves the watermark past the finished records at the
// front of pending; p.mu is held.
func (p *partition) advance(u *unit) {
	p.advanceUnit(u)
	p.advanceWatermark()
}

// advanceUnit lets the next record of u become ready, or marks u idle;
// p.mu is held.
func (p *partition) advanceUnit(u *unit) {
	if u != nil {
		if n := u.pop(); n != nil {
			p.ready.push(n)
			p.schedule()
		} else {
			u.busy = false
			u.holdSince = time.Time{}
			if u != &p.whole && !u.parked {
				p.forget(u)
			}
		}
	}
}

// advanceWatermark moves the watermark past the finished records at the
// front of the span, and resumes fetching once the partition has drained;
// p.mu is held.
func (p *partition) advanceWatermark() {
	before := p.span.len()
	last, ok := p.span.popDone()
	if !ok {
		return
	}
	p.bytes -= int64(before-p.span.len()) * spanEntryBytes
	p.mark.Offset, p.mark.LeaderEpoch = last.off, last.epoch
	p.through = last.off + 1
	p.dirty = true
	p.resumeIfDrained()
}

// resumeIfDrained resumes the paused fetching of the partition once it
// holds at most half its bounds; p.mu is held.
func (p *partition) resumeIfDrained() {
	if p.paused && !p.closed && p.drained() {
		p.cl.ResumeFetchPartitions(p.tps())
		p.paused = false
	}
}

// flush marks the watermark for commit, unless the partition is closed
// (only run's exit flushes it then) or fenced.
func (p *partition) flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.flushLocked()
	}
}

// flushLocked marks the watermark for commit unless fenced; p.mu is held.
func (p *partition) flushLocked() {
	if p.dirty && !p.fenced {
		p.cl.MarkCommitRecords(&p.mark)
		p.dirty = false
		p.marked, p.markedEpoch = p.through, p.mark.LeaderEpoch
	}
}

// close marks the watermark, stops queueing and cancels waits; the
// partition ends once the records in work are done (and marks what they
// finished).
func (p *partition) close() {
	p.mu.Lock()
	p.flushLocked()
	p.closed = true
	p.dropQueued()
	last := p.inWork == 0 && p.waited
	p.mu.Unlock()
	p.cancelSoft(fmt.Errorf("consumer: partition %s[%d] is no longer handled here (revoked, lost, or the consumer is stopping)", p.topic, p.id))
	if last {
		p.finalize()
	}
}

// dropQueued gives back the key, value and headers of the records no
// worker has taken, which a closed partition will never handle: they stay
// in the span, unfinished, so that the watermark stays behind them; p.mu
// is held.
func (p *partition) dropQueued() {
	for p.ready.len() > 0 {
		p.drop(p.ready.pop())
	}
	p.ready.reset()
	if f := p.c.fair; f != nil {
		for _, r := range f.withdraw(p) {
			p.drop(r)
		}
	}
	for _, u := range p.units {
		for r := u.head; r != nil; r = r.next {
			p.drop(r)
		}
	}
	for r := p.whole.head; r != nil; r = r.next {
		p.drop(r)
	}
}

// start lets workers take the partition's records once the earlier
// ownerships of the partition have ended and sc (if any) has found its
// parked units; at once if there is nothing to wait for.
func (p *partition) start(sc *scan) {
	if len(p.after) == 0 && sc == nil {
		p.mu.Lock()
		p.started, p.waited = true, true
		p.schedule()
		p.mu.Unlock()
		return
	}
	go p.waitAfter(sc)
}

// waitAfter waits for the earlier ownerships to end and for sc, or for
// the partition to stop, then lets workers take its records.
func (p *partition) waitAfter(sc *scan) {
	stopped := false
	for _, earlier := range p.after {
		select {
		case <-earlier.done:
		case <-p.soft.Done():
			stopped = true
		}
		if stopped {
			break
		}
	}
	if sc != nil && !stopped {
		select {
		case <-sc.done:
			// A scan cut short (Run ends) may have missed parked units:
			// the partition does not start.
			stopped = !sc.complete
		case <-p.soft.Done():
			stopped = true
		}
	}
	p.mu.Lock()
	if sc != nil && !stopped {
		sc.apply(p)
	}
	p.waited = true
	p.started = !stopped
	p.schedule()
	last := p.closed && p.inWork == 0
	p.mu.Unlock()
	if last {
		p.finalize()
	}
}

// finalize ends a stopped partition once no record is in work: it marks
// the watermark (unless fenced), drops what it holds, and closes done.
func (p *partition) finalize() {
	p.mu.Lock()
	if p.ended {
		p.mu.Unlock()
		return
	}
	p.ended = true
	p.flushLocked()
	p.final, p.hasFinal = p.mapLocked()
	p.span.reset()
	p.ready.reset()
	p.units, p.whole = nil, unit{}
	p.bytes = 0
	p.mu.Unlock()
	p.endCalls()
	p.c.exited(p)
	close(p.done)
	p.c.wg.Done()
}

// fence forbids any further mark and cancels the handlers' contexts.
func (p *partition) fence() {
	p.mu.Lock()
	p.fenced = true
	p.mu.Unlock()
	p.endCalls()
}

// endCalls cancels the context of every handler call of the partition,
// running or to come.
func (p *partition) endCalls() {
	p.callsEnded.Store(true)
	p.c.sched.endCalls(p)
}

// isFenced reports whether fence was called.
func (p *partition) isFenced() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fenced
}

// held returns the records and bytes the partition holds.
func (p *partition) held() (int, int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.span.len(), p.bytes
}
