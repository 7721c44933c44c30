package consumer

// Tests that drive the consumer's rebalance callbacks directly, in the
// order kgo could call them, against a real kgo client on kfake: the
// sequences are hard to force through a group, and here each step is
// exact.

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/throttle"
)

// bare is a Consumer prepared as Run would prepare it, with a kgo client
// on kc that belongs to no group: the test plays kgo's part and calls the
// callbacks itself.
func bare(t *testing.T, kc *kafkaenv.Cluster, h Handler, opts ...Option) (*Consumer, *kgo.Client) {
	t.Helper()
	b, err := throttle.NewLocal(1000, 100*time.Millisecond)
	require.NoError(t, err)
	opts = append([]Option{
		WithKafka(kgo.SeedBrokers(kc.Addrs()...), kgo.ConsumerGroup("bare"), kgo.ConsumeTopics("in")),
		WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
	}, opts...)
	c, err := New(h, throttle.New(b), opts...)
	require.NoError(t, err)
	_, stop := c.prepare(context.Background())
	if c.cfg.deadLetter != "" || c.cfg.shaping != "" {
		c.prod, err = c.newProducer()
		require.NoError(t, err)
	}
	cl, err := kc.Client()
	require.NoError(t, err)
	t.Cleanup(func() {
		c.mu.Lock()
		c.closing = true
		c.mu.Unlock()
		_ = c.stopAll(cl)
		cl.Close()
		c.prod.close()
		c.wg.Wait()
		c.sched.stop()
		stop(nil)
	})
	return c, cl
}

func tps(topic string, ids ...int32) map[string][]int32 { return map[string][]int32{topic: ids} }

// part returns the running partition of topic, id.
func (c *Consumer) part(topic string, id int32) *partition {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.parts[topicPartition{topic, id}]
}

// A partition revoked twice in quick succession while a call from its
// first ownership, abandoned at the handler timeout, still runs: the third
// ownership must wait for that call too (before the fix it waited only for
// the second ownership, which had exited at once).
func TestRegressionRevokedTwiceWhileAnAbandonedCallRuns(t *testing.T) {
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	release := make(chan struct{})
	var firstReturned, overlap, secondDone atomic.Bool
	h := func(_ context.Context, rec *kgo.Record) error {
		if rec.Offset == 0 {
			<-release // ignores its context: abandoned at the timeout
			firstReturned.Store(true)
			return nil
		}
		if !firstReturned.Load() {
			overlap.Store(true)
		}
		secondDone.Store(true)
		return nil
	}
	c, cl := bare(t, kc, h, WithHandlerTimeout(50*time.Millisecond))
	ctx := context.Background()

	c.assigned(ctx, cl, tps("in", 0))
	c.part("in", 0).push([]*kgo.Record{{Topic: "in", Partition: 0, Offset: 0}})
	require.Eventually(t, func() bool { return c.Stats().InFlight == 1 }, 10*time.Second, time.Millisecond)
	c.revoked(ctx, cl, tps("in", 0)) // abandons the call after 50 ms
	c.assigned(ctx, cl, tps("in", 0))
	c.revoked(ctx, cl, tps("in", 0)) // the second ownership exits at once
	c.assigned(ctx, cl, tps("in", 0))
	// Same key (none): the record must wait for the abandoned call.
	c.part("in", 0).push([]*kgo.Record{{Topic: "in", Partition: 0, Offset: 1}})

	// Hold a window open in which an overlapping call would start.
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) && !secondDone.Load() {
		time.Sleep(time.Millisecond)
	}
	close(release)
	require.Eventually(t, secondDone.Load, 10*time.Second, time.Millisecond)
	assert.False(t, overlap.Load(), "two calls for one key of one partition overlapped")
}

