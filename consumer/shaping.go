package consumer

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Parking (shaping): a unit (a key under ByKey) that holds its partition
// longer than the bound of WithShaping has its records written to the
// shaping topic, in order, and finished, so that the partition's
// watermark goes on. The unit stays parked, for this ownership of the
// partition, until the shaping topic has handled the last record it
// parked; meanwhile every record of the unit is parked as its turn comes,
// so the unit's order holds. The consumer consumes the shaping topic in the
// same group, and there records wait for their permits in place.
//
// A new owner of a partition learns which units have records still
// parked by reading the shaping topic from the group's committed offsets
// to its end when the partition is assigned (scan).

// parkBatch bounds the records of a unit parked in one write.
const parkBatch = 256

// parkHeaders are the headers a parked record carries last, in this
// order: where it was consumed from, and the attempts made before.
var parkHeaders = [...]string{HeaderTopic, HeaderPartition, HeaderOffset, HeaderAttempts}

// parkRecord builds the shaping-topic copy of r's record.
func parkRecord(topic string, r *record, attempts int) *kgo.Record {
	rec := &r.rec
	hs := make([]kgo.RecordHeader, 0, len(rec.Headers)+len(parkHeaders))
	hs = append(hs, rec.Headers...)
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderTopic, Value: []byte(rec.Topic)},
		kgo.RecordHeader{Key: HeaderPartition, Value: strconv.AppendInt(nil, int64(rec.Partition), 10)},
		kgo.RecordHeader{Key: HeaderOffset, Value: strconv.AppendInt(nil, rec.Offset, 10)},
		kgo.RecordHeader{Key: HeaderAttempts, Value: strconv.AppendInt(nil, int64(attempts), 10)},
	)
	return &kgo.Record{Topic: topic, Key: rec.Key, Value: rec.Value, Headers: hs, Timestamp: rec.Timestamp}
}

// origin is where a parked record was consumed from.
type origin struct {
	topic     string
	partition int32
	offset    int64
	attempts  int
}

// originOf parses the headers parkRecord adds; false if rec does not end
// with them.
func originOf(rec *kgo.Record) (origin, bool) {
	n := len(rec.Headers) - len(parkHeaders)
	if n < 0 {
		return origin{}, false
	}
	hs := rec.Headers[n:]
	for i, k := range parkHeaders {
		if hs[i].Key != k {
			return origin{}, false
		}
	}
	part, err1 := strconv.ParseInt(string(hs[1].Value), 10, 32)
	off, err2 := strconv.ParseInt(string(hs[2].Value), 10, 64)
	att, err3 := strconv.Atoi(string(hs[3].Value))
	if err1 != nil || err2 != nil || err3 != nil || len(hs[0].Value) == 0 || part < 0 || off < 0 || att < 0 {
		return origin{}, false
	}
	return origin{string(hs[0].Value), int32(part), off, att}, true
}

// unpark turns a record read from the shaping topic back into the record
// as it was consumed from its own topic (coordinates, headers), and
// returns the attempts made before it was parked. A record without the
// parking headers is left as it is.
func unpark(rec *kgo.Record) int {
	o, ok := originOf(rec)
	if !ok {
		return 0
	}
	rec.Headers = rec.Headers[:len(rec.Headers)-len(parkHeaders)]
	if len(rec.Headers) == 0 {
		rec.Headers = nil
	}
	rec.Topic, rec.Partition, rec.Offset = o.topic, o.partition, o.offset
	return o.attempts
}

// originKey is the unit of a record read from the shaping topic: its
// origin partition and, byKey, its key.
func originKey(rec *kgo.Record, byKey bool) string {
	k := rec.Topic + "\x00" + strconv.FormatInt(int64(rec.Partition), 10)
	if byKey {
		k += "\x00" + string(rec.Key)
	}
	return k
}

// shapingPartitioner sends parked records of one unit to one partition of
// the shaping topic, so that they keep their order; other topics (dead
// letters) go by def.
type shapingPartitioner struct {
	topic    string
	ordering Ordering
	def      kgo.Partitioner
}

func (sp shapingPartitioner) ForTopic(t string) kgo.TopicPartitioner {
	if t == sp.topic {
		return unitPartitioner{sp.ordering}
	}
	return sp.def.ForTopic(t)
}

type unitPartitioner struct{ ordering Ordering }

func (unitPartitioner) RequiresConsistency(*kgo.Record) bool { return true }

func (up unitPartitioner) Partition(r *kgo.Record, n int) int {
	o, _ := originOf(r)
	h := fnv.New32a()
	_, _ = h.Write([]byte(o.topic))
	_, _ = h.Write(strconv.AppendInt([]byte{0}, int64(o.partition), 10))
	switch up.ordering {
	case ByKey:
		_, _ = h.Write([]byte{0})
		_, _ = h.Write(r.Key)
	case Unordered:
		_, _ = h.Write(strconv.AppendInt([]byte{0}, o.offset, 10))
	}
	return int(h.Sum32() % uint32(n))
}

