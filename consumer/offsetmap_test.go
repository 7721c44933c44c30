package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

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

// A stuck record's next owner, stuck on it again, keeps the map for the
// owner after it, though it marked nothing: its commit at the same offset
// carries the map, and no commit after it (the one kgo makes on leaving
// the group) writes that offset again without it. A handles every record
// but the stuck one (offset 10) and stops; B restores the rest, stays
// stuck on offset 10 and stops; C handles the stuck record alone.
func TestOwnerStuckAgainPassesTheMapOn(t *testing.T) {
	t.Parallel()
	const n, stuckAt = 60, 10
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, n, func(_ int32, i int) string { return fmt.Sprint("k", i) })
	var calls [n]atomic.Int32
	var handled atomic.Int64
	h := stuckHandler(stuckAt, calls[:], &handled)
	a, err := consumer.New(h, nil, base(kc, "g", "in")...)
	require.NoError(t, err)
	ra := start(t, a)
	waitFor(t, 10*time.Second, "A handled every record but the stuck one", func() bool { return handled.Load() == n-1 })
	require.NoError(t, ra.stop(t))

	b, err := consumer.New(h, nil, base(kc, "g", "in")...)
	require.NoError(t, err)
	rb := start(t, b)
	waitFor(t, 10*time.Second, "B restored every record past the stuck one", func() bool { return b.Stats().Restored == n-stuckAt-1 })
	require.NoError(t, rb.stop(t))
	require.EqualValues(t, n-1, handled.Load(), "B handled nothing again")

	handleRest(t, kc, n, stuckAt, calls[:])
}

// stuckHandler counts in calls and handled the records it handles, and
// is stuck on the record at stuckAt until its call is ended.
func stuckHandler(stuckAt int64, calls []atomic.Int32, handled *atomic.Int64) consumer.Handler {
	return func(ctx context.Context, rec *kgo.Record) error {
		if rec.Offset == stuckAt {
			<-ctx.Done() // until the stop gives up on it
			return ctx.Err()
		}
		calls[rec.Offset].Add(1)
		handled.Add(1)
		return nil
	}
}

// handleRest runs a last owner of the group until it has handled the
// record at stuckAt and reached the end of the partition, and checks that
// every record was handled once in all.
func handleRest(t *testing.T, kc *kafkaenv.Cluster, n int, stuckAt int64, calls []atomic.Int32) {
	t.Helper()
	last := newHandled(1)
	c, err := consumer.New(func(ctx context.Context, rec *kgo.Record) error {
		calls[rec.Offset].Add(1)
		last.add("last", rec)
		return nil
	}, nil, base(kc, "g", "in")...)
	require.NoError(t, err)
	rc := start(t, c)
	last.waitFull(t, 10*time.Second)
	waitFor(t, 10*time.Second, "the last owner at the end of the partition", func() bool {
		s := c.Stats()
		return s.Handled+s.Restored == int64(n)-stuckAt
	})
	require.NoError(t, rc.stop(t))
	assert.Equal(t, []int64{int64(n)}, committed(t, kc, "g", "in", 1))
	for o := range n {
		if got := calls[o].Load(); got != 1 {
			t.Errorf("record %d handled %d times in all, want once", o, got)
		}
	}
}

