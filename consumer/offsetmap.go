package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Offset maps. The committed offset of a partition is its watermark: the
// records finished behind an unfinished one are not committed, and the
// next owner would handle them again. A commit made when a partition stops
// here (revocation, shutdown) therefore carries, in the metadata of the
// partition's offset, the ranges of offsets past it that were finished
// already; the next owner, reading the committed offsets, finishes those
// records at once instead of handling them again.
//
// The map is bounded (maxOffsetMap bytes): ranges that do not fit are left
// out, from the last, and their records are handled again, as without a
// map. A broker that refuses the metadata as too large gets the commit
// again without maps. Commits of the running consumer (kgo's autocommit)
// carry no map: after a crash, the records past the watermark are handled
// again.
//
// A map is read from outside: any client may commit for the group. It is
// trusted as far as a committed offset is, no further: its ranges must
// lie below the end of the partition as the consumer fetches it when the
// map is read (the high watermark, or the last stable offset under
// read_committed, asked of the partition's leader then: no owner can
// have finished a record not fetched yet), its offset must be the
// committed one, and it must parse. A map that does not is ignored
// whole, with a warning, and the records past the committed offset are
// handled: at least once holds whatever another client wrote.

// offsetMapPrefix starts the metadata of a commit that carries a map.
const offsetMapPrefix = "headway.om1:"

// maxOffsetMap is the most bytes of metadata a map takes: below the
// brokers' default offset.metadata.max.bytes (4096).
const maxOffsetMap = 4000

// offRun is a range of finished offsets, first to last inclusive: records
// consecutive in the partition (offsets the log does not hold, compacted
// or control records, may lie inside it).
type offRun struct{ first, last int64 }

// offsetMap is the map of a partition that stopped: the offset the commit
// carries (base), the leader epoch of the record at or before it (epoch)
// and the finished ranges past it.
type offsetMap struct {
	tp    topicPartition
	base  int64
	epoch int32
	runs  []offRun
}

// encodeOffsetMap writes base and as many runs as fit in maxOffsetMap
// bytes, in order: base36 numbers, "base:gap.len,gap.len,...", each gap
// counted from the end of the run before (from base for the first).
func encodeOffsetMap(base int64, runs []offRun) string {
	var b strings.Builder
	b.WriteString(offsetMapPrefix)
	b.WriteString(strconv.FormatInt(base, 36))
	b.WriteByte(':')
	next := base
	var item []byte
	for i, r := range runs {
		if r.first < next || r.last < r.first {
			break // not in order: keep what is sure
		}
		item = item[:0]
		if i > 0 {
			item = append(item, ',')
		}
		item = strconv.AppendInt(item, r.first-next, 36)
		item = append(item, '.')
		item = strconv.AppendInt(item, r.last-r.first+1, 36)
		if b.Len()+len(item) > maxOffsetMap {
			break
		}
		b.Write(item)
		next = r.last + 1
	}
	return b.String()
}

// decodeOffsetMap reads what encodeOffsetMap wrote; ok is false for any
// other metadata (kgo's member ID, another program's), which then
// restores nothing.
func decodeOffsetMap(s string) (base int64, runs []offRun, ok bool) {
	rest, found := strings.CutPrefix(s, offsetMapPrefix)
	if !found || len(s) > maxOffsetMap {
		return 0, nil, false // encodeOffsetMap writes no more
	}
	head, list, found := strings.Cut(rest, ":")
	if !found {
		return 0, nil, false
	}
	base, err := strconv.ParseInt(head, 36, 64)
	if err != nil || base < 0 {
		return 0, nil, false
	}
	if list == "" {
		return base, nil, true
	}
	next := base
	for item := range strings.SplitSeq(list, ",") {
		g, n, found := strings.Cut(item, ".")
		if !found {
			return 0, nil, false
		}
		gap, err1 := strconv.ParseInt(g, 36, 64)
		length, err2 := strconv.ParseInt(n, 36, 64)
		if err1 != nil || err2 != nil || gap < 0 || length < 1 || gap > 1<<62-next || length > 1<<62-next-gap {
			return 0, nil, false
		}
		r := offRun{first: next + gap, last: next + gap + length - 1}
		runs = append(runs, r)
		next = r.last + 1
	}
	return base, runs, true
}

// beyond returns why m cannot have been written by an owner of its
// partition, whose end as the consumer fetches it is end (the offset
// after the last record a fetch can return; named endName: the high
// watermark, or the last stable offset under read_committed): a range
// that reaches end or beyond names records not fetched yet, which no
// owner can have finished. It returns "" for a map that fits.
func (m offsetMap) beyond(end int64, endName string) string {
	if n := len(m.runs); n > 0 && m.runs[n-1].last >= end {
		return fmt.Sprintf("its ranges run to offset %d, past the partition's end at %d (%s): no owner can have finished records not fetched yet", m.runs[n-1].last, end, endName)
	}
	return ""
}