// parkedUnit reports whether r's unit is parked, and unparks it first if
// the shaping topic has handled the last record it parked.
func (p *partition) parkedUnit(r *record) bool {
	u := r.unit
	if u == nil {
		return false
	}
	p.mu.Lock()
	parked, part, off := u.parked, u.parkPart, u.parkOff
	p.mu.Unlock()
	if !parked || p.c.shapingHandled(p.cl, part) <= off {
		return parked
	}
	p.mu.Lock()
	u.parked = false
	u.holdSince = time.Now()
	p.mu.Unlock()
	return false
}

// park writes r, and the records of its unit queued behind it, to the
// shaping topic and finishes them; the unit stays parked (parkedUnit).
//
// A record the shaping topic refuses as too large is not parked: the
// records behind it go back to its unit's queue, and it is handled in
// place (inPlace when it is r; otherwise it becomes ready, and is parked
// in turn, or handled in place once its unit's parked records are).
func (p *partition) park(r *record, attempts int) outcome {
	c := p.c
	batch := []*record{r}
	p.mu.Lock()
	u := r.unit
	wasParked := false
	if u != nil {
		wasParked = u.parked
		u.parked = true
		for len(batch) < parkBatch && u.head != nil && !p.closed { // closed: their values are dropped
			batch = append(batch, u.pop())
			p.inWork++
		}
	}
	p.mu.Unlock()

	recs := make([]*kgo.Record, len(batch))
	for i, b := range batch {
		n := b.attempts
		if i == 0 {
			n = attempts
		}
		recs[i] = parkRecord(c.cfg.shaping, b, n)
	}
	written, err := c.writeInOrder(recs)
	refused := err != nil && tooLarge(err) && p.soft.Err() == nil

	p.mu.Lock()
	for _, b := range batch[:written] {
		p.release(b)
	}
	if written > 0 && u != nil {
		last := recs[written-1]
		u.parkPart, u.parkOff = last.Partition, last.Offset
	}
	switch {
	case written == len(batch):
		p.advance(u)
	case refused:
		// The records not written go back to the unit, in order; r,
		// if not written, stays with its worker.
		for i := len(batch) - 1; i >= max(written, 1); i-- {
			u.pushFront(batch[i])
		}
		if written == 0 {
			if u != nil {
				u.parked = wasParked
			}
		} else {
			p.advance(u)
		}
	default:
		p.advanceWatermark() // the unit stays behind the record not written
	}
	p.inWork -= len(batch) - 1 // r itself is ended by its worker
	p.mu.Unlock()
	c.parked.Add(int64(written))

	if refused {
		rec := &batch[written].rec
		c.log.Warn("consumer: record too large for the shaping topic; it waits in place, holding its partition",
			"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "shaping", c.cfg.shaping, "err", err)
		if written == 0 {
			return inPlace
		}
		return parked
	}
	if err != nil {
		if p.soft.Err() == nil {
			rec := &batch[written].rec
			c.fail(fmt.Errorf("consumer: parking record %s[%d]@%d in %s: %w", rec.Topic, rec.Partition, rec.Offset, c.cfg.shaping, err))
		}
		if written > 0 {
			return parked // r was written and finished
		}
		return stopped
	}
	c.log.Debug("consumer: records parked", "topic", p.topic, "partition", p.id, "records", written, "to", c.cfg.shaping)
	return parked
}

// writeInOrder writes recs, which go to one partition, in order, and
// returns how many were written before the first that could not be. Runs
// of records small enough for the normal client's batches go in one write
// each: kgo fails every later record of a partition when one fails, so
// what is written is a prefix. A record that kgo could refuse as too large
// before sending it (which fails it alone) is written alone, after the
// records before it.
func (c *Consumer) writeInOrder(recs []*kgo.Record) (int, error) {
	written := 0
	for written < len(recs) {
		n := 0
		for written+n < len(recs) && recordSize(recs[written+n]) <= c.prod.small {
			n++
		}
		if n == 0 {
			if err := c.write(recs[written]); err != nil {
				return written, err
			}
			written++
			continue
		}
		res := c.prod.normal.ProduceSync(c.base, recs[written:written+n]...)
		for _, r := range res {
			if r.Err != nil {
				return written, r.Err
			}
			written++
		}
	}
	return written, nil
}

// recordSize is an upper bound of r's size in a record batch.
func recordSize(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value) + 64 // lengths, offsets, attributes
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 16
	}
	return n
}

