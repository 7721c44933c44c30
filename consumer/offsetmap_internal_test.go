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

// A map is kept only when no owner could have failed to write it so: it
// parses, it is for the committed offset; the others are warned of,
// naming the partition, and restore nothing. Metadata that is not a map
// (kgo's, another program's) is left alone without a word.
func TestOffsetMapFromTheCommitIsCheckedBeforeItIsKept(t *testing.T) {
	var logs bytes.Buffer
	c, err := New(func(context.Context, *kgo.Record) error { return nil }, nil,
		WithKafka(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("in")),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	tests := []struct {
		metadata string
		offset   int64
		kept     bool
		warn     string // in the warning's reason; "" for none
	}{
		{"", 5, false, ""},
		{"member-1", 5, false, ""},
		{encodeOffsetMap(5, []offRun{{6, 9}}), 5, true, ""},
		{encodeOffsetMap(5, nil), 5, false, ""}, // nothing to restore
		{offsetMapPrefix + "5:0.z,", 5, false, "does not parse"},
		{offsetMapPrefix + "5:" + strings.Repeat("0.1,", maxOffsetMap/4) + "0.1", 5, false, "does not parse"},
		{encodeOffsetMap(5, []offRun{{6, 9}}), 3, false, "written for offset 5"},
	}
	for i, tt := range tests {
		logs.Reset()
		resp := kmsg.NewPtrOffsetFetchResponse()
		rt := kmsg.NewOffsetFetchResponseTopic()
		rt.Topic = "in"
		rp := kmsg.NewOffsetFetchResponseTopicPartition()
		rp.Partition, rp.Offset, rp.Metadata = int32(i), tt.offset, kmsg.StringPtr(tt.metadata)
		rt.Partitions = append(rt.Partitions, rp)
		resp.Topics = append(resp.Topics, rt)
		require.NoError(t, c.onOffsetsFetched(context.Background(), nil, resp))
		_, kept := c.restored[topicPartition{"in", int32(i)}]
		assert.Equal(t, tt.kept, kept, "%.40q at %d: kept", tt.metadata, tt.offset)
		if tt.warn == "" {
			assert.Empty(t, logs.String(), "%.40q at %d", tt.metadata, tt.offset)
			continue
		}
		for _, want := range []string{"level=WARN", "offset map", "topic=in", "partition=" + string(rune('0'+i)), tt.warn} {
			assert.Contains(t, logs.String(), want, "%.40q at %d", tt.metadata, tt.offset)
		}
	}
}

// A map's ranges must end before the partition's end as fetched: one
// that reaches it names a record not yet written.
func TestOffsetMapBeyondThePartitionsEnd(t *testing.T) {
	m := offsetMap{base: 5, runs: []offRun{{6, 6}, {8, 9}}}
	assert.Empty(t, m.beyond(10))
	assert.Empty(t, m.beyond(1<<62))
	assert.Contains(t, m.beyond(9), "past the partition's end at 9")
	assert.Contains(t, m.beyond(0), "run to offset 9")
	assert.Empty(t, offsetMap{base: 5}.beyond(0), "no ranges: nothing to skip")
}