// offsetMap returns the map of p, stopped, for the commit that follows
// its stop: the offset that commit carries for p (the last one marked,
// or the first record taken when none was) and the ranges finished past
// it. ok is false when p has nothing to add.
func (p *partition) offsetMap() (m offsetMap, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return p.final, p.hasFinal
	}
	return p.mapLocked()
}

// mapLocked is offsetMap; p.mu is held.
func (p *partition) mapLocked() (m offsetMap, ok bool) {
	if p.first < 0 {
		return offsetMap{}, false // took no record
	}
	m = offsetMap{tp: topicPartition{p.topic, p.id}, base: p.first, epoch: p.firstEpoch}
	if p.marked >= 0 {
		m.base, m.epoch = p.marked, p.markedEpoch
	}
	if p.through > m.base {
		// Finished and passed by the watermark, but not marked (the
		// partition was fenced): finished all the same.
		m.runs = append(m.runs, offRun{m.base, p.through - 1})
	}
	q := &p.span
	for i := q.head; i < len(q.buf); i++ {
		e := q.buf[i]
		if !e.done || e.off < m.base {
			continue
		}
		if n := len(m.runs); n > 0 && i > q.head && q.buf[i-1].done && m.runs[n-1].last < e.off {
			m.runs[n-1].last = e.off
			continue
		}
		m.runs = append(m.runs, offRun{e.off, e.off})
	}
	// The ranges of the restored map not read yet: finished by an
	// earlier owner all the same.
	for _, r := range p.skip {
		if r.last < p.next {
			continue
		}
		r.first = max(r.first, p.next)
		if n := len(m.runs); n > 0 && m.runs[n-1].last+1 >= r.first {
			m.runs[n-1].last = max(m.runs[n-1].last, r.last)
			continue
		}
		m.runs = append(m.runs, r)
	}
	return m, len(m.runs) > 0
}

// mapsOf returns the maps of stopped partitions, one per partition: none
// for a partition stopped twice at once (an earlier ownership still
// stopping), whose commit it could not tell apart.
func mapsOf(ps []*partition) map[topicPartition]offsetMap {
	count := make(map[topicPartition]int, len(ps))
	for _, p := range ps {
		count[topicPartition{p.topic, p.id}]++
	}
	maps := make(map[topicPartition]offsetMap)
	for _, p := range ps {
		if count[topicPartition{p.topic, p.id}] > 1 {
			continue
		}
		if m, ok := p.offsetMap(); ok {
			maps[m.tp] = m
		}
	}
	return maps
}

// withOffsetMaps returns ctx with a function that writes maps into the
// commit kgo is about to send: the metadata of each partition the commit
// carries at the map's base.
func withOffsetMaps(ctx context.Context, maps map[topicPartition]offsetMap) context.Context {
	if len(maps) == 0 {
		return ctx
	}
	return kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		for i := range req.Topics {
			t := &req.Topics[i]
			for j := range t.Partitions {
				pp := &t.Partitions[j]
				if m, ok := maps[topicPartition{t.Topic, pp.Partition}]; ok && pp.Offset == m.base {
					pp.Metadata = kmsg.StringPtr(encodeOffsetMap(m.base, m.runs))
				}
			}
		}
		return nil
	})
}

// commitWithMaps commits the marked offsets and, with its map, each
// partition of maps at its base: also those with nothing marked in this
// session (a record stuck from the first on), which are still ours (they
// are being revoked, or Run stops).
//
// Such a partition is committed with the leader epoch the client holds
// for its committed offset when that is the base: the client then takes
// the partition for committed, and no later commit of the client (the one
// on leaving the group, an autocommit) writes the same offset again
// without the map. Otherwise with the epoch of the record at the base.
func commitWithMaps(ctx context.Context, cl *kgo.Client, maps map[topicPartition]offsetMap) error {
	offsets := cl.MarkedOffsets()
	var committed map[string]map[int32]kgo.EpochOffset
	if len(maps) > 0 {
		committed = cl.CommittedOffsets()
	}
	for tp, m := range maps {
		if _, ok := offsets[tp.topic][tp.partition]; ok {
			continue
		}
		if offsets == nil {
			offsets = make(map[string]map[int32]kgo.EpochOffset)
		}
		if offsets[tp.topic] == nil {
			offsets[tp.topic] = make(map[int32]kgo.EpochOffset)
		}
		at := kgo.EpochOffset{Epoch: m.epoch, Offset: m.base}
		if eo, ok := committed[tp.topic][tp.partition]; ok && eo.Offset == m.base {
			at = eo
		}
		offsets[tp.topic][tp.partition] = at
	}
	if len(offsets) == 0 {
		return nil
	}
	var rerr error
	cl.CommitOffsetsSync(withOffsetMaps(ctx, maps), offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			rerr = err
			return
		}
		for _, t := range resp.Topics {
			for _, pr := range t.Partitions {
				if err := kerr.ErrorForCode(pr.ErrorCode); err != nil {
					rerr = err
					return
				}
			}
		}
	})
	return rerr
}