// shapingHandled returns an offset of partition part of the shaping
// topic below which every record has been handled: the larger of this
// member's watermark, if it owns the partition, and the group's committed
// offset (refreshed at most every second).
func (c *Consumer) shapingHandled(cl *kgo.Client, part int32) int64 {
	c.mu.Lock()
	p := c.parts[topicPartition{c.cfg.shaping, part}]
	c.mu.Unlock()
	local := int64(-1)
	if p != nil {
		p.mu.Lock()
		local = p.through
		p.mu.Unlock()
	}
	return max(local, c.shapingView.committed(c, cl, part))
}

// shapingView caches the group's committed offsets of the shaping topic.
type shapingView struct {
	mu      sync.Mutex
	at      time.Time
	offsets map[int32]int64
}

// viewAge is how long committed offsets are reused before asking again.
const viewAge = time.Second

// committed returns the group's committed offset of part (-1 if none
// or unknown), asking the group coordinator if the cached one is older
// than viewAge.
func (v *shapingView) committed(c *Consumer, cl *kgo.Client, part int32) int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	if time.Since(v.at) >= viewAge {
		ctx, cancel := context.WithTimeout(c.base, 5*time.Second)
		offsets, err := fetchCommitted(ctx, cl, c.group, c.cfg.shaping, nil)
		cancel()
		if err == nil {
			v.offsets = offsets
		}
		v.at = time.Now()
	}
	if o, ok := v.offsets[part]; ok {
		return o
	}
	return -1
}

// fetchCommitted returns group's committed offsets of the partitions of
// topic (all of them when parts is nil); -1 for none, and none at all for
// a group the coordinator does not know.
func fetchCommitted(ctx context.Context, cl *kgo.Client, group, topic string, parts []int32) (map[int32]int64, error) {
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic = topic
	rt.Partitions = parts
	if parts != nil {
		req.Topics = append(req.Topics, rt)
	} else {
		req.Topics = nil // every committed partition of the group
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	out := make(map[int32]int64)
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		if errors.Is(err, kerr.GroupIDNotFound) {
			return out, nil // a group that never committed
		}
		return nil, err
	}
	for _, t := range resp.Topics {
		if t.Topic != topic {
			continue
		}
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, err
			}
			out[p.Partition] = p.Offset
		}
	}
	return out, nil
}

// scan finds, for partitions newly assigned, the units whose records are
// still parked: the shaping topic's records from the group's committed
// offsets to the end, by origin. The partitions start only once it has read
// to the end: a unit it did not see would have its next record handled in
// place, ahead of its parked ones.
type scan struct {
	c    *Consumer
	cl   *kgo.Client
	want map[topicPartition]bool
	// parts are the ownerships waiting for the scan; earlier are the
	// ownerships of the same partitions that had not ended when these were
	// assigned, whose writes to the shaping topic the scan must see.
	parts, earlier []*partition
	done           chan struct{}
	// complete: the shaping topic was read to its end (set before done is
	// closed).
	complete bool
	// units holds, per origin partition, each parked unit's key and the
	// shaping partition and offset of its last parked record.
	units map[topicPartition]map[string]parkedAt
}

type parkedAt struct {
	part int32
	off  int64
}

func (c *Consumer) newScan(cl *kgo.Client, ps []*partition) *scan {
	sc := &scan{c: c, cl: cl, parts: ps, want: make(map[topicPartition]bool), done: make(chan struct{}), units: make(map[topicPartition]map[string]parkedAt)}
	for _, p := range ps {
		sc.want[topicPartition{p.topic, p.id}] = true
		sc.earlier = append(sc.earlier, p.after...)
	}
	return sc
}

