package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/kafkaenv"
)

// A stuck record does not make the rest of its partition pile up in
// memory. Six partitions of 20,000 small records (about 40 bytes each),
// default options: the handler of one record per partition waits until
// released while the others it holds are handled. The finished records behind
// the stuck one cost their offsets only, and once the partition holds
// its bound of uncommitted records its fetching pauses: the heap grows
// by at most 8 MiB (measured after a collection; 120,000 records held as
// kgo records cost about 30 MiB). Once the stuck records are released,
// every record is handled, none twice. Not parallel: the heap is the
// process's.
//
//	go test -race -count=1 -run TestStuckRecordDoesNotHoldItsPartition -v ./consumer/
func TestStuckRecordDoesNotHoldItsPartition(t *testing.T) {
	const parts, perPart, stuckAt = 6, 20000, 100
	kc := kafkaenv.New(t, kafkaenv.Topic("stuck", parts))
	produce(t, kc, "stuck", parts, perPart, func(p int32, i int) string { return fmt.Sprintf("key-%d-%05d", p, i) })

	var calls [parts][perPart]atomic.Int32
	var handled atomic.Int64
	release := make(chan struct{})
	h := func(ctx context.Context, rec *kgo.Record) error {
		if rec.Offset == stuckAt {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		calls[rec.Partition][rec.Offset].Add(1)
		handled.Add(1)
		return nil
	}
	c, err := consumer.New(h, nil,
		kafka(kc, "g", "stuck", kgo.RebalanceTimeout(60*time.Second)),
		consumer.WithHandlerTimeout(30*time.Second),
		consumer.WithLogger(testLogger()))
	require.NoError(t, err)
	before := heapInUse()
	r := start(t, c)
	// How many records a partition takes before its fetching pauses
	// depends on how Kafka's fetches cut its batches (all 20,000 in one,
	// or a few thousand at a time when the producer flushed smaller
	// batches on a busy machine): wait until every partition is paused
	// and every record the consumer holds but the stuck ones is handled
	// (those before a stuck record are committed, no longer held).
	waitFor(t, 60*time.Second, "every partition paused, every record held but the stuck ones handled", func() bool {
		s := c.Stats()
		paused := 0
		for _, p := range s.Partitions {
			if p.Paused {
				paused++
			}
		}
		return paused == parts && handled.Load() == int64(s.Buffered-parts+parts*stuckAt)
	})
	time.Sleep(300 * time.Millisecond) // let the client settle its fetches
	grew := heapInUse() - before
	s := c.Stats()
	t.Logf("heap grew by %.2f MiB, %d records held (%d handled), peak %d records / %d bytes per partition",
		float64(grew)/(1<<20), s.Buffered, handled.Load(), s.PeakBuffered, s.PeakBufferedBytes)
	assert.LessOrEqual(t, grew, int64(8<<20), "heap growth with one stuck record per partition")

	close(release)
	waitFor(t, 60*time.Second, "every record handled", func() bool { return handled.Load() >= parts*perPart })
	require.NoError(t, r.stop(t))
	for p := range parts {
		for o := range perPart {
			if n := calls[p][o].Load(); n != 1 {
				t.Errorf("record %d@%d handled %d times, want once", p, o, n)
			}
		}
	}
}

// Behind a stuck record, its partition stops at its bound of uncommitted
// records (queue size plus one poll), paused, until the policies chosen
// deal with the stuck record: here the handler timeout ends its one
// attempt and it goes to the dead-letter topic; then the partition
// resumes, and every other record is handled once.
func TestStuckRecordPausesItsPartitionUntilThePoliciesEndIt(t *testing.T) {
	t.Parallel()
	const n, stuckAt, queue, poll = 1000, 5, 64, 16
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("dlt", 1))
	produce(t, kc, "in", 1, n, func(_ int32, i int) string { return fmt.Sprint("k", i) })

	var calls [n]atomic.Int32
	var handled atomic.Int64
	h := func(ctx context.Context, rec *kgo.Record) error {
		if rec.Offset == stuckAt {
			<-ctx.Done() // the handler timeout
			return ctx.Err()
		}
		calls[rec.Offset].Add(1)
		handled.Add(1)
		return nil
	}
	c, err := consumer.New(h, nil,
		kafka(kc, "g", "in", kgo.RebalanceTimeout(10*time.Second)),
		consumer.WithHandlerTimeout(3*time.Second), // room to see the pause first
		consumer.WithLogger(testLogger()),
		consumer.WithQueueSize(queue), consumer.WithPollSize(poll),
		consumer.WithRetry(1, time.Millisecond, time.Millisecond),
		consumer.WithDeadLetter("dlt"))
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 10*time.Second, "the partition paused behind its stuck record", func() bool {
		s := c.Stats()
		return len(s.Partitions) == 1 && s.Partitions[0].Paused && s.DeadLettered == 0 && s.Handled >= queue-1
	})
	s := c.Stats()
	assert.LessOrEqual(t, s.Partitions[0].Buffered, queue+poll, "records held behind the stuck one")
	assert.Less(t, s.Handled, int64(n-1), "the partition went on past its bound")

	waitFor(t, 15*time.Second, "the stuck record dead-lettered and the rest handled", func() bool {
		s := c.Stats()
		return s.DeadLettered == 1 && handled.Load() == n-1
	})
	require.NoError(t, r.stop(t))
	assert.LessOrEqual(t, c.Stats().PeakBuffered, queue+poll)
	for o := range n {
		want := int32(1)
		if o == stuckAt {
			want = 0
		}
		if got := calls[o].Load(); got != want {
			t.Errorf("record %d handled %d times, want %d", o, got, want)
		}
	}
	assert.Equal(t, []int64{n}, committed(t, kc, "g", "in", 1))
}