// mapTooLarge reports whether a commit failed because a broker refused
// an offset's metadata as too large.
func mapTooLarge(err error) bool { return errors.Is(err, kerr.OffsetMetadataTooLarge) }

// onOffsetsFetched is the kgo.OnOffsetsFetched callback: it keeps the
// maps of the committed offsets just read that fit their partitions (see
// checkEnds), for the partitions' first records, warns of the others,
// then calls the user's callback, if any. When ctx (the group session)
// ends while maps are checked, it returns ctx's error instead, keeping
// and warning of nothing: kgo then reads the offsets again in the next
// session.
func (c *Consumer) onOffsetsFetched(ctx context.Context, cl *kgo.Client, resp *kmsg.OffsetFetchResponse) error {
	var (
		read []topicPartition
		bad  []badMap
	)
	maps := make(map[topicPartition]offsetMap)
	for _, t := range resp.Topics {
		for _, pr := range t.Partitions {
			tp := topicPartition{t.Topic, pr.Partition}
			read = append(read, tp)
			if pr.ErrorCode != 0 || pr.Metadata == nil {
				continue
			}
			base, runs, ok := decodeOffsetMap(*pr.Metadata)
			switch {
			case !ok && strings.HasPrefix(*pr.Metadata, offsetMapPrefix):
				bad = append(bad, badMap{tp, pr.Offset, fmt.Sprintf("it does not parse as a map of at most %d bytes", maxOffsetMap)})
			case ok && base != pr.Offset:
				bad = append(bad, badMap{tp, pr.Offset, fmt.Sprintf("it was written for offset %d, not the committed one", base)})
			case ok && len(runs) > 0:
				maps[tp] = offsetMap{tp: tp, base: base, runs: runs}
			}
		}
	}
	checked := len(maps) > 0
	if checked {
		// kgo fetches these partitions only once this callback returns:
		// no record of theirs is dispatched meanwhile.
		bad = append(bad, c.checkEnds(ctx, cl, maps)...)
	}
	c.mu.Lock()
	for _, tp := range read {
		delete(c.restored, tp)
	}
	if checked && ctx.Err() != nil {
		// The session began revoking during the check, and maps may have
		// been dropped unchecked. Returned nil, kgo would give these
		// partitions out at their committed offsets, and a cooperative
		// session keeps those it does not lose without reading their
		// offsets again: fail the fetch, as kgo's own does when its
		// context ends, so that the next session reads the maps again.
		c.mu.Unlock()
		return fmt.Errorf("consumer: offset maps not checked, the group session ended: %w", ctx.Err())
	}
	for tp, m := range maps {
		c.restored[tp] = m
	}
	c.mu.Unlock()
	for _, b := range bad {
		c.warnMap(b)
	}
	if c.userOnFetched != nil {
		return c.userOnFetched(ctx, cl, resp)
	}
	return nil
}

// checkEnds removes from maps, and returns, the maps whose ranges reach
// their partition's end as its leader knows it now, when the map has just
// been read: no owner can have finished a record not yet written. A
// partition whose end cannot be learned (the request fails, or its
// leader cannot tell it yet and still cannot when the commit timeout
// ends) has its map removed too: without one, its records are handled
// again, which is always safe.
func (c *Consumer) checkEnds(ctx context.Context, cl *kgo.Client, maps map[topicPartition]offsetMap) []badMap {
	tps := make([]topicPartition, 0, len(maps))
	for tp := range maps {
		tps = append(tps, tp)
	}
	lctx, cancel := context.WithTimeout(ctx, time.Duration(c.commitTimeout.Load()))
	defer cancel()
	committed := readCommitted(cl)
	endName := "the high watermark"
	if committed {
		endName = "the last stable offset, read_committed"
	}
	ends, failed := partitionEnds(lctx, cl, tps, committed)
	var bad []badMap
	for tp, m := range maps {
		why := ""
		if end, ok := ends[tp]; ok {
			why = m.beyond(end, endName)
		} else {
			why = fmt.Sprintf("the partition's end, to check it against, could not be learned: %v", failed[tp])
		}
		if why == "" {
			continue
		}
		delete(maps, tp)
		if ctx.Err() == nil { // else the session ends: onOffsetsFetched has the next read the map again
			bad = append(bad, badMap{tp, m.base, why})
		}
	}
	return bad
}