// run reads, retrying on errors, until it has read to the end, Run ends,
// or every partition it serves has stopped.
func (sc *scan) run(parent context.Context) {
	c := sc.c
	defer c.wg.Done()
	defer close(sc.done)
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	var running atomic.Int32
	running.Store(int32(len(sc.parts)))
	for _, p := range sc.parts {
		stop := context.AfterFunc(p.soft, func() {
			if running.Add(-1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	// An earlier ownership may still be writing records of these
	// partitions to the shaping topic.
	for _, e := range sc.earlier {
		select {
		case <-e.done:
		case <-ctx.Done():
			return
		}
	}
	for n := 1; ; n++ {
		err := sc.read(ctx)
		if err == nil {
			sc.complete = true
			return
		}
		if ctx.Err() != nil {
			return
		}
		d := c.permitBackoff(n)
		c.log.Warn("consumer: reading the shaping topic for parked records failed; the assigned partitions wait", "topic", c.cfg.shaping, "in", d, "err", err)
		if !sleepCtx(ctx, d) {
			return
		}
	}
}

// scanRequestTimeout bounds each request for offsets of a scan.
const scanRequestTimeout = 30 * time.Second

// read reads the shaping topic from the group's committed offsets to the
// ends it has when read begins. It does not give up while the reading goes
// on: it warns every scanWarn instead, and the partitions wait.
func (sc *scan) read(ctx context.Context) error {
	c := sc.c
	rctx, cancel := context.WithTimeout(ctx, scanRequestTimeout)
	defer cancel()
	starts, ends, err := offsetRange(rctx, sc.cl, c.cfg.shaping)
	if err != nil {
		return err
	}
	committed, err := fetchCommitted(rctx, sc.cl, c.group, c.cfg.shaping, nil)
	if err != nil {
		return err
	}
	from := make(map[int32]kgo.Offset)
	left := make(map[int32]int64) // partition → end offset still to reach
	for part, end := range ends {
		start := starts[part]
		if o, ok := committed[part]; ok && o > start {
			start = o
		}
		if start >= end {
			continue // nothing parked and not handled
		}
		from[part] = kgo.NewOffset().At(start)
		left[part] = end
	}
	if len(left) == 0 {
		return nil
	}
	rd, err := kgo.NewClient(append(c.producerBase(), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{c.cfg.shaping: from}))...)
	if err != nil {
		return err
	}
	defer rd.Close()
	began := time.Now()
	for len(left) > 0 {
		pctx, cancel := context.WithTimeout(ctx, c.cfg.scanWarn)
		fs := rd.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		slow := false
		fs.EachError(func(_ string, _ int32, err error) {
			if errors.Is(err, context.DeadlineExceeded) {
				slow = true
			} else {
				ferr = err
			}
		})
		if ferr != nil {
			return ferr
		}
		if slow {
			c.log.Warn("consumer: still reading the shaping topic for parked records; the assigned partitions wait",
				"topic", c.cfg.shaping, "partitions", len(left), "for", time.Since(began).Round(time.Millisecond))
		}
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			end, ok := left[fp.Partition]
			if !ok {
				return
			}
			for _, r := range fp.Records {
				if r.Offset >= end {
					break
				}
				sc.note(r)
			}
			if nextOffset(fp) >= end {
				delete(left, fp.Partition)
			}
		})
	}
	return nil
}

// nextOffset is the offset after the last record of fp, -1 if none.
func nextOffset(fp kgo.FetchTopicPartition) int64 {
	if n := len(fp.Records); n > 0 {
		return fp.Records[n-1].Offset + 1
	}
	return -1
}

// note records r's unit as parked if r comes from a wanted partition.
func (sc *scan) note(r *kgo.Record) {
	o, ok := originOf(r)
	if !ok {
		return
	}
	tp := topicPartition{o.topic, o.partition}
	if !sc.want[tp] {
		return
	}
	key := ""
	if sc.c.cfg.ordering == ByKey {
		key = string(r.Key)
	}
	m := sc.units[tp]
	if m == nil {
		m = make(map[string]parkedAt)
		sc.units[tp] = m
	}
	if at, ok := m[key]; !ok || r.Offset > at.off {
		m[key] = parkedAt{r.Partition, r.Offset}
	}
}

// apply marks p's units found parked; p.mu is held.
func (sc *scan) apply(p *partition) {
	for key, at := range sc.units[topicPartition{p.topic, p.id}] {
		var u *unit
		switch p.c.cfg.ordering {
		case ByPartition:
			u = &p.whole
		case ByKey:
			u = p.units[key]
			if u == nil {
				u = &unit{key: key}
				p.units[key] = u
			}
		default:
			continue
		}
		if !u.parked || at.off > u.parkOff {
			u.parked, u.parkPart, u.parkOff = true, at.part, at.off
		}
	}
}

// offsetRange returns the start (oldest) and end offsets of each
// partition of topic.
func offsetRange(ctx context.Context, cl *kgo.Client, topic string) (starts, ends map[int32]int64, err error) {
	if starts, err = listOffsets(ctx, cl, topic, -2); err != nil {
		return nil, nil, err
	}
	if ends, err = listOffsets(ctx, cl, topic, -1); err != nil {
		return nil, nil, err
	}
	return starts, ends, nil
}

// listOffsets returns, for each partition of topic, its oldest offset
// (at -2) or its end (at -1).
func listOffsets(ctx context.Context, cl *kgo.Client, topic string, at int64) (map[int32]int64, error) {
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, mt)
	mresp, err := meta.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	if len(mresp.Topics) != 1 {
		return nil, fmt.Errorf("consumer: metadata for %s: %d topics", topic, len(mresp.Topics))
	}
	if err := kerr.ErrorForCode(mresp.Topics[0].ErrorCode); err != nil {
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			return nil, fmt.Errorf("consumer: the shaping topic %s does not exist: %w", topic, err)
		}
		return nil, err
	}
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for _, p := range mresp.Topics[0].Partitions {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = p.Partition
		rp.Timestamp = at
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	out := make(map[int32]int64)
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, err
			}
			out[p.Partition] = p.Offset
		}
	}
	return out, nil
}
