package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/throttle"
)

// Every produced record is handled exactly once when nothing rebalances,
// each partition in offset order, and what was handled is what is
// committed.
func TestEveryRecordHandledInOrderAndCommitted(t *testing.T) {
	t.Parallel()
	const parts, perPart = 4, 100
	kc := kafkaenv.New(t, kafkaenv.Topic("orders", parts))
	produce(t, kc, "orders", parts, perPart, nil)

	h := newHandled(parts * perPart)
	c, err := consumer.New(h.handler("a"), limiter(t, 1000, 100*time.Millisecond), base(kc, "g", "orders")...)
	require.NoError(t, err)
	r := start(t, c)
	h.waitFull(t, 15*time.Second)
	require.NoError(t, r.stop(t))

	byPart := make(map[int32][]int64)
	for _, x := range h.snapshot() {
		byPart[x.partition] = append(byPart[x.partition], x.offset)
	}
	for p := range int32(parts) {
		want := make([]int64, perPart)
		for i := range want {
			want[i] = int64(i)
		}
		assert.Equal(t, want, byPart[p], "partition %d: handled offsets, in handling order", p)
	}
	assert.Equal(t, []int64{perPart, perPart, perPart, perPart}, committed(t, kc, "g", "orders", parts))
	s := c.Stats()
	assert.EqualValues(t, parts*perPart, s.Handled)
	assert.Zero(t, s.Buffered)
	assert.Zero(t, s.InFlight)
	assert.Empty(t, s.Partitions, "no partition is owned after Run")
}

// Three members, one leaving mid-run and one joining: nothing is lost,
// every owner handles a partition in order, the first handling of the
// records of each partition is in offset order, and duplicates (counted)
// are few.
func TestRebalanceLosesNothing(t *testing.T) {
	t.Parallel()
	const parts, batches, perBatch = 6, 30, 4
	kc := kafkaenv.New(t, kafkaenv.Topic("jobs", parts))
	total := parts * batches * perBatch
	h := newHandled(total)

	// Produce in the background, 4 records per partition every 30 ms,
	// so that rebalances happen while records arrive.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range batches {
			produce(t, kc, "jobs", parts, perBatch, nil)
			time.Sleep(30 * time.Millisecond)
		}
	}()
	defer wg.Wait()

	lim := limiter(t, 100, 100*time.Millisecond) // 1000/s for the group
	newMember := func(who string) *running {
		slow := func(ctx context.Context, rec *kgo.Record) error {
			h.add(who, rec)
			time.Sleep(time.Millisecond)
			return nil
		}
		c, err := consumer.New(slow, lim, append(base(kc, "g", "jobs"), consumer.WithQueueSize(8), consumer.WithPollSize(32))...)
		require.NoError(t, err)
		return start(t, c)
	}
	a, b := newMember("a"), newMember("b")
	// a leaves mid-run: once a fifth of the records are handled.
	require.Eventually(t, func() bool { return len(h.snapshot()) >= total/5 }, 30*time.Second, time.Millisecond)
	require.NoError(t, a.stop(t), "a leaves mid-run")
	cm := newMember("c")
	h.waitFull(t, 30*time.Second)
	require.NoError(t, b.stop(t))
	require.NoError(t, cm.stop(t))

	log := h.snapshot()
	handledBy := map[string]int64{}
	lastBy := map[string]int64{}     // (who,partition) → last offset
	nextNew := make(map[int32]int64) // partition → next offset never handled before
	dups := 0
	for _, x := range log {
		handledBy[x.who]++
		k := fmt.Sprintf("%s/%d", x.who, x.partition)
		if last, ok := lastBy[k]; ok {
			assert.Greater(t, x.offset, last, "%s handled partition %d out of order", x.who, x.partition)
		}
		lastBy[k] = x.offset
		switch {
		case x.offset == nextNew[x.partition]:
			nextNew[x.partition]++
		case x.offset < nextNew[x.partition]:
			dups++
		default:
			t.Errorf("partition %d: offset %d handled before %d", x.partition, x.offset, nextNew[x.partition])
		}
	}
	for p := range int32(parts) {
		assert.EqualValues(t, batches*perBatch, nextNew[p], "partition %d: records handled", p)
	}
	t.Logf("handled by member: %v; duplicates: %d of %d handlings", handledBy, dups, len(log))
	assert.NotZero(t, handledBy["a"])
	assert.NotZero(t, handledBy["c"], "the member that joined got partitions")
	// Revocations commit what was handled, so duplicates come only from
	// a member that lost its session; none should here, a few at most.
	assert.LessOrEqual(t, dups, parts, "duplicates")
	assert.EqualValues(t, handledBy["a"], a.c.Stats().Handled)
	assert.EqualValues(t, handledBy["b"]+handledBy["c"], b.c.Stats().Handled+cm.c.Stats().Handled)
	want := make([]int64, parts)
	for i := range want {
		want[i] = batches * perBatch
	}
	assert.Equal(t, want, committed(t, kc, "g", "jobs", parts))
}