// An owner that stops before it has read every offset its restored map
// covers passes the rest of that map on: the next owner does not handle
// them again. A handles every record but the stuck one (offset 10) and
// stops; B, stuck on the same record, reads a few records past it (its
// queue bound of 8) and stops; C handles the stuck record alone.
func TestOwnerStoppedBeforeReadingItsRestoredMapPassesTheRestOn(t *testing.T) {
	t.Parallel()
	const n, stuckAt = 60, 10
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	cl, err := kc.Client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range n { // one batch each: B's small fetches read a few at a time
		require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: "in", Key: fmt.Append(nil, "k", i), Value: []byte("v")}).FirstErr())
	}
	cl.Close()
	var calls [n]atomic.Int32
	var handled atomic.Int64
	h := stuckHandler(stuckAt, calls[:], &handled)
	a, err := consumer.New(h, nil, base(kc, "g", "in")...)
	require.NoError(t, err)
	ra := start(t, a)
	waitFor(t, 10*time.Second, "A handled every record but the stuck one", func() bool { return handled.Load() == n-1 })
	require.NoError(t, ra.stop(t))

	b, err := consumer.New(h, nil, append(base(kc, "g", "in"), consumer.WithQueueSize(8), consumer.WithQueueBytes(1<<10))...)
	require.NoError(t, err)
	rb := start(t, b)
	waitFor(t, 10*time.Second, "B paused behind the stuck record", func() bool {
		s := b.Stats()
		return len(s.Partitions) == 1 && s.Partitions[0].Paused && s.Restored > 0
	})
	require.NoError(t, rb.stop(t))
	require.Less(t, b.Stats().Restored, int64(n-stuckAt-1), "B read only part of its map")
	require.EqualValues(t, n-1, handled.Load(), "B handled nothing again")

	handleRest(t, kc, n, stuckAt, calls[:])
}

// A partition revoked while its record is stuck carries its map to its
// new owner in the commit of the revocation: two partitions, one record
// stuck in each at A; once B joins, the partition it takes over has
// every record but the stuck one restored, and only the stuck one is
// handled again.
func TestRevokedPartitionCarriesItsMapToItsNewOwner(t *testing.T) {
	t.Parallel()
	const n, stuckAt = 60, 10
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 2))
	produce(t, kc, "in", 2, n, func(p int32, i int) string { return fmt.Sprint("k", p, "-", i) })
	var calls [2][n]atomic.Int32
	var handledA atomic.Int64
	a, err := consumer.New(func(ctx context.Context, rec *kgo.Record) error {
		if rec.Offset == stuckAt {
			<-ctx.Done() // until the stop gives up on it
			return ctx.Err()
		}
		calls[rec.Partition][rec.Offset].Add(1)
		handledA.Add(1)
		return nil
	}, nil, base(kc, "g", "in")...)
	require.NoError(t, err)
	ra := start(t, a)
	waitFor(t, 10*time.Second, "A handled every record but the stuck ones", func() bool { return handledA.Load() == 2*(n-1) })

	b, err := consumer.New(func(_ context.Context, rec *kgo.Record) error {
		calls[rec.Partition][rec.Offset].Add(1)
		return nil
	}, nil, base(kc, "g", "in")...)
	require.NoError(t, err)
	rb := start(t, b)
	waitFor(t, 15*time.Second, "B took a partition over and restored its map", func() bool {
		s := b.Stats()
		return s.Handled == 1 && s.Restored == n-stuckAt-1
	})
	require.NoError(t, rb.stop(t))
	require.NoError(t, ra.stop(t))
	moved := 0
	for p := range 2 {
		if calls[p][stuckAt].Load() == 1 {
			moved++
			for o := range n {
				if got := calls[p][o].Load(); got != 1 {
					t.Errorf("record %d@%d handled %d times in all, want once", p, o, got)
				}
			}
		}
	}
	assert.Equal(t, 1, moved, "partitions B took over")
}

// A map is not applied when the fetch starts before its offset: a
// kgo.AdjustFetchOffsetsFn that rewinds the partition reads its records
// again on purpose, every one of them handled.
func TestRewoundFetchIgnoresTheMap(t *testing.T) {
	t.Parallel()
	const n, stuckAt = 60, 10
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, n, func(_ int32, i int) string { return fmt.Sprint("k", i) })
	var calls [n]atomic.Int32
	var handled atomic.Int64
	a, err := consumer.New(stuckHandler(stuckAt, calls[:], &handled), nil, base(kc, "g", "in")...)
	require.NoError(t, err)
	ra := start(t, a)
	waitFor(t, 10*time.Second, "A handled every record but the stuck one", func() bool { return handled.Load() == n-1 })
	require.NoError(t, ra.stop(t))

	rewind := kgo.AdjustFetchOffsetsFn(func(_ context.Context, m map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
		for _, ps := range m {
			for p := range ps {
				ps[p] = kgo.NewOffset().At(0)
			}
		}
		return m, nil
	})
	var again atomic.Int64
	b, err := consumer.New(func(context.Context, *kgo.Record) error { again.Add(1); return nil }, nil,
		kafka(kc, "g", "in", rewind), consumer.WithHandlerTimeout(time.Second), consumer.WithLogger(testLogger()))
	require.NoError(t, err)
	rb := start(t, b)
	waitFor(t, 10*time.Second, "B handled the partition again", func() bool { return again.Load() == n })
	require.NoError(t, rb.stop(t))
	assert.Zero(t, b.Stats().Restored)
	assert.Equal(t, []int64{n}, committed(t, kc, "g", "in", 1))
}