// A rebalance that arrives while Run shuts down must wait for the revoked
// partitions' running handlers (or fence them) before it returns and the
// partitions are handed on: before the fix it returned at once, and the
// handler's later success was marked and committed over the new owner's
// offsets.
func TestRegressionRevokeDuringShutdownWaitsForHandlers(t *testing.T) {
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	gate := make(chan struct{})
	var returned atomic.Bool
	h := func(ctx context.Context, _ *kgo.Record) error {
		defer returned.Store(true)
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c, cl := bare(t, kc, h, WithHandlerTimeout(5*time.Second))
	ctx := context.Background()
	c.assigned(ctx, cl, tps("in", 0))
	p := c.part("in", 0)
	p.push([]*kgo.Record{{Topic: "in", Partition: 0, Offset: 0}})
	require.Eventually(t, func() bool { return c.Stats().InFlight == 1 }, 10*time.Second, time.Millisecond)

	// Run shuts down: no more assignments, every partition stopping.
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = c.stopAll(cl) }()

	// A rebalance revokes the partition meanwhile.
	handedOn := make(chan bool, 1) // safe to hand on when revoked returned
	go func() {
		c.revoked(ctx, cl, tps("in", 0))
		handedOn <- returned.Load() || p.isFenced()
	}()
	var safe bool
	select {
	case safe = <-handedOn:
	case <-time.After(300 * time.Millisecond): // still waiting: good
		close(gate)
		safe = <-handedOn
	}
	assert.True(t, safe, "the revocation handed the partition on while its handler ran, unfenced")
	select {
	case <-gate:
	default:
		close(gate)
	}
	<-stopped
}

// Dead-letter writes of two partitions share the dead-letter topic's
// produce batches; revoking one partition must not fail the other's write
// (before the fix its context was the partition's, kgo failed the batch
// with context.Canceled, and the consumer stopped).
func TestRegressionRevokeDoesNotFailAnotherPartitionsDeadLetter(t *testing.T) {
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 2), kafkaenv.Topic("dlt", 1))
	var calls atomic.Int64
	h := func(context.Context, *kgo.Record) error {
		calls.Add(1)
		return errors.New("test: always fails")
	}
	c, cl := bare(t, kc, h, WithRetry(1, time.Millisecond, time.Millisecond),
		WithDeadLetter("dlt"), WithHandlerTimeout(200*time.Millisecond))
	ctx := context.Background()

	// Produce requests fail (retriably) until lifted: dead-letter
	// records stay buffered in the client.
	fault := kc.Fake().Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotLeaderForPartition, Count: -1})
	c.assigned(ctx, cl, tps("in", 0, 1))
	c.part("in", 0).push([]*kgo.Record{{Topic: "in", Partition: 0, Offset: 0}})
	require.Eventually(t, func() bool { return fault.Hits() >= 1 }, 10*time.Second, time.Millisecond, "partition 0's write is being retried")
	c.part("in", 1).push([]*kgo.Record{{Topic: "in", Partition: 1, Offset: 0}})
	require.Eventually(t, func() bool { return c.prod.normal.BufferedProduceRecords() == 2 }, 10*time.Second, time.Millisecond, "both writes buffered")

	// Partition 0 is revoked: its write is abandoned at the handler
	// timeout; partition 1 stays.
	c.revoked(ctx, cl, tps("in", 0))
	fault.Remove()
	require.Eventually(t, func() bool { return c.deadLettered.Load() >= 1 || c.failure.Load() != nil }, 10*time.Second, time.Millisecond,
		"partition 1's record dead-lettered")
	if errp := c.failure.Load(); errp != nil {
		t.Fatalf("the consumer stopped: %v", *errp)
	}
	assert.EqualValues(t, 1, c.deadLettered.Load())
	assert.EqualValues(t, 2, calls.Load())
}

// signalHandler is a slog handler that sends the message of every record
// on ch (and drops what ch cannot take).
type signalHandler struct{ ch chan string }

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h signalHandler) Handle(_ context.Context, r slog.Record) error {
	select {
	case h.ch <- r.Message:
	default:
	}
	return nil
}
func (h signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h signalHandler) WithGroup(string) slog.Handler      { return h }

// Stats.Retried counts attempts after a record's first. A retry whose
// backoff is cut short by a revocation is never attempted, and must not
// be counted (before the fix it was counted when the backoff began).
func TestRetryCutShortByRevocationIsNotCounted(t *testing.T) {
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	var calls atomic.Int64
	h := func(context.Context, *kgo.Record) error {
		calls.Add(1)
		return errors.New("test: always fails")
	}
	logs := make(chan string, 64)
	c, cl := bare(t, kc, h, WithRetry(3, time.Hour, time.Hour), WithLogger(slog.New(signalHandler{logs})))
	ctx := context.Background()
	c.assigned(ctx, cl, tps("in", 0))
	c.part("in", 0).push([]*kgo.Record{{Topic: "in", Partition: 0, Offset: 0}})
	for msg := range logs {
		if msg == "consumer: attempt failed; retrying" {
			break // the worker is about to sleep for an hour
		}
	}
	c.revoked(ctx, cl, tps("in", 0))
	assert.EqualValues(t, 1, calls.Load(), "handler calls")
	assert.Zero(t, c.Stats().Retried, "a retry that never happened was counted")
}