// With a limit far below the rate records arrive at, the records the
// consumer holds stay within queue size + poll size per partition, for
// many limiter intervals, because full partitions are paused.
func TestBackpressureBoundsBufferedRecords(t *testing.T) {
	t.Parallel()
	const parts, perPart = 2, 1500
	const queue, poll = 8, 16
	kc := kafkaenv.New(t, kafkaenv.Topic("flood", parts))
	produce(t, kc, "flood", parts, perPart, nil)

	var calls atomic.Int64
	handler := func(context.Context, *kgo.Record) error { calls.Add(1); return nil }
	lim := limiter(t, 5, 100*time.Millisecond) // 50/s, burst 5
	c, err := consumer.New(handler, lim, append(base(kc, "g", "flood"),
		consumer.WithQueueSize(queue), consumer.WithPollSize(poll))...)
	require.NoError(t, err)
	began := time.Now()
	r := start(t, c)

	var sawPaused, sawWaiting bool
	maxTotal := 0
	deadline := time.Now().Add(2 * time.Second) // 20 limiter intervals
	for time.Now().Before(deadline) {
		s := c.Stats()
		maxTotal = max(maxTotal, s.Buffered)
		for _, p := range s.Partitions {
			require.LessOrEqual(t, p.Buffered, queue+poll, "partition %d holds too many records", p.Partition)
			sawPaused = sawPaused || p.Paused
			sawWaiting = sawWaiting || p.Waiting
		}
		time.Sleep(2 * time.Millisecond)
	}
	elapsed := time.Since(began)
	require.NoError(t, r.stop(t))
	s := c.Stats()
	t.Logf("most held: %d in all, %d in one partition (bound %d); handled %d in %v; permit wait %v",
		maxTotal, s.PeakBuffered, queue+poll, s.Handled, elapsed, s.PermitWait)
	assert.LessOrEqual(t, s.PeakBuffered, queue+poll)
	assert.LessOrEqual(t, maxTotal, parts*(queue+poll))
	assert.True(t, sawPaused, "a full partition is paused")
	assert.True(t, sawWaiting, "partitions waited for permits")
	assert.Greater(t, s.PermitWait, time.Second)
	// The handler ran only with permits: at most burst + rate·t.
	assert.LessOrEqual(t, calls.Load(), int64(5+50*elapsed.Seconds()+1))
	assert.GreaterOrEqual(t, calls.Load(), int64(40), "progress")
}

// The bytes a partition holds stay within the queue bytes plus one poll:
// with large values and a slow limiter, fetching pauses on bytes before
// the record count binds.
func TestBackpressureBoundsBufferedBytes(t *testing.T) {
	t.Parallel()
	const value, poll, queueBytes = 1000, 4, 16 << 10
	kc := kafkaenv.New(t, kafkaenv.Topic("big", 1))
	cl, err := kc.Client()
	require.NoError(t, err)
	var recs []*kgo.Record
	for i := range 200 {
		recs = append(recs, &kgo.Record{Topic: "big", Value: fmt.Appendf(nil, "%0*d", value, i)})
	}
	require.NoError(t, cl.ProduceSync(context.Background(), recs...).FirstErr())
	cl.Close()

	lim := limiter(t, 5, 100*time.Millisecond) // 50/s
	c, err := consumer.New(func(context.Context, *kgo.Record) error { return nil }, lim, append(base(kc, "g", "big"),
		consumer.WithQueueBytes(queueBytes), consumer.WithPollSize(poll))...)
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 10*time.Second, "the partition paused", func() bool {
		s := c.Stats()
		return len(s.Partitions) == 1 && s.Partitions[0].Paused
	})
	require.NoError(t, r.stop(t))
	s := c.Stats()
	bound := int64(queueBytes + poll*(value+consumer.RecordOverhead))
	t.Logf("most bytes held: %d (bound %d), records %d", s.PeakBufferedBytes, bound, s.PeakBuffered)
	assert.LessOrEqual(t, s.PeakBufferedBytes, bound)
	assert.Less(t, s.PeakBuffered, 4096, "the bytes bound, not the records bound, paused the partition")
}

// newOwner is a group member that notes, for the first record it handles
// of each partition, the record's offset and the committed offset then.
type newOwner struct {
	kc    *kafkaenv.Cluster
	parts int32
	began time.Time

	mu    sync.Mutex
	first map[int32]firstRecord
	count map[int32]int64
}

type firstRecord struct {
	offset, committed int64
	after             time.Duration // since began
}

func (o *newOwner) handler(t *testing.T) consumer.Handler {
	return func(_ context.Context, rec *kgo.Record) error {
		o.mu.Lock()
		defer o.mu.Unlock()
		if _, ok := o.first[rec.Partition]; !ok {
			o.first[rec.Partition] = firstRecord{
				offset:    rec.Offset,
				committed: committed(t, o.kc, "g", rec.Topic, o.parts)[rec.Partition],
				after:     time.Since(o.began),
			}
		}
		o.count[rec.Partition]++
		return nil
	}
}

// start starts the member with a fast limiter.
func (o *newOwner) start(t *testing.T, topic string) *running {
	o.first, o.count = map[int32]firstRecord{}, map[int32]int64{}
	c, err := consumer.New(o.handler(t), limiter(t, 1000, 100*time.Millisecond), base(o.kc, "g", topic)...)
	require.NoError(t, err)
	o.began = time.Now()
	return start(t, c)
}

// handledAll reports whether n records of each of parts partitions were
// handled.
func (o *newOwner) handledAll(parts int32, n int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for p := range parts {
		if o.count[p] != n {
			return false
		}
	}
	return true
}

// handledSome reports whether every partition seen got n records.
func (o *newOwner) handledSome(n int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for p := range o.first {
		if o.count[p] != n {
			return false
		}
	}
	return true
}

// got returns the first records seen so far.
func (o *newOwner) got() map[int32]firstRecord {
	o.mu.Lock()
	defer o.mu.Unlock()
	return maps.Clone(o.first)
}