// A broker that refuses the offset map as too large (a lower
// offset.metadata.max.bytes) gets the commit again without it: the
// watermark is committed, and the records finished past it are handled
// again by the next owner.
func TestBrokerRefusingTheMapGetsTheCommitWithoutIt(t *testing.T) {
	t.Parallel()
	const n, stuckAt = 30, 10
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, n, func(_ int32, i int) string { return fmt.Sprint("k", i) })
	var refused atomic.Int32
	kc.Fake().ControlKey(int16(kmsg.OffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kc.Fake().KeepControl()
		req := kreq.(*kmsg.OffsetCommitRequest)
		carries := false
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				carries = carries || rp.Metadata != nil && strings.HasPrefix(*rp.Metadata, "headway.om1:")
			}
		}
		if !carries {
			return nil, nil, false
		}
		refused.Add(1)
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		resp.Version = req.Version
		for _, rt := range req.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.OffsetMetadataTooLarge.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	var calls [n]atomic.Int32
	var handled atomic.Int64
	a, err := consumer.New(stuckHandler(stuckAt, calls[:], &handled), nil, base(kc, "g", "in")...)
	require.NoError(t, err)
	ra := start(t, a)
	waitFor(t, 10*time.Second, "A handled every record but the stuck one", func() bool { return handled.Load() == n-1 })
	require.NoError(t, ra.stop(t))
	assert.NotZero(t, refused.Load(), "a commit with the map was refused")
	assert.Equal(t, []int64{stuckAt}, committed(t, kc, "g", "in", 1), "the watermark committed without the map")
}

// An offset map is validated against the partition as fetched: another
// client that commits for the group, at offset 5, a map whose range runs
// far past the partition's end cannot make the group skip records not
// yet written. The map is ignored with a warning naming the partition;
// the records from offset 5 on are handled, and so are the 20 produced
// after the consumer started, none of them counted as restored.
func TestForgedOffsetMapDoesNotSkipRecordsNotYetWritten(t *testing.T) {
	t.Parallel()
	const before, after, at = 10, 20, 5
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, before, func(_ int32, i int) string { return fmt.Sprint("k", i) })
	// "5:0.zzzzzzzzzz": from offset 5, 36^10-1 offsets finished.
	commitMetadata(t, kc, "g", "in", 0, at, "headway.om1:5:0.zzzzzzzzzz")

	var early, later atomic.Int64
	logs := &logCapture{}
	c, err := consumer.New(func(_ context.Context, rec *kgo.Record) error {
		if rec.Offset < before {
			early.Add(1)
		} else {
			later.Add(1)
		}
		return nil
	}, nil, kafka(kc, "g", "in"), consumer.WithHandlerTimeout(time.Second), consumer.WithLogger(slog.New(logs)))
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 10*time.Second, "the records from the committed offset on taken", func() bool {
		s := c.Stats()
		return s.Handled+s.Restored == before-at
	})
	produce(t, kc, "in", 1, after, func(_ int32, i int) string { return fmt.Sprint("later", i) })
	for deadline := time.Now().Add(10 * time.Second); later.Load() != after; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("of the %d records produced after the start, %d handled within 10s; %d records counted as restored", after, later.Load(), c.Stats().Restored)
		}
	}
	require.NoError(t, r.stop(t))
	assert.EqualValues(t, before-at, early.Load(), "records handled from the committed offset to the end as it was")
	assert.Zero(t, c.Stats().Restored, "records counted as restored")
	assert.Equal(t, []int64{before + after}, committed(t, kc, "g", "in", 1))
	warned := false
	for _, w := range logs.find("offset map") {
		warned = warned || w["level"] == slog.LevelWarn.String() && w["topic"] == "in" && w["partition"] == "0"
	}
	assert.True(t, warned, "a warning names the partition whose map was ignored")
}