// How long partitionEnds waits before asking again for the ends a
// leader could not give yet: endRetryFirst, doubled each time up to
// endRetryMost, for as long as its context lasts.
const (
	endRetryFirst = 50 * time.Millisecond
	endRetryMost  = time.Second
)

// partitionEnds asks the partitions' leaders for the end of each of tps
// as a consumer fetches it: the offset after its last record (the high
// watermark) or, with committed (read_committed), the offset of the
// first record of a transaction still open (the last stable offset,
// which is the high watermark when none is open). A partition
// whose end did not come has its error in failed instead. A leader that
// cannot tell yet (a retriable error such as OFFSET_NOT_AVAILABLE, which
// a leader just elected answers until it knows its high watermark, and
// which kgo does not retry) is asked again, after a pause, until ctx
// ends.
func partitionEnds(ctx context.Context, cl *kgo.Client, tps []topicPartition, committed bool) (ends map[topicPartition]int64, failed map[topicPartition]error) {
	ends = make(map[topicPartition]int64, len(tps))
	failed = make(map[topicPartition]error)
	for _, tp := range tps {
		failed[tp] = errors.New("no answer for the partition") // until one comes
	}
	ask := tps
	for pause := endRetryFirst; ; pause = min(2*pause, endRetryMost) {
		askEnds(ctx, cl, ask, committed, ends, failed)
		var again []topicPartition
		for _, tp := range ask {
			if err, ok := failed[tp]; ok && endRetriable(err) {
				again = append(again, tp)
			}
		}
		if len(again) == 0 || !sleepCtx(ctx, pause) {
			return ends, failed
		}
		ask = again
	}
}

// readCommitted reports whether cl fetches at the read_committed
// isolation level (kgo.FetchIsolationLevel(kgo.ReadCommitted())).
func readCommitted(cl *kgo.Client) bool {
	level, _ := asInt(cl.OptValue(kgo.FetchIsolationLevel))
	return level == 1
}

// endRetriable reports whether a partition's end that failed with err
// may come if asked again: a retriable error of the partition's leader.
// An unknown topic or partition is not: kgo has retried it already, as
// long as its metadata policy asks.
func endRetriable(err error) bool {
	return kerr.IsRetriable(err) && !errors.Is(err, kerr.UnknownTopicOrPartition)
}

// sleepCtx waits d, and reports whether ctx is still alive then.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return ctx.Err() == nil
	}
}

// askEnds sends one ListOffsets request, sharded by leader, for the ends
// of tps (the last stable offsets with committed), and records each
// answer in ends (deleting it from failed) or its error in failed.
func askEnds(ctx context.Context, cl *kgo.Client, tps []topicPartition, committed bool, ends map[topicPartition]int64, failed map[topicPartition]error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1     // a consumer: the isolation level applies
	req.IsolationLevel = 0 // read uncommitted: the high watermark
	if committed {
		req.IsolationLevel = 1 // read committed: the last stable offset
	}
	at := make(map[string]int)
	for _, tp := range tps {
		i, ok := at[tp.topic]
		if !ok {
			i = len(req.Topics)
			at[tp.topic] = i
			rt := kmsg.NewListOffsetsRequestTopic()
			rt.Topic = tp.topic
			req.Topics = append(req.Topics, rt)
		}
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.CurrentLeaderEpoch, rp.Timestamp = tp.partition, -1, -1 // -1: the latest offset
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, rp)
	}
	for _, shard := range cl.RequestSharded(ctx, req) {
		if shard.Err != nil {
			sreq, _ := shard.Req.(*kmsg.ListOffsetsRequest)
			if sreq == nil {
				continue
			}
			for _, rt := range sreq.Topics {
				for _, rp := range rt.Partitions {
					failed[topicPartition{rt.Topic, rp.Partition}] = shard.Err
				}
			}
			continue
		}
		resp, _ := shard.Resp.(*kmsg.ListOffsetsResponse)
		if resp == nil {
			continue
		}
		for _, rt := range resp.Topics {
			for _, rp := range rt.Partitions {
				tp := topicPartition{rt.Topic, rp.Partition}
				if _, asked := failed[tp]; !asked {
					continue
				}
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					failed[tp] = err
					continue
				}
				ends[tp] = rp.Offset
				delete(failed, tp)
			}
		}
	}
}

// badMap is an offset map ignored: its partition, the committed offset
// it came with, and what was wrong with it.
type badMap struct {
	tp        topicPartition
	committed int64
	why       string
}

// warnMap says that the map b was ignored, and what follows.
func (c *Consumer) warnMap(b badMap) {
	c.log.Warn("consumer: ignoring the offset map committed for a partition: its records from the committed offset on are handled, some perhaps a second time",
		"topic", b.tp.topic, "partition", b.tp.partition, "committed", b.committed, "reason", b.why)
}