// A revoked partition's permit waits end at once, and what it handled is
// committed before the new owner reads it: the new owner starts exactly
// after the old owner's last handled record, long before the old owner's
// next permit.
func TestRevokeEndsPermitWaitsAndCommits(t *testing.T) {
	t.Parallel()
	const parts, perPart = 4, 20
	kc := kafkaenv.New(t, kafkaenv.Topic("tasks", parts))
	produce(t, kc, "tasks", parts, perPart, nil)

	// a: a budget per partition (keyed by partition) of one permit at
	// once, then one per 30 s: every partition handles its first record
	// and then waits.
	h := newHandled(parts)
	lim := limiter(t, 1, 30*time.Second)
	perPartition := consumer.WithLimiterFor(func(r *kgo.Record) throttle.Keyed {
		return lim.Key(strconv.Itoa(int(r.Partition)))
	})
	// A long handler timeout: a revocation that waited for the permits
	// instead of ending the waits would take that long.
	ca, err := consumer.New(h.handler("a"), lim, perPartition,
		kafka(kc, "g", "tasks", kgo.RebalanceTimeout(20*time.Second)),
		consumer.WithHandlerTimeout(10*time.Second),
		consumer.WithLogger(testLogger()))
	require.NoError(t, err)
	a := start(t, ca)
	h.waitFull(t, 10*time.Second)
	require.Eventually(t, func() bool { return ca.Stats().Waiting == parts }, 10*time.Second, time.Millisecond)

	b := &newOwner{kc: kc, parts: parts}
	rb := b.start(t, "tasks")
	require.Eventually(t, func() bool { return len(b.got()) >= 1 }, 10*time.Second, time.Millisecond, "b gets partitions")
	time.Sleep(100 * time.Millisecond)
	// a's shutdown ends its permit waits at once too, and hands the rest
	// over the same way.
	stopAt := time.Now()
	require.NoError(t, a.stop(t))
	assert.Less(t, time.Since(stopAt), 2*time.Second, "a's shutdown waited for its permits")
	require.Eventually(t, func() bool { return b.handledAll(parts, perPart-1) }, 10*time.Second, time.Millisecond, "b handles the rest")
	require.NoError(t, rb.stop(t))

	got := b.got()
	assert.Len(t, got, parts)
	var moved int
	for p, f := range got {
		t.Logf("partition %d: b started at %d (committed %d) %v after joining", p, f.offset, f.committed, f.after)
		assert.EqualValues(t, 1, f.offset, "partition %d: b starts right after a's record", p)
		assert.EqualValues(t, 1, f.committed, "partition %d: a committed its record before b read the partition", p)
		if f.after < 3*time.Second {
			moved++
		}
	}
	assert.NotZero(t, moved, "partitions revoked from a reach b long before a's next permit")
	assert.Equal(t, []int64{perPart, perPart, perPart, perPart}, committed(t, kc, "g", "tasks", parts))
}

// A consumer without a Limiter leaves the permits to the handler's own
// client. When a partition is revoked, a handler still waiting there for
// a permit returns at once (its context's permit waits are stopped), and
// the record goes to the next owner: the revocation does not wait for the
// permits of records it will not handle.
func TestRevokeEndsPermitWaitsInsideHandlers(t *testing.T) {
	t.Parallel()
	const parts, perPart = 4, 20
	kc := kafkaenv.New(t, kafkaenv.Topic("tasks", parts))
	produce(t, kc, "tasks", parts, perPart, nil)

	// The handler's client: a budget per partition of one permit at
	// once, then one per 8 s, within the handler timeout (a permit beyond
	// it would be refused at once).
	h := newHandled(parts)
	lim := limiter(t, 1, 8*time.Second)
	var stopped atomic.Int64
	handler := func(ctx context.Context, r *kgo.Record) error {
		if err := lim.Key(strconv.Itoa(int(r.Partition))).Acquire(ctx, throttle.Forever); err != nil {
			if errors.Is(err, context.Canceled) && ctx.Err() == nil {
				stopped.Add(1) // the wait was stopped; the call was not
				assert.ErrorContains(t, err, "no longer handled here", "the error says why the wait stopped")
			}
			return err
		}
		return h.handler("a")(ctx, r)
	}
	ca, err := consumer.New(handler, nil, consumer.WithOrdering(consumer.ByPartition),
		kafka(kc, "g", "tasks", kgo.RebalanceTimeout(20*time.Second)),
		consumer.WithHandlerTimeout(10*time.Second),
		consumer.WithLogger(testLogger()))
	require.NoError(t, err)
	a := start(t, ca)
	h.waitFull(t, 10*time.Second)
	require.Eventually(t, func() bool { return ca.Stats().InFlight == parts }, 10*time.Second, time.Millisecond,
		"each partition's second record waits for its permit in the handler")

	b := &newOwner{kc: kc, parts: parts}
	rb := b.start(t, "tasks")
	require.Eventually(t, func() bool { return len(b.got()) >= 1 }, 10*time.Second, time.Millisecond, "b gets partitions")
	early := b.got() // partitions revoked from a while its handlers waited
	stopAt := time.Now()
	require.NoError(t, a.stop(t))
	assert.Less(t, time.Since(stopAt), 2*time.Second, "a's shutdown waited for the permits its handlers asked for")
	require.Eventually(t, func() bool { return b.handledAll(parts, perPart-1) }, 10*time.Second, time.Millisecond, "b handles the rest")
	require.NoError(t, rb.stop(t))

	for p, f := range b.got() {
		assert.EqualValues(t, 1, f.offset, "partition %d: b starts with the record whose handler was stopped", p)
		assert.EqualValues(t, 1, f.committed, "partition %d: a committed only the record it handled", p)
	}
	assert.EqualValues(t, parts, stopped.Load(), "every waiting handler was stopped, by the revocation or the shutdown")
	for p, f := range early {
		assert.Less(t, f.after, 3*time.Second, "partition %d reaches b long before the permits a's handler waited for (8 s)", p)
	}
	assert.Equal(t, []int64{perPart, perPart, perPart, perPart}, committed(t, kc, "g", "tasks", parts))
}