// commitMetadata commits offset with metadata for group's partition of
// topic, as any client may, outside the group's generation (by topic
// name: a request version before topic IDs).
func commitMetadata(t *testing.T, kc *kafkaenv.Cluster, group, topic string, partition int32, offset int64, metadata string) {
	t.Helper()
	cl, err := kc.Client(kgo.MaxVersions(kversion.V3_5_0()))
	require.NoError(t, err)
	defer cl.Close()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.Generation = group, -1
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset, rp.Metadata = partition, offset, kmsg.StringPtr(metadata)
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	for _, t2 := range resp.Topics {
		for _, p := range t2.Partitions {
			require.NoError(t, kerr.ErrorForCode(p.ErrorCode), "committing the map")
		}
	}
	require.Equal(t, []int64{offset}, committed(t, kc, group, topic, partition+1)[partition:])
}

// A forged map is checked against the partition's end when it is read,
// not when the first records come: at the committed offset 5, the end of
// the partition then, a map of the next 100 offsets names records not
// yet written, though a first fetch that brings 200 records at once ends
// past them. All 200 are handled.
func TestForgedOffsetMapIsCheckedWhenItIsRead(t *testing.T) {
	t.Parallel()
	const before, after = 5, 200
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, before, func(_ int32, i int) string { return fmt.Sprint("k", i) })
	commitMetadata(t, kc, "g", "in", 0, before, "headway.om1:5:0.2s") // 0.2s: offsets 5 to 104

	var handled, fetched atomic.Int64
	logs := &logCapture{}
	c, err := consumer.New(func(context.Context, *kgo.Record) error { handled.Add(1); return nil }, nil,
		kafka(kc, "g", "in", kgo.OnOffsetsFetched(func(context.Context, *kgo.Client, *kmsg.OffsetFetchResponse) error {
			fetched.Add(1)
			return nil
		})), consumer.WithHandlerTimeout(time.Second), consumer.WithLogger(slog.New(logs)))
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 10*time.Second, "the committed offsets and the map read", func() bool { return fetched.Load() > 0 })
	produce(t, kc, "in", 1, after, func(_ int32, i int) string { return fmt.Sprint("later", i) })
	for deadline := time.Now().Add(10 * time.Second); handled.Load() != after; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("of the %d records produced after the map was read, %d handled within 10s; %d records counted as restored", after, handled.Load(), c.Stats().Restored)
		}
	}
	require.NoError(t, r.stop(t))
	assert.Zero(t, c.Stats().Restored, "records counted as restored")
	warned := false
	for _, w := range logs.find("offset map") {
		warned = warned || w["level"] == slog.LevelWarn.String() && w["partition"] == "0"
	}
	assert.True(t, warned, "a warning names the partition whose map was ignored")
}

// refuseEnds makes kc answer the ListOffsets requests that ask for the
// end of a partition of topic (timestamp -1, as a consumer) with code,
// as a leader just elected answers until it knows its high watermark
// (OFFSET_NOT_AVAILABLE, KIP-207), while refusing returns true. Other
// requests are answered as usual. It returns the number of requests
// refused.
func refuseEnds(kc *kafkaenv.Cluster, topic string, code int16, refusing func() bool) *atomic.Int64 {
	var n atomic.Int64
	kc.Fake().ControlKey(int16(kmsg.ListOffsets), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kc.Fake().KeepControl()
		req := kreq.(*kmsg.ListOffsetsRequest)
		asks := false
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				asks = asks || rt.Topic == topic && rp.Timestamp == -1 && req.ReplicaID == -1
			}
		}
		if !asks || !refusing() {
			return nil, nil, false
		}
		n.Add(1)
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		resp.Version = req.Version
		for _, rt := range req.Topics {
			st := kmsg.NewListOffsetsResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewListOffsetsResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	return &n
}