// The byte bound counts a finished record behind a stuck one for its
// offset only, so a partition paused at the byte bound resumes once the
// records behind the stuck one are finished and it holds half its bytes
// and records, though the stuck record is still in its handler. Records
// of 4 KiB, a byte bound of 64 KiB: the first sixteen come in one batch
// and fill the bound (each its own key); once fifteen of them are handled the partition
// holds about 5 KiB and fetches the rest, all handled while record 0 is
// stuck.
func TestPartitionPausedAtTheByteBoundResumesOnceRecordsBehindTheStuckOneFinish(t *testing.T) {
	t.Parallel()
	const n, size, queueBytes = 100, 4 << 10, 64 << 10
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	cl, err := kc.Client(kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(50*time.Millisecond))
	require.NoError(t, err)
	value := make([]byte, size)
	var recs []*kgo.Record
	for i := range 16 {
		recs = append(recs, &kgo.Record{Topic: "in", Key: fmt.Append(nil, i), Value: value})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, cl.ProduceSync(ctx, recs...).FirstErr())
	for i := 16; i < n; i++ { // one batch each: fetches of a quarter of the bound
		require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: "in", Key: fmt.Append(nil, i), Value: value}).FirstErr())
	}
	cl.Close()

	var calls [n]atomic.Int32
	var handled atomic.Int64
	release := make(chan struct{})
	h := func(ctx context.Context, rec *kgo.Record) error {
		if rec.Offset == 0 {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		calls[rec.Offset].Add(1)
		handled.Add(1)
		return nil
	}
	c, err := consumer.New(h, nil,
		kafka(kc, "g", "in", kgo.RebalanceTimeout(60*time.Second)),
		consumer.WithHandlerTimeout(30*time.Second),
		consumer.WithLogger(testLogger()),
		consumer.WithQueueBytes(queueBytes))
	require.NoError(t, err)
	r := start(t, c)
	var released sync.Once
	t.Cleanup(func() { // before r.stop's
		if t.Failed() {
			t.Logf("stats: %+v", c.Stats())
		}
		released.Do(func() { close(release) })
	})
	waitFor(t, 10*time.Second, "every record but the stuck one handled while it is stuck", func() bool { return handled.Load() == n-1 })
	assert.GreaterOrEqual(t, c.Stats().PeakBufferedBytes, int64(queueBytes), "the partition reached its byte bound")
	released.Do(func() { close(release) })
	waitFor(t, 10*time.Second, "every record handled", func() bool { return handled.Load() == n })
	require.NoError(t, r.stop(t))
	for o := range n {
		if got := calls[o].Load(); got != 1 {
			t.Errorf("record %d handled %d times, want once", o, got)
		}
	}
	assert.Equal(t, []int64{n}, committed(t, kc, "g", "in", 1))
}
