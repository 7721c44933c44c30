package consumer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/kafkaenv"
)

// A restart does not handle again the records finished past the
// watermark: the first consumer stops with one record stuck and the rest
// of the partition handled, its commit carries the finished offsets past
// the stuck one, and the next consumer of the group handles the stuck
// record alone; the OnOffsetsFetched of WithKafka is still called. Stuck
// at offset 0, nothing was marked for commit: the
// commit carries the partition at its first offset, with the map.
func TestRestartDoesNotRedoRecordsFinishedPastTheWatermark(t *testing.T) {
	t.Parallel()
	for _, at := range []int64{10, 0} {
		t.Run(fmt.Sprint("stuck at ", at), func(t *testing.T) {
			t.Parallel()
			restartAfterStuck(t, at)
		})
	}
}

func restartAfterStuck(t *testing.T, stuckAt int64) {
	const n = 300
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, n, func(_ int32, i int) string { return fmt.Sprint("k", i) })

	var first [n]atomic.Int32
	var firstHandled atomic.Int64
	stuck := func(ctx context.Context, rec *kgo.Record) error {
		if rec.Offset == stuckAt {
			<-ctx.Done() // until the shutdown gives up on it
			return ctx.Err()
		}
		first[rec.Offset].Add(1)
		firstHandled.Add(1)
		return nil
	}
	a, err := consumer.New(stuck, nil, base(kc, "g", "in")...)
	require.NoError(t, err)
	ra := start(t, a)
	waitFor(t, 10*time.Second, "every record but the stuck one handled", func() bool { return firstHandled.Load() == n-1 })
	require.NoError(t, ra.stop(t))
	require.Equal(t, []int64{stuckAt}, committed(t, kc, "g", "in", 1), "the watermark stays at the stuck record")

	var second [n]atomic.Int32
	var secondHandled, userFetched atomic.Int64
	b, err := consumer.New(func(_ context.Context, rec *kgo.Record) error {
		second[rec.Offset].Add(1)
		secondHandled.Add(1)
		return nil
	}, nil, kafka(kc, "g", "in", kgo.OnOffsetsFetched(func(context.Context, *kgo.Client, *kmsg.OffsetFetchResponse) error {
		userFetched.Add(1)
		return nil
	})), consumer.WithHandlerTimeout(time.Second), consumer.WithLogger(testLogger()))
	require.NoError(t, err)
	rb := start(t, b)
	waitFor(t, 10*time.Second, "the stuck record handled and the rest restored", func() bool {
		s := b.Stats()
		return secondHandled.Load() >= 1 && s.Restored == n-stuckAt-1
	})
	require.NoError(t, rb.stop(t))
	assert.Equal(t, []int64{n}, committed(t, kc, "g", "in", 1))
	assert.EqualValues(t, 1, secondHandled.Load(), "records the restart handled")
	assert.NotZero(t, userFetched.Load(), "WithKafka's OnOffsetsFetched called")
	assert.EqualValues(t, 1, second[stuckAt].Load())
	for o := range n {
		if got := first[o].Load() + second[o].Load(); got != 1 {
			t.Errorf("record %d handled %d times in all, want once", o, got)
		}
	}
}