// A legitimate map is kept when the partition's leader cannot tell its
// end at first: a leader just elected answers ListOffsets with
// OFFSET_NOT_AVAILABLE until it knows its high watermark (KIP-207), an
// error kgo does not retry by itself, and a broker restart that moves
// leaders often comes with a rebalance. The map of the previous owner
// (committed offset 5, offsets 6 to 9 finished) restores 6 to 9, with no
// warning; offset 5 alone is handled.
func TestOffsetMapKeptWhileANewLeaderDoesNotKnowItsEnd(t *testing.T) {
	t.Parallel()
	const n, at = 10, 5
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, n, func(_ int32, i int) string { return fmt.Sprint("k", i) })
	commitMetadata(t, kc, "g", "in", 0, at, "headway.om1:5:1.4") // 1.4: offsets 6 to 9
	var first atomic.Bool
	first.Store(true)
	refused := refuseEnds(kc, "in", kerr.OffsetNotAvailable.Code, func() bool { return first.Swap(false) })

	var calls [n]atomic.Int32
	var handled atomic.Int64
	logs := &logCapture{}
	c, err := consumer.New(func(_ context.Context, rec *kgo.Record) error {
		calls[rec.Offset].Add(1)
		handled.Add(1)
		return nil
	}, nil, kafka(kc, "g", "in"), consumer.WithHandlerTimeout(time.Second), consumer.WithLogger(slog.New(logs)))
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 10*time.Second, "every record from the committed offset on handled or restored", func() bool {
		return handled.Load()+c.Stats().Restored == n-at
	})
	require.NoError(t, r.stop(t))
	require.EqualValues(t, 1, refused.Load(), "ListOffsets answered OFFSET_NOT_AVAILABLE")
	assert.EqualValues(t, n-at-1, c.Stats().Restored, "records restored from the map")
	assert.EqualValues(t, 1, handled.Load(), "records handled")
	assert.EqualValues(t, 1, calls[at].Load(), "the committed offset's record handled")
	assert.Empty(t, logs.find("offset map"), "warnings of an ignored map")
}