// A revoked partition's in-flight handler is let finish, and its record is
// committed before the new owner reads the partition.
func TestRevokeWaitsForInFlightHandler(t *testing.T) {
	t.Parallel()
	const parts, perPart = 4, 20
	kc := kafkaenv.New(t, kafkaenv.Topic("tasks", parts))
	produce(t, kc, "tasks", parts, perPart, nil)

	// a: every partition's first record is in flight, held by gate.
	gate := make(chan struct{})
	var aHandled atomic.Int64
	aHandler := func(ctx context.Context, rec *kgo.Record) error {
		select {
		case <-gate:
			aHandled.Add(1)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// The handlers must outlast the steps below, however slow the
	// machine: a long handler timeout, and so a long rebalance timeout.
	ca, err := consumer.New(aHandler, limiter(t, 1, 30*time.Second, throttle.WithLocalBurst(parts)),
		kafka(kc, "g", "tasks", kgo.RebalanceTimeout(20*time.Second)),
		consumer.WithHandlerTimeout(10*time.Second),
		consumer.WithLogger(testLogger()))
	require.NoError(t, err)
	a := start(t, ca)
	require.Eventually(t, func() bool { return ca.Stats().InFlight == parts }, 10*time.Second, time.Millisecond)

	b := &newOwner{kc: kc, parts: parts}
	rb := b.start(t, "tasks")
	// The revocation has begun once a owns fewer partitions; it must now
	// wait for the handlers.
	require.Eventually(t, func() bool { return len(ca.Stats().Partitions) < parts }, 10*time.Second, time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	assert.Empty(t, b.got(), "b read a partition whose handler was still running at a")
	close(gate)
	require.Eventually(t, func() bool { return len(b.got()) >= 1 }, 10*time.Second, time.Millisecond, "b gets partitions")
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, a.stop(t))
	require.NoError(t, rb.stop(t))

	assert.EqualValues(t, parts, aHandled.Load())
	assert.Zero(t, ca.Stats().Retried, "a handler of a's failed")
	for p, f := range b.got() {
		t.Logf("partition %d: b started at %d (committed %d) %v after joining", p, f.offset, f.committed, f.after)
		assert.EqualValues(t, 1, f.offset, "partition %d: b starts right after a's in-flight record", p)
		assert.EqualValues(t, 1, f.committed, "partition %d: a committed its in-flight record before b read the partition", p)
	}
}

// A handler that ignores its context and outlives the handler timeout
// after its partition was revoked is abandoned: the revocation goes on
// without it, and its late success is never marked, so it cannot rewind
// the new owner's commit (kgo's MarkCommitRecords does not check
// ownership).
func TestAbandonedHandlerIsNeverCommitted(t *testing.T) {
	t.Parallel()
	const parts, perPart = 4, 20
	kc := kafkaenv.New(t, kafkaenv.Topic("tasks", parts))
	produce(t, kc, "tasks", parts, perPart, nil)

	// a: every partition's first record is taken at once; its handler
	// ignores ctx until release.
	release := make(chan struct{})
	var aReturned sync.WaitGroup
	aReturned.Add(parts)
	aHandler := func(context.Context, *kgo.Record) error {
		defer aReturned.Done()
		<-release
		return nil
	}
	lim := limiter(t, 1, 30*time.Second)
	ca, err := consumer.New(aHandler, lim, append(base(kc, "g", "tasks"),
		consumer.WithHandlerTimeout(300*time.Millisecond),
		consumer.WithLimiterFor(func(r *kgo.Record) throttle.Keyed { return lim.Key(strconv.Itoa(int(r.Partition))) }))...)
	require.NoError(t, err)
	a := start(t, ca)
	require.Eventually(t, func() bool { return ca.Stats().InFlight == parts }, 10*time.Second, time.Millisecond)

	// b takes two partitions once a's revocation gives up on the
	// handlers, and handles them from the start.
	b := &newOwner{kc: kc, parts: parts}
	rb := b.start(t, "tasks")
	require.Eventually(t, func() bool { return len(b.got()) == 2 && b.handledSome(perPart) }, 10*time.Second, time.Millisecond)
	moved := b.got()

	// a's handlers now succeed, too late for the revoked partitions.
	close(release)
	aReturned.Wait()
	// b leaves: a commits on the rebalance (a mark from the abandoned
	// handlers would be committed here), then gets all partitions back.
	require.NoError(t, rb.stop(t))
	require.Eventually(t, func() bool { return len(ca.Stats().Partitions) == parts }, 10*time.Second, time.Millisecond)
	require.NoError(t, a.stop(t))

	got := committed(t, kc, "g", "tasks", parts)
	for p := range int32(parts) {
		if f, ok := moved[p]; ok {
			assert.EqualValues(t, 0, f.offset, "partition %d: b starts at the abandoned record", p)
			assert.EqualValues(t, perPart, got[p], "partition %d: b's commit stands", p)
		} else {
			assert.EqualValues(t, 1, got[p], "partition %d: a's late success on a partition it kept is committed", p)
		}
	}
}

// Pausing survives a rebalance in kgo: a partition paused when it was
// revoked must be resumed, or it is never fetched again when it comes back.
func TestPausedPartitionIsFetchedAgainAfterRevoke(t *testing.T) {
	t.Parallel()
	const parts, perPart = 4, 20
	kc := kafkaenv.New(t, kafkaenv.Topic("tasks", parts))
	produce(t, kc, "tasks", parts, perPart, func(p int32, _ int) string { return fmt.Sprint("p", p) })

	// a: a budget per record key of one permit, then one per 30 s. The
	// first records, keyed by partition, make every partition wait with
	// a full queue, so all are paused.
	lim := limiter(t, 1, 30*time.Second)
	var mu sync.Mutex
	aCount := map[int32]int{}
	aHandler := func(_ context.Context, rec *kgo.Record) error {
		mu.Lock()
		aCount[rec.Partition]++
		mu.Unlock()
		return nil
	}
	ca, err := consumer.New(aHandler, lim, append(base(kc, "g", "tasks"),
		consumer.WithQueueSize(2), consumer.WithPollSize(4),
		consumer.WithLimiterFor(func(r *kgo.Record) throttle.Keyed { return lim.Key(string(r.Key)) }))...)
	require.NoError(t, err)
	a := start(t, ca)
	require.Eventually(t, func() bool {
		s := ca.Stats()
		paused := 0
		for _, p := range s.Partitions {
			if p.Paused && p.Waiting {
				paused++
			}
		}
		return paused == parts
	}, 10*time.Second, time.Millisecond, "all of a's partitions paused and waiting")

	// b takes two partitions, handles them, and leaves: a gets them back.
	b := &newOwner{kc: kc, parts: parts}
	rb := b.start(t, "tasks")
	require.Eventually(t, func() bool { return len(b.got()) == 2 && b.handledSome(perPart-1) }, 10*time.Second, time.Millisecond)
	require.NoError(t, rb.stop(t))
	require.Eventually(t, func() bool { return len(ca.Stats().Partitions) == parts }, 10*time.Second, time.Millisecond)

	// New records, each with a key of its own, to the partitions that
	// came back: a must fetch and handle them.
	cl, err := kc.Client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer cl.Close()
	for p := range b.got() {
		for i := range 5 {
			r := &kgo.Record{Topic: "tasks", Partition: p, Key: fmt.Appendf(nil, "new-%d-%d", p, i)}
			require.NoError(t, cl.ProduceSync(context.Background(), r).FirstErr())
		}
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for p := range b.got() {
			if aCount[p] != 1+5 {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond, "a handles the new records of the partitions it got back")
	require.NoError(t, a.stop(t))
}

// A record whose handler always fails goes to the dead-letter topic after
// its attempts, with headers saying where it came from and why, and its
// partition moves on (in order: ByPartition, since the keys differ).
func TestDeadLetter(t *testing.T) {
	t.Parallel()
	const parts, perPart = 2, 10
	kc := kafkaenv.New(t, kafkaenv.Topic("in", parts), kafkaenv.Topic("dlt", 1))
	produce(t, kc, "in", parts, perPart, func(p int32, i int) string {
		if p == 0 && i == 3 {
			return "poison"
		}
		return fmt.Sprintf("k%d", i)
	})

	h := newHandled(parts*perPart - 1)
	var poisonCalls atomic.Int64
	handler := func(ctx context.Context, rec *kgo.Record) error {
		if string(rec.Key) == "poison" {
			poisonCalls.Add(1)
			return errTest
		}
		return h.handler("a")(ctx, rec)
	}
	c, err := consumer.New(handler, limiter(t, 1000, 100*time.Millisecond), append(base(kc, "g", "in"),
		consumer.WithRetry(3, time.Millisecond, 4*time.Millisecond),
		consumer.WithOrdering(consumer.ByPartition),
		consumer.WithDeadLetter("dlt"))...)
	require.NoError(t, err)
	r := start(t, c)
	h.waitFull(t, 10*time.Second)
	require.NoError(t, r.stop(t))

	assert.EqualValues(t, 3, poisonCalls.Load(), "attempts")
	s := c.Stats()
	assert.EqualValues(t, 1, s.DeadLettered)
	assert.EqualValues(t, 2, s.Retried)
	assert.Equal(t, []int64{perPart, perPart}, committed(t, kc, "g", "in", parts), "the dead-lettered record is committed too")

	// Read the dead-letter topic.
	rd, err := kc.Client(kgo.ConsumeTopics("dlt"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer rd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	fs := rd.PollFetches(ctx)
	require.NoError(t, fs.Err())
	recs := fs.Records()
	require.Len(t, recs, 1)
	dl := recs[0]
	assert.Equal(t, "poison", string(dl.Key))
	assert.Equal(t, "p0-3", string(dl.Value))
	got := map[string]string{}
	for _, hd := range dl.Headers {
		got[hd.Key] = string(hd.Value)
	}
	assert.Equal(t, "in", got[consumer.HeaderTopic])
	assert.Equal(t, "0", got[consumer.HeaderPartition])
	assert.Equal(t, "3", got[consumer.HeaderOffset])
	assert.Equal(t, "3", got[consumer.HeaderAttempts])
	assert.Contains(t, got[consumer.HeaderError], errTest.Error())

	// The partition moved on past the poison record, in order.
	var p0 []int64
	for _, x := range h.snapshot() {
		if x.partition == 0 {
			p0 = append(p0, x.offset)
		}
	}
	assert.Equal(t, []int64{0, 1, 2, 4, 5, 6, 7, 8, 9}, p0)
}

// Without a dead-letter topic, a record that fails every attempt stops the
// consumer: Run returns the handler's error, the record's offset is not
// committed, and what other partitions handled is.
func TestStopPolicy(t *testing.T) {
	t.Parallel()
	const parts, perPart = 2, 10
	kc := kafkaenv.New(t, kafkaenv.Topic("in", parts))
	produce(t, kc, "in", parts, perPart, nil)

	var mu sync.Mutex
	count := map[int32]int{}
	var p0After atomic.Bool
	handler := func(ctx context.Context, rec *kgo.Record) error {
		if rec.Partition == 0 && rec.Offset > 5 {
			p0After.Store(true)
		}
		if rec.Partition == 0 && rec.Offset == 5 {
			// Fail only once partition 1 is done, so that its
			// commit can be checked.
			for {
				mu.Lock()
				n := count[1]
				mu.Unlock()
				if n == perPart {
					return fmt.Errorf("offset 5: %w", errTest)
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Millisecond):
				}
			}
		}
		mu.Lock()
		count[rec.Partition]++
		mu.Unlock()
		return nil
	}
	c, err := consumer.New(handler, limiter(t, 1000, 100*time.Millisecond), append(base(kc, "g", "in"),
		consumer.WithRetry(2, time.Millisecond, time.Millisecond))...)
	require.NoError(t, err)
	r := start(t, c)
	err = r.wait(t, 10*time.Second)
	require.Error(t, err)
	assert.ErrorIs(t, err, errTest)
	var herr *consumer.HandlerError
	require.ErrorAs(t, err, &herr)
	assert.Equal(t, consumer.HandlerError{Topic: "in", Partition: 0, Offset: 5, Attempts: 2, Err: herr.Err}, *herr)
	assert.False(t, p0After.Load(), "partition 0 went past the failed record")
	assert.Equal(t, []int64{5, perPart}, committed(t, kc, "g", "in", parts), "the failed record is not committed")
	assert.EqualValues(t, 1, c.Stats().Retried)
}

// Under TimeoutFail, a record that gets no permit within maxWait counts a
// failed attempt and, here, goes to the dead-letter topic with the
// timeout as its error.
func TestPermitTimeoutFails(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("dlt", 1))
	produce(t, kc, "in", 1, 3, nil)

	h := newHandled(1)
	// One permit, then one per minute: records 1 and 2 time out.
	c, err := consumer.New(h.handler("a"), limiter(t, 1, time.Minute), append(base(kc, "g", "in"),
		consumer.WithPermitWait(20*time.Millisecond, consumer.TimeoutFail),
		consumer.WithRetry(2, time.Millisecond, time.Millisecond),
		consumer.WithDeadLetter("dlt"))...)
	require.NoError(t, err)
	r := start(t, c)
	require.Eventually(t, func() bool { return c.Stats().DeadLettered == 2 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, r.stop(t))
	s := c.Stats()
	assert.EqualValues(t, 1, s.Handled)
	assert.EqualValues(t, 4, s.PermitTimeouts)
	assert.Equal(t, []int64{3}, committed(t, kc, "g", "in", 1))
}

func TestNewRefusesBadConfiguration(t *testing.T) {
	t.Parallel()
	h := func(context.Context, *kgo.Record) error { return nil }
	lim := limiter(t, 1, time.Second)
	k := consumer.WithKafka(kgo.SeedBrokers("127.0.0.1:1"))
	for _, tc := range []struct {
		name string
		h    consumer.Handler
		lim  *throttle.Limiter
		opts []consumer.Option
		want string
	}{
		{"nil handler", nil, lim, []consumer.Option{k}, "Handler"},
		{"no kafka", h, lim, nil, "WithKafka"},
		// kgo.NewClient panics on a nil kgo.Opt: refused by New instead.
		{"nil kafka option", h, lim, []consumer.Option{consumer.WithKafka(kgo.SeedBrokers("127.0.0.1:1"), nil)}, "WithKafka"},
		{"negative wait", h, lim, []consumer.Option{k, consumer.WithPermitWait(-1, consumer.TimeoutRetry)}, "WithPermitWait"},
		{"bad policy", h, lim, []consumer.Option{k, consumer.WithPermitWait(1, 7)}, "policy"},
		{"no attempts", h, lim, []consumer.Option{k, consumer.WithRetry(0, 1, 1)}, "attempts"},
		{"zero base", h, lim, []consumer.Option{k, consumer.WithRetry(1, 0, 1)}, "base"},
		{"max below base", h, lim, []consumer.Option{k, consumer.WithRetry(1, 2, 1)}, "max"},
		{"max beyond an hour", h, lim, []consumer.Option{k, consumer.WithRetry(100, 100*time.Millisecond, throttle.Forever)}, "max"},
		{"empty dead letter", h, lim, []consumer.Option{k, consumer.WithDeadLetter("")}, "WithDeadLetter"},
		{"zero handler timeout", h, lim, []consumer.Option{k, consumer.WithHandlerTimeout(0)}, "WithHandlerTimeout"},
		{"zero queue", h, lim, []consumer.Option{k, consumer.WithQueueSize(0)}, "WithQueueSize"},
		{"zero poll", h, lim, []consumer.Option{k, consumer.WithPollSize(0)}, "WithPollSize"},
		{"bad ordering", h, lim, []consumer.Option{k, consumer.WithOrdering(9)}, "WithOrdering"},
		{"zero in flight", h, lim, []consumer.Option{k, consumer.WithMaxInFlight(0)}, "WithMaxInFlight"},
		// A cap left nil by an unchecked constructor would panic in a worker.
		{"nil pointer cap", h, lim, []consumer.Option{k, consumer.WithConcurrency((*bucket.Concurrency)(nil))}, "WithConcurrency = (*bucket.Concurrency)(nil)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := consumer.New(tc.h, tc.lim, tc.opts...)
			require.Error(t, err)
			assert.Nil(t, c)
			assert.ErrorIs(t, err, throttle.ErrInvalid)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestNewRefusesAHandlerTimeoutARebalanceCannotWaitFor(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	h := func(context.Context, *kgo.Record) error { return nil }
	lim := limiter(t, 1, time.Second)

	// A handler timeout that a rebalance could not wait for.
	_, err := consumer.New(h, lim, kafka(kc, "g", "in"), consumer.WithHandlerTimeout(2*time.Second), consumer.WithLogger(testLogger()))
	require.ErrorIs(t, err, throttle.ErrInvalid)
	assert.Contains(t, err.Error(), "rebalance timeout")

	c, err := consumer.New(h, lim, kafka(kc, "g", "in"), consumer.WithHandlerTimeout(time.Second), consumer.WithLogger(testLogger()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, c.Run(ctx))
	assert.ErrorContains(t, c.Run(ctx), "twice", "Run runs once")
}

// flakyBucket fails its first failures Takes as a store would, then
// grants everything.
type flakyBucket struct {
	failures atomic.Int64
	err      error
}

func (b *flakyBucket) Take(context.Context, string, int64, time.Duration) (throttle.Decision, error) {
	if b.failures.Add(-1) >= 0 {
		return throttle.Decision{}, b.err
	}
	return throttle.Decision{Granted: true}, nil
}

// A limiter whose store fails costs the record no attempt: the partition
// backs off and asks again. A misconfigured limiter stops the consumer.
// A record whose cost the budget can never grant fails alone.
func TestLimiterFailures(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("dlt", 1))
	produce(t, kc, "in", 1, 5, nil)

	t.Run("store failure", func(t *testing.T) {
		fb := &flakyBucket{err: &throttle.BackendError{Op: "take", Err: errors.New("connection refused")}}
		fb.failures.Store(3)
		h := newHandled(5)
		c, err := consumer.New(h.handler("a"), throttle.New(fb), append(base(kc, "store", "in"),
			consumer.WithRetry(1, time.Millisecond, time.Millisecond))...)
		require.NoError(t, err)
		r := start(t, c)
		h.waitFull(t, 10*time.Second)
		require.NoError(t, r.stop(t))
		s := c.Stats()
		assert.EqualValues(t, 3, s.LimiterErrors)
		assert.EqualValues(t, 5, s.Handled)
		assert.Zero(t, s.Retried)
	})
	t.Run("misconfigured", func(t *testing.T) {
		fb := &flakyBucket{err: errs.Invalid("test", "limit", 0, "must be at least 1")}
		fb.failures.Store(1)
		h := newHandled(5)
		c, err := consumer.New(h.handler("a"), throttle.New(fb), base(kc, "bad", "in")...)
		require.NoError(t, err)
		r := start(t, c)
		err = r.wait(t, 10*time.Second)
		require.ErrorIs(t, err, throttle.ErrInvalid)
		assert.Equal(t, []int64{-1}, committed(t, kc, "bad", "in", 1))
	})
	t.Run("cost over the limit", func(t *testing.T) {
		fb := &flakyBucket{err: fmt.Errorf("test: 1 permit asked, at most 0 for this key: %w", throttle.ErrExceedsLimit)}
		fb.failures.Store(1)
		h := newHandled(4)
		c, err := consumer.New(h.handler("a"), throttle.New(fb), append(base(kc, "cost", "in"),
			consumer.WithDeadLetter("dlt"))...)
		require.NoError(t, err)
		r := start(t, c)
		h.waitFull(t, 10*time.Second)
		waitFor(t, 10*time.Second, "the record dead-lettered", func() bool { return c.Stats().DeadLettered == 1 })
		require.NoError(t, r.stop(t))
		s := c.Stats()
		assert.EqualValues(t, 4, s.Handled)
		assert.EqualValues(t, 1, s.Refused)
		assert.Zero(t, s.Retried)
		assert.Equal(t, []int64{5}, committed(t, kc, "cost", "in", 1))
	})
	t.Run("refused key without a dead-letter topic", func(t *testing.T) {
		// No dead-letter topic: the refused record stops Run as a
		// record whose attempts all failed does, never a silent drop.
		fb := &flakyBucket{err: fmt.Errorf("test: key too long: %w", throttle.ErrInvalidKey)}
		fb.failures.Store(1)
		c, err := consumer.New(newHandled(5).handler("a"), throttle.New(fb), base(kc, "nodlt", "in")...)
		require.NoError(t, err)
		err = start(t, c).wait(t, 10*time.Second)
		var herr *consumer.HandlerError
		require.ErrorAs(t, err, &herr)
		assert.ErrorIs(t, err, throttle.ErrInvalidKey)
		assert.EqualValues(t, 0, herr.Offset)
		assert.EqualValues(t, 1, c.Stats().Refused)
		assert.Equal(t, []int64{-1}, committed(t, kc, "nodlt", "in", 1))
	})
	t.Run("timeout retry", func(t *testing.T) {
		// One permit per 100 ms, 5 ms waits: most waits time out and
		// are retried without using up the record's attempts.
		h := newHandled(5)
		c, err := consumer.New(h.handler("a"), limiter(t, 1, 100*time.Millisecond), append(base(kc, "retry", "in"),
			consumer.WithPermitWait(5*time.Millisecond, consumer.TimeoutRetry),
			consumer.WithRetry(1, 5*time.Millisecond, 5*time.Millisecond))...)
		require.NoError(t, err)
		r := start(t, c)
		h.waitFull(t, 10*time.Second)
		require.NoError(t, r.stop(t))
		s := c.Stats()
		assert.EqualValues(t, 5, s.Handled)
		assert.NotZero(t, s.PermitTimeouts)
		assert.Zero(t, s.Retried)
		assert.Equal(t, []int64{5}, committed(t, kc, "retry", "in", 1))
	})
}

// A handler timeout so large that twice it overflows (throttle.Forever,
// "no timeout") must still be refused against the rebalance timeout: a
// rebalance would otherwise wait without end for a stuck handler.
func TestNewRefusesAHandlerTimeoutThatOverflows(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	h := func(context.Context, *kgo.Record) error { return nil }
	_, err := consumer.New(h, limiter(t, 1, time.Second), kafka(kc, "g", "in"),
		consumer.WithHandlerTimeout(throttle.Forever), consumer.WithLogger(testLogger()))
	require.ErrorIs(t, err, throttle.ErrInvalid)
	assert.Contains(t, err.Error(), "rebalance timeout")
}

// A short handler timeout bounds handler calls, not commits: a consumer
// whose calls are bounded to a microsecond still commits what it handled
// (before the fix the commit had the handler timeout too, so every
// commit failed and Run returned an error).
func TestShortHandlerTimeoutStillCommits(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, 5, nil)
	h := newHandled(5)
	c, err := consumer.New(h.handler("a"), limiter(t, 100, time.Second), kafka(kc, "g", "in"),
		consumer.WithHandlerTimeout(time.Microsecond), consumer.WithLogger(testLogger()))
	require.NoError(t, err)
	r := start(t, c)
	h.waitFull(t, 10*time.Second)
	require.NoError(t, r.stop(t))
	assert.Equal(t, []int64{5}, committed(t, kc, "g", "in", 1))
}

// The permit the consumer takes for an attempt is in the handler's
// context: a client on the same Limiter inside the handler uses it, so a
// record's call costs one permit, counted at the bucket.
func TestHandlerContextHoldsTheAttemptsPermit(t *testing.T) {
	t.Parallel()
	const records = 40
	kc := kafkaenv.New(t, kafkaenv.Topic("calls", 2))
	produce(t, kc, "calls", 2, records/2, nil)

	local, err := throttle.NewLocal(1000, time.Second)
	require.NoError(t, err)
	b := &countingBucket{Bucket: local}
	lim := throttle.New(b)
	var second atomic.Int64
	h := newHandled(records)
	handle := func(ctx context.Context, rec *kgo.Record) error {
		if err := lim.Acquire(ctx, 0); err != nil { // the client's permit: the held one
			return err
		}
		if err := lim.Acquire(ctx, 0); err == nil { // a second call of the attempt: its own
			second.Add(1)
		}
		h.add("a", rec)
		return nil
	}
	c, err := consumer.New(handle, lim, base(kc, "g", "calls")...)
	require.NoError(t, err)
	r := start(t, c)
	h.waitFull(t, 15*time.Second)
	require.NoError(t, r.stop(t))
	assert.EqualValues(t, records, second.Load())
	assert.EqualValues(t, 2*records, b.takes.Load(), "one permit per record for the consumer and the client together, one for the second call")
}

// A Consumer built without a Limiter takes no permits itself: the
// handler's own calls do.
func TestNilLimiterTakesNoPermits(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("free", 1))
	produce(t, kc, "free", 1, 20, nil)
	h := newHandled(20)
	c, err := consumer.New(h.handler("a"), nil, base(kc, "g", "free")...)
	require.NoError(t, err)
	r := start(t, c)
	h.waitFull(t, 15*time.Second)
	require.NoError(t, r.stop(t))
	assert.Equal(t, []int64{20}, committed(t, kc, "g", "free", 1))
}

// countingBucket counts the permits asked of its inner bucket; with a
// margin, its grants are usable for that long after their time
// (throttle.Decision.Margin), as the Redis buckets' are.
type countingBucket struct {
	throttle.Bucket
	margin time.Duration
	takes  atomic.Int64
}

func (c *countingBucket) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	c.takes.Add(n)
	d, err := c.Bucket.Take(ctx, key, n, maxWait)
	if d.Granted && c.margin > 0 {
		d.Margin = c.margin
	}
	return d, err
}

// The attempt's permit is the attempt's: a goroutine the handler starts
// with a context detached from its cancellation (context.WithoutCancel),
// that calls after the handler returned, takes a permit of its own,
// rather than spending one granted for a call that ended.
func TestHeldPermitEndsWithTheAttempt(t *testing.T) {
	t.Parallel()
	const records = 10
	kc := kafkaenv.New(t, kafkaenv.Topic("late", 1))
	produce(t, kc, "late", 1, records, nil)

	local, err := throttle.NewLocal(1000, time.Second)
	require.NoError(t, err)
	b := &countingBucket{Bucket: local}
	lim := throttle.New(b)
	h := newHandled(records)
	var late sync.WaitGroup
	handle := func(ctx context.Context, rec *kgo.Record) error {
		detached := context.WithoutCancel(ctx)
		late.Add(1)
		go func() {
			defer late.Done()
			<-ctx.Done() // the handler has returned
			assert.NoError(t, lim.Acquire(detached, 0))
		}()
		h.add("a", rec)
		return nil // no call of its own: the attempt's permit is unused
	}
	c, err := consumer.New(handle, lim, base(kc, "g", "late")...)
	require.NoError(t, err)
	r := start(t, c)
	h.waitFull(t, 15*time.Second)
	require.NoError(t, r.stop(t))
	late.Wait()
	assert.EqualValues(t, 2*records, b.takes.Load(), "one permit per attempt, one per call made after it ended")
}

// A handler whose own client had no permit within the call's deadline
// (an error matching throttle.ErrTimeout) met a permit timeout, not a
// failure of the record: under TimeoutRetry the call is made again after
// the permit back-off without using up an attempt; under TimeoutFail it
// is a failed attempt.
func TestHandlerPermitTimeoutFollowsTheTimeoutPolicy(t *testing.T) {
	t.Parallel()
	clientTimeout := fmt.Errorf("the client's Acquire: %w", throttle.ErrTimeout)
	for name, policy := range map[string]consumer.TimeoutPolicy{"retry": consumer.TimeoutRetry, "fail": consumer.TimeoutFail} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
			produce(t, kc, "in", 1, 1, nil)
			var calls atomic.Int64
			done := make(chan struct{})
			handler := func(ctx context.Context, rec *kgo.Record) error {
				if calls.Add(1) <= 3 {
					return clientTimeout
				}
				close(done)
				return nil
			}
			c, err := consumer.New(handler, nil, append(base(kc, "g", "in"),
				consumer.WithRetry(1, time.Millisecond, 4*time.Millisecond),
				consumer.WithPermitWait(throttle.Forever, policy))...)
			require.NoError(t, err)
			r := start(t, c)
			if policy == consumer.TimeoutFail {
				err := r.wait(t, 10*time.Second)
				var herr *consumer.HandlerError
				require.ErrorAs(t, err, &herr)
				assert.ErrorIs(t, err, throttle.ErrTimeout)
				assert.Equal(t, 1, herr.Attempts, "the timeout used up the record's one attempt")
				return
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("the record was not handled; %d calls", calls.Load())
			}
			require.NoError(t, r.stop(t))
			assert.EqualValues(t, 4, calls.Load(), "three calls met a timeout, the fourth was handled")
			s := c.Stats()
			assert.EqualValues(t, 1, s.Handled)
			assert.EqualValues(t, 3, s.PermitTimeouts)
			assert.EqualValues(t, 0, s.Retried, "a permit timeout is no retry of a failed attempt")
			assert.Equal(t, []int64{1}, committed(t, kc, "g", "in", 1))
		})
	}
}

// The permits a consumer takes are its calls' and those no call used
// (Stats.PermitsUnused): a handler that makes no call leaves its
// attempt's permit unused, and one whose client had not called when the
// permit's margin passed does not spend it (Stats.PermitsStale too): the
// call takes a permit of its own.
func TestPermitsNoCallUsedAreCounted(t *testing.T) {
	t.Parallel()
	const records = 6
	kc := kafkaenv.New(t, kafkaenv.Topic("slow", 1))
	produce(t, kc, "slow", 1, records, nil)

	local, err := throttle.NewLocal(1000, time.Second)
	require.NoError(t, err)
	b := &countingBucket{Bucket: local, margin: 10 * time.Millisecond}
	clock := clockwork.NewFakeClock()
	lim := throttle.New(b, throttle.WithClock(clock))
	h := newHandled(records)
	var calls atomic.Int64
	handle := func(ctx context.Context, rec *kgo.Record) error {
		defer h.add("a", rec)
		switch rec.Offset % 3 {
		case 0:
			return nil // no call
		case 1:
			clock.Advance(time.Second) // the handler was slow to call: the margin passed
		}
		if err := lim.Acquire(ctx, 0); err != nil {
			return err
		}
		calls.Add(1)
		return nil
	}
	c, err := consumer.New(handle, lim, base(kc, "g", "slow")...)
	require.NoError(t, err)
	r := start(t, c)
	h.waitFull(t, 15*time.Second)
	require.NoError(t, r.stop(t))
	s := c.Stats()
	assert.EqualValues(t, 4, calls.Load())
	assert.EqualValues(t, 2, s.PermitsStale, "the permits of offsets 1 and 4 went stale in their handlers")
	assert.EqualValues(t, 4, s.PermitsUnused, "offsets 0 and 3 made no call, 1 and 4 called with permits of their own")
	assert.EqualValues(t, calls.Load()+s.PermitsUnused, b.takes.Load(), "permits taken: one per call, and those no call used")
}
