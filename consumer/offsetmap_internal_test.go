package consumer

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/headway-go/headway/internal/kafkaenv"
)

// A map reads back as written; one too long for maxOffsetMap keeps the
// ranges that fit, from the first, so that only records are left out
// (handled again), never added.
func TestOffsetMapRoundTripsAndKeepsAPrefixWhenLong(t *testing.T) {
	runs := []offRun{{100, 100}, {102, 5000}, {5002, 5002}, {1 << 40, 1<<40 + 7}}
	base, got, ok := decodeOffsetMap(encodeOffsetMap(99, runs))
	require.True(t, ok)
	assert.EqualValues(t, 99, base)
	assert.Equal(t, runs, got)

	var many []offRun
	for i := range int64(5000) {
		many = append(many, offRun{10 + 3*i, 11 + 3*i})
	}
	text := encodeOffsetMap(10, many)
	assert.LessOrEqual(t, len(text), maxOffsetMap)
	_, got, ok = decodeOffsetMap(text)
	require.True(t, ok)
	require.NotEmpty(t, got)
	assert.Less(t, len(got), len(many))
	assert.Equal(t, many[:len(got)], got)

	_, got, ok = decodeOffsetMap(encodeOffsetMap(7, nil))
	assert.True(t, ok)
	assert.Empty(t, got)
}

// Metadata that is not a map (kgo's member ID, a damaged one) restores
// nothing.
func TestOffsetMapRefusesOtherMetadata(t *testing.T) {
	for _, s := range []string{"", "member-1", offsetMapPrefix, offsetMapPrefix + "z", offsetMapPrefix + "a:1", offsetMapPrefix + "a:1.0",
		offsetMapPrefix + "a:-1.2", offsetMapPrefix + "a:1.2,", offsetMapPrefix + "-a:1.2", offsetMapPrefix + "a:zzzzzzzzzzzzzz.1",
		offsetMapPrefix + "a:" + strings.Repeat("0.1,", maxOffsetMap/4) + "0.1"} {
		_, _, ok := decodeOffsetMap(s)
		assert.False(t, ok, "%q", s)
	}
}

func FuzzDecodeOffsetMap(f *testing.F) {
	f.Add(encodeOffsetMap(99, []offRun{{100, 100}, {102, 5000}}))
	f.Add(offsetMapPrefix + "a:1.2")
	f.Fuzz(func(t *testing.T, s string) {
		base, runs, ok := decodeOffsetMap(s)
		if !ok {
			return
		}
		next := base
		for _, r := range runs {
			if r.first < next || r.last < r.first {
				t.Fatalf("decodeOffsetMap(%q) = %d, %v: ranges out of order", s, base, runs)
			}
			next = r.last + 1
		}
	})
}

// A map is kept only when an owner could have written it: it parses, it
// is for the committed offset, and its ranges end before the partition's
// end when it is read; the others are warned of, naming the partition
// and what was wrong, and restore nothing. Metadata that is not a map
// (kgo's, another program's) is left alone without a word. Partition 0
// of "in" holds 10 records; "gone" does not exist.
func TestOffsetMapFromTheCommitIsCheckedBeforeItIsKept(t *testing.T) {
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	cl, err := kc.Client()
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	recs := make([]*kgo.Record, 10)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: "in", Value: []byte("v")}
	}
	require.NoError(t, cl.ProduceSync(context.Background(), recs...).FirstErr())

	var logs bytes.Buffer
	c, err := New(func(context.Context, *kgo.Record) error { return nil }, nil,
		WithKafka(kgo.SeedBrokers(kc.Addrs()...), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("in")),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	tests := []struct {
		topic    string
		metadata string
		offset   int64
		kept     bool
		warn     string // in the warning's reason; "" for none
	}{
		{"in", "", 5, false, ""},
		{"in", "member-1", 5, false, ""},
		{"in", encodeOffsetMap(5, []offRun{{6, 9}}), 5, true, ""},
		{"in", encodeOffsetMap(5, nil), 5, false, ""}, // nothing to restore
		{"in", offsetMapPrefix + "5:0.z,", 5, false, "does not parse"},
		{"in", offsetMapPrefix + "5:" + strings.Repeat("0.1,", maxOffsetMap/4) + "0.1", 5, false, "does not parse"},
		{"in", encodeOffsetMap(5, []offRun{{6, 9}}), 3, false, "written for offset 5"},
		{"in", encodeOffsetMap(5, []offRun{{6, 10}}), 5, false, "past the partition's end at 10"},
		{"in", offsetMapPrefix + "5:0.zzzzzzzzzz", 5, false, "past the partition's end at 10"},
		{"gone", encodeOffsetMap(5, []offRun{{6, 9}}), 5, false, "could not be learned"},
	}
	for _, tt := range tests {
		logs.Reset()
		resp := kmsg.NewPtrOffsetFetchResponse()
		rt := kmsg.NewOffsetFetchResponseTopic()
		rt.Topic = tt.topic
		rp := kmsg.NewOffsetFetchResponseTopicPartition()
		rp.Partition, rp.Offset, rp.Metadata = 0, tt.offset, kmsg.StringPtr(tt.metadata)
		rt.Partitions = append(rt.Partitions, rp)
		resp.Topics = append(resp.Topics, rt)
		require.NoError(t, c.onOffsetsFetched(context.Background(), cl, resp))
		_, kept := c.restored[topicPartition{tt.topic, 0}]
		assert.Equal(t, tt.kept, kept, "%s: %.40q at %d: kept", tt.topic, tt.metadata, tt.offset)
		if tt.warn == "" {
			assert.Empty(t, logs.String(), "%s: %.40q at %d", tt.topic, tt.metadata, tt.offset)
			continue
		}
		for _, want := range []string{"level=WARN", "offset map", "topic=" + tt.topic, "partition=0", tt.warn} {
			assert.Contains(t, logs.String(), want, "%s: %.40q at %d", tt.topic, tt.metadata, tt.offset)
		}
	}
}

// A map's ranges must end before the partition's end: one that reaches
// it names a record not yet written.
func TestOffsetMapBeyondThePartitionsEnd(t *testing.T) {
	m := offsetMap{base: 5, runs: []offRun{{6, 6}, {8, 9}}}
	const hw = "the high watermark"
	assert.Empty(t, m.beyond(10, hw))
	assert.Empty(t, m.beyond(1<<62, hw))
	assert.Contains(t, m.beyond(9, hw), "past the partition's end at 9 (the high watermark)")
	assert.Contains(t, m.beyond(0, hw), "run to offset 9")
	assert.Empty(t, offsetMap{base: 5}.beyond(0, hw), "no ranges: nothing to skip")
}