// A handler that panics while its partition is being revoked does not take
// the process down nor hold up the revocation: the attempt fails, is not
// retried by a partition that is no longer ours, and its record is left
// for the next owner (not finished, not marked).
func TestPanicDuringRevocationLeavesTheRecordForTheNextOwner(t *testing.T) {
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	revoking := make(chan struct{})
	h := func(context.Context, *kgo.Record) error {
		<-revoking
		panic("test: boom while revoked")
	}
	c, cl := bare(t, kc, h, WithHandlerTimeout(5*time.Second), WithRetry(5, time.Millisecond, time.Millisecond))
	ctx := context.Background()
	c.assigned(ctx, cl, tps("in", 0))
	p := c.part("in", 0)
	p.push([]*kgo.Record{{Topic: "in", Partition: 0, Offset: 0}})
	require.Eventually(t, func() bool { return c.Stats().InFlight == 1 }, 10*time.Second, time.Millisecond)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.revoked(ctx, cl, tps("in", 0))
	}()
	require.Eventually(t, func() bool { return p.soft.Err() != nil }, 10*time.Second, time.Millisecond, "the revocation began")
	close(revoking)
	select {
	case <-done:
	case <-time.After(4 * time.Second):
		t.Fatal("the revocation waited for the panicking handler to time out")
	}
	assert.False(t, p.isFenced(), "the revocation gave up on the call instead of seeing it end")
	assert.EqualValues(t, -1, p.through, "the record was finished")
	assert.Zero(t, c.Stats().Retried)
	assert.Nil(t, c.failure.Load(), "the consumer stopped")
}

// Stats may be called all the time, from many goroutines, while records
// are handled and partitions come and go: the race detector watches.
func TestStatsWhileRebalancing(t *testing.T) {
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 4))
	c, cl := bare(t, kc, func(context.Context, *kgo.Record) error { return nil })
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				s := c.Stats()
				if s.Buffered < 0 || s.BufferedBytes < 0 || s.Active < 0 {
					t.Errorf("negative gauge: %+v", s)
					return
				}
			}
		}()
	}
	for round := range 50 {
		c.assigned(ctx, cl, tps("in", 0, 1, 2, 3))
		for id := range int32(4) {
			c.part("in", id).push([]*kgo.Record{{Topic: "in", Partition: id, Offset: int64(round), Key: []byte("k")}})
		}
		c.revoked(ctx, cl, tps("in", 0, 1, 2, 3))
	}
	close(stop)
	wg.Wait()
	assert.Empty(t, c.Stats().Partitions)
}

// A stopped ownership whose call outlives the handler timeout gives back
// the key, value and headers of the records it will never handle: each
// revocation while the call runs would otherwise keep another queue's
// worth of bytes, beyond the partition's byte bound and unseen by Stats.
func TestStoppedPartitionKeepsOnlyTheBytesOfItsRecordsInWork(t *testing.T) {
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	release := make(chan struct{})
	defer close(release)
	h := func(_ context.Context, rec *kgo.Record) error {
		<-release // ignores its context: abandoned at the timeout
		return nil
	}
	c, cl := bare(t, kc, h, WithHandlerTimeout(50*time.Millisecond))
	ctx := context.Background()
	c.assigned(ctx, cl, tps("in", 0))
	p := c.part("in", 0)
	const n, size = 20, 10_000
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: "in", Partition: 0, Offset: int64(i), Key: []byte("a"), Value: make([]byte, size)})
	}
	p.push(recs)
	require.Eventually(t, func() bool { return c.Stats().InFlight == 1 }, 10*time.Second, time.Millisecond)
	c.revoked(ctx, cl, tps("in", 0)) // abandons the call after 50 ms
	require.True(t, p.isFenced())

	held, bytes := p.held()
	assert.Equal(t, n, held, "every record stays unfinished: none is committed")
	assert.LessOrEqual(t, bytes, int64(size+1+n*RecordOverhead), "bytes kept for records that will never be handled")
}