// A map whose check the group session cut short is read again by the
// next session, not dropped: the session's end (a member joining) cancels
// the check while the leader cannot tell the partition's end yet. kgo,
// told nothing of it, would give the member its partitions at the
// committed offsets, and under the cooperative balancer (kgo's default)
// a partition it keeps is not fetched again: its map lost, its records
// handled again, with no warning. Two partitions, each committed at 5
// with offsets 6 to 9 finished; A starts alone, B joins while A checks.
// Offset 5 of each partition is handled, 6 to 9 restored, no warning.
func TestOffsetMapCheckCutShortBySessionEndIsDoneAgain(t *testing.T) {
	t.Parallel()
	const n, at, parts = 10, 5, 2
	kc := kafkaenv.New(t, kafkaenv.Topic("in", parts))
	produce(t, kc, "in", parts, n, func(p int32, i int) string { return fmt.Sprint("k", p, "-", i) })
	for p := range int32(parts) {
		commitMetadata(t, kc, "g", "in", p, at, "headway.om1:5:1.4") // 1.4: offsets 6 to 9
	}
	var balanced atomic.Bool
	refused := refuseEnds(kc, "in", kerr.OffsetNotAvailable.Code, func() bool { return !balanced.Load() })

	var calls [parts][n]atomic.Int32
	var handled atomic.Int64
	h := func(_ context.Context, rec *kgo.Record) error {
		calls[rec.Partition][rec.Offset].Add(1)
		handled.Add(1)
		return nil
	}
	logs := &logCapture{}
	member := func() *consumer.Consumer {
		// A rebalance timeout long enough for the check (the commit
		// timeout, 10 s) to outlast B's joining.
		c, err := consumer.New(h, nil, kafka(kc, "g", "in", kgo.RebalanceTimeout(20*time.Second)),
			consumer.WithHandlerTimeout(time.Second), consumer.WithLogger(slog.New(logs)))
		require.NoError(t, err)
		return c
	}
	a := member()
	ra := start(t, a)
	waitFor(t, 10*time.Second, "A checking its maps", func() bool { return refused.Load() > 0 })
	b := member()
	rb := start(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := kc.WaitGroupBalanced(ctx, "g", 2)
	require.NoError(t, err)
	balanced.Store(true)
	restored := func() int64 { return a.Stats().Restored + b.Stats().Restored }
	waitFor(t, 10*time.Second, "every record from the committed offsets on handled or restored", func() bool {
		return handled.Load()+restored() == parts*(n-at)
	})
	require.NoError(t, ra.stop(t))
	require.NoError(t, rb.stop(t))
	assert.EqualValues(t, parts, handled.Load(), "records handled")
	assert.EqualValues(t, parts*(n-at-1), restored(), "records restored from the maps")
	for p := range parts {
		for o := at + 1; o < n; o++ {
			assert.Zero(t, calls[p][o].Load(), "partition %d, offset %d: handled though finished", p, o)
		}
	}
	assert.Empty(t, logs.find("offset map"), "warnings of an ignored map")
}

// Under read_committed, a map is checked against the partition's end as
// the consumer fetches it: the last stable offset, not the high
// watermark. Records of a transaction still open lie between the two;
// no owner has fetched them, so none can have finished them. Offsets 0 to
// 9 are committed records, 10 to 14 an open transaction; another client
// commits offset 5 with a map of 6 to 14. The map is ignored with a
// warning, and once the transaction commits, offsets 5 to 14 are all
// handled, none restored.
func TestOffsetMapUnderReadCommittedEndsBeforeAnOpenTransaction(t *testing.T) {
	t.Parallel()
	const n, open, at = 10, 5, 5
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, n, func(_ int32, i int) string { return fmt.Sprint("k", i) })
	tx, err := kc.Client(kgo.TransactionalID("open"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer tx.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, tx.BeginTransaction())
	for i := range open {
		tx.Produce(ctx, &kgo.Record{Topic: "in", Key: fmt.Append(nil, "t", i), Value: []byte("v")}, nil)
	}
	require.NoError(t, tx.Flush(ctx))
	commitMetadata(t, kc, "g", "in", 0, at, "headway.om1:5:1.9") // 1.9: offsets 6 to 14

	var calls [n + open]atomic.Int32
	var handled, fetched atomic.Int64
	logs := &logCapture{}
	c, err := consumer.New(func(_ context.Context, rec *kgo.Record) error {
		calls[rec.Offset].Add(1)
		handled.Add(1)
		return nil
	}, nil, kafka(kc, "g", "in", kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.OnOffsetsFetched(func(context.Context, *kgo.Client, *kmsg.OffsetFetchResponse) error {
			fetched.Add(1)
			return nil
		})), consumer.WithHandlerTimeout(time.Second), consumer.WithLogger(slog.New(logs)))
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 10*time.Second, "the committed offsets and the map read", func() bool { return fetched.Load() > 0 })
	require.NoError(t, tx.EndTransaction(ctx, kgo.TryCommit))
	waitFor(t, 10*time.Second, "every record from the committed offset on handled or restored", func() bool {
		return handled.Load()+c.Stats().Restored == n+open-at
	})
	require.NoError(t, r.stop(t))
	assert.Zero(t, c.Stats().Restored, "records counted as restored")
	for o := at; o < n+open; o++ {
		assert.EqualValues(t, 1, calls[o].Load(), "offset %d: times handled", o)
	}
	warned := false
	for _, w := range logs.find("offset map") {
		warned = warned || w["level"] == slog.LevelWarn.String() && w["partition"] == "0" && strings.Contains(w["reason"], "last stable offset")
	}
	assert.True(t, warned, "a warning names the partition and its end, the last stable offset")
}
