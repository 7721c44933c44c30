package consumer

import (
	"context"
	"log/slog"
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
)

// parkedBefore writes to the shaping topic the parked copy of a record of
// key at in[0]@off, as a member that parked it would have.
func parkedBefore(t *testing.T, kc *kafkaenv.Cluster, shaping, key string, off int64) {
	t.Helper()
	s := &record{rec: kgo.Record{Topic: "in", Partition: 0, Offset: off, Key: []byte(key), Value: []byte("parked")}}
	cl, err := kc.Client()
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.ProduceSync(context.Background(), parkRecord(shaping, s, 0)).FirstErr())
}

// holdFetches makes the cluster answer every Fetch of topic with a
// retriable error (the client retries it, backing off, and reads nothing)
// until release is called (at the latest when the test ends). fetching
// waits for the first such answer. No request is held inside kfake:
// requests slept in a control function (SleepControl) that wake together
// can leave kfake's run loop stuck.
func holdFetches(t *testing.T, kc *kafkaenv.Cluster, topic string) (fetching func(), release func()) {
	h := kc.Fake().Fault(kfake.Fault{
		Keys:  []kmsg.Key{kmsg.Fetch},
		Topic: topic,
		Err:   kerr.NotLeaderForPartition,
		Count: -1,
	})
	t.Cleanup(h.Remove)
	fetching = func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, h.Wait(ctx, 1), "no Fetch of %s", topic)
	}
	return fetching, h.Remove
}

// waited reports whether p is done waiting for earlier ownerships and its
// scan, and whether it started.
func (p *partition) waitState() (waited, started bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waited, p.started
}

// A partition whose scan of the shaping topic is cut short (here by Run
// ending while the scan reads) does not start: the scan may have missed
// a parked unit, whose next record would then be handled in place, ahead
// of its parked one, and committed.
func TestPartitionDoesNotStartAfterAScanCutShort(t *testing.T) {
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("in.shaping", 1))
	parkedBefore(t, kc, "in.shaping", "k", 0)
	fetching, _ := holdFetches(t, kc, "in.shaping")
	var calls atomic.Int64
	c, cl := bare(t, kc, func(context.Context, *kgo.Record) error { calls.Add(1); return nil },
		WithShaping("in.shaping", 50*time.Millisecond))
	c.assigned(context.Background(), cl, tps("in", 0))
	p := c.part("in", 0)
	p.push([]*kgo.Record{{Topic: "in", Partition: 0, Offset: 1, Key: []byte("k")}})
	fetching() // the scan reads the shaping topic

	c.stopRun(nil) // Run ends
	require.Eventually(t, func() bool { w, _ := p.waitState(); return w }, 10*time.Second, time.Millisecond)
	_, started := p.waitState()
	assert.False(t, started, "the partition started on a scan cut short")
	assert.Zero(t, calls.Load(), "the parked key's next record was handled in place")
}

// A scan that takes long keeps reading, warning as it goes, rather than
// giving up and starting the partitions with what it read: they wait, and
// once it has read to the end the parked key's next record is parked
// behind the parked one.
func TestSlowScanKeepsThePartitionWaitingUntilItHasReadTheShapingTopic(t *testing.T) {
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("in.shaping", 1))
	parkedBefore(t, kc, "in.shaping", "k", 0)
	fetching, release := holdFetches(t, kc, "in.shaping")
	var calls atomic.Int64
	w := &warnings{}
	c, cl := bare(t, kc, func(context.Context, *kgo.Record) error { calls.Add(1); return nil },
		WithShaping("in.shaping", 50*time.Millisecond), WithLogger(slog.New(w)))
	c.cfg.scanWarn = 20 * time.Millisecond
	c.assigned(context.Background(), cl, tps("in", 0))
	p := c.part("in", 0)
	p.push([]*kgo.Record{{Topic: "in", Partition: 0, Offset: 1, Key: []byte("k")}})
	fetching()
	require.Eventually(t, func() bool { return w.has("still reading the shaping topic") }, 10*time.Second, time.Millisecond)
	waited, _ := p.waitState()
	assert.False(t, waited, "the partition did not wait for the scan")

	release()
	require.Eventually(t, func() bool { return c.parked.Load() == 1 }, 10*time.Second, time.Millisecond,
		"the parked key's next record parked behind its parked one")
	assert.Zero(t, calls.Load(), "the parked key's next record was handled in place")
}

// A partition assigned together with one whose earlier ownership still
// has a call running (abandoned at the handler timeout, ignoring its
// context) starts at once: its scan of the shaping topic does not wait for
// another partition's earlier ownership.
func TestScanDoesNotWaitForAnotherPartitionsAbandonedCall(t *testing.T) {
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 2), kafkaenv.Topic("in.shaping", 1))
	release := make(chan struct{})
	defer close(release)
	var handled atomic.Int64
	h := func(_ context.Context, rec *kgo.Record) error {
		if rec.Partition == 0 && rec.Offset == 0 {
			<-release // ignores its context
		}
		handled.Add(1)
		return nil
	}
	c, cl := bare(t, kc, h, WithShaping("in.shaping", time.Minute), WithHandlerTimeout(50*time.Millisecond))
	ctx := context.Background()
	c.assigned(ctx, cl, tps("in", 0))
	c.part("in", 0).push([]*kgo.Record{{Topic: "in", Partition: 0, Offset: 0, Key: []byte("a")}})
	require.Eventually(t, func() bool { return c.Stats().InFlight == 1 }, 10*time.Second, time.Millisecond)
	c.revoked(ctx, cl, tps("in", 0)) // abandons the call after 50 ms

	c.assigned(ctx, cl, tps("in", 0, 1))
	c.part("in", 1).push([]*kgo.Record{{Topic: "in", Partition: 1, Offset: 0, Key: []byte("b")}})
	require.Eventually(t, func() bool { return handled.Load() == 1 }, 10*time.Second, time.Millisecond,
		"in[1] waited for the abandoned call of in[0]")
}

// Every byte a partition counts for the records it holds is given back
// once they are handled or parked, whether parked alone or in a batch
// with the records of their key queued behind: the partition holds
// nothing, and never counts below zero on the way.
func TestParkedAndHandledRecordsGiveBackTheirBytes(t *testing.T) {
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("in.shaping", 1))
	h := func(_ context.Context, rec *kgo.Record) error {
		if string(rec.Key) == "hot" {
			return assert.AnError // retried later than the bound: parked
		}
		return nil
	}
	c, cl := bare(t, kc, h, WithShaping("in.shaping", 20*time.Millisecond), WithRetry(3, 200*time.Millisecond, time.Second))
	c.assigned(context.Background(), cl, tps("in", 0))
	p := c.part("in", 0)
	var recs []*kgo.Record
	for i := range 40 {
		key := "cold"
		if i%2 == 0 {
			key = "hot"
		}
		recs = append(recs, &kgo.Record{Topic: "in", Partition: 0, Offset: int64(i), Key: []byte(key), Value: []byte("value"),
			Headers: []kgo.RecordHeader{{Key: "h", Value: []byte("v")}}})
	}
	p.push(recs)
	negative := false
	require.Eventually(t, func() bool {
		n, b := p.held()
		negative = negative || b < 0 || n < 0
		return n == 0
	}, 10*time.Second, time.Millisecond)
	n, b := p.held()
	assert.Zero(t, n)
	assert.Zero(t, b, "bytes still counted for no record held")
	assert.False(t, negative, "the partition counted below zero")
	assert.EqualValues(t, 20, c.parked.Load())
}
