package consumer_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/kafkaenv"
)

// heapInUse returns the bytes of live heap objects after a full
// collection.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// The records the consumer holds cost what the package doc says in
// bytes: their keys, values and headers plus RecordOverhead each, not the
// fetch batches they were decoded from. Six partitions of small records
// produced in large batches, each partition holding its records behind
// one whose handler has not returned (ByPartition): the heap grows by at
// most twice the stated cost of what is held, plus 2 MiB for the Kafka
// client, measured after a collection. Not parallel: the heap is the
// process's.
func TestHeldRecordsCostTheirOwnBytes(t *testing.T) {
	const parts, perPart = 6, 8000
	kc := kafkaenv.New(t, kafkaenv.Topic("mem", parts))
	produce(t, kc, "mem", parts, perPart, func(p int32, i int) string { return fmt.Sprintf("k%d-%05d", p, i) })

	release := make(chan struct{})
	h := func(ctx context.Context, rec *kgo.Record) error {
		if rec.Offset == 0 {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	c, err := consumer.New(h, nil,
		kafka(kc, "g", "mem", kgo.RebalanceTimeout(30*time.Second)),
		consumer.WithHandlerTimeout(10*time.Second),
		consumer.WithOrdering(consumer.ByPartition),
		consumer.WithQueueSize(256), consumer.WithPollSize(256),
		consumer.WithLogger(testLogger()))
	require.NoError(t, err)
	before := heapInUse()
	r := start(t, c)
	waitFor(t, 15*time.Second, "every partition paused", func() bool {
		s := c.Stats()
		paused := 0
		for _, p := range s.Partitions {
			if p.Paused {
				paused++
			}
		}
		return paused == parts
	})
	time.Sleep(300 * time.Millisecond) // let the client settle its fetches
	held := heapInUse() - before
	s := c.Stats()
	perRecord := int64(len("k0-00000") + len("p0-0000") + consumer.RecordOverhead)
	bound := 2*int64(s.Buffered)*perRecord + 2<<20
	t.Logf("heap grew by %.1f KiB holding %d records (%.0f B each); bound %.1f KiB", float64(held)/1024, s.Buffered, float64(held)/float64(s.Buffered), float64(bound)/1024)
	close(release)
	require.NoError(t, r.stop(t))
	assert.LessOrEqual(t, held, bound)
}
