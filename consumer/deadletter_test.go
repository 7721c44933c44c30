package consumer_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/kafkaenv"
)

// createTopic creates topic with the given configs on kc.
func createTopic(t *testing.T, kc *kafkaenv.Cluster, topic string, partitions int32, configs map[string]string) {
	t.Helper()
	cl, err := kc.Client()
	require.NoError(t, err)
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, partitions, 1
	for k, v := range configs {
		c := kmsg.NewCreateTopicsRequestTopicConfig()
		c.Name, c.Value = k, kmsg.StringPtr(v)
		rt.Configs = append(rt.Configs, c)
	}
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.NoError(t, kerr.ErrorForCode(resp.Topics[0].ErrorCode))
}

// produceLarge writes one record with value v (and key "big") to topic,
// with a producer that accepts large batches.
func produceLarge(t *testing.T, kc *kafkaenv.Cluster, topic string, v []byte) {
	t.Helper()
	cl, err := kc.Client(kgo.ProducerBatchMaxBytes(8 << 20))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("big"), Value: v,
		Headers: []kgo.RecordHeader{{Key: "trace", Value: []byte("t1")}}}).FirstErr())
}

// failingConsumer runs a consumer of in whose handler fails every record,
// dead-lettering to dlt, until one record is dead-lettered.
func deadLetterOne(t *testing.T, kc *kafkaenv.Cluster) {
	t.Helper()
	h := func(context.Context, *kgo.Record) error { return errTest }
	c, err := consumer.New(h, nil, append(base(kc, "g", "in"),
		consumer.WithRetry(1, time.Millisecond, time.Millisecond),
		consumer.WithDeadLetter("dlt"))...)
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 15*time.Second, "the record dead-lettered", func() bool { return c.Stats().DeadLettered == 1 })
	require.NoError(t, r.stop(t))
	assert.Equal(t, []int64{1}, committed(t, kc, "g", "in", 1))
}

// A 1.5 MB record that compresses well is dead-lettered whole: the
// dead-letter producer takes records larger than kgo's default batch
// (checked before compression), and the broker takes the compressed
// batch.
func TestDeadLetterOfALargeCompressibleRecord(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("dlt", 1))
	value := bytes.Repeat([]byte("headway "), 1_500_000/8)
	produceLarge(t, kc, "in", value)
	deadLetterOne(t, kc)

	recs := readAll(t, kc, "dlt", 1)
	require.Len(t, recs, 1)
	assert.Equal(t, "big", string(recs[0].Key))
	assert.True(t, bytes.Equal(value, recs[0].Value), "the value went whole")
	hs := headers(recs[0])
	assert.Equal(t, "t1", hs["trace"])
	assert.Equal(t, "0", hs[consumer.HeaderOffset])
	assert.NotContains(t, hs, consumer.HeaderDropped)
}

// A record whose value cannot go to the dead-letter topic at all (1.5 MB
// that does not compress, on a topic that takes 1 MB) is dead-lettered
// without its value: its coordinates, key, error and attempts, and
// HeaderDropped saying what was left out. The consumer goes on.
func TestDeadLetterWithoutTheValueWhenItCannotGo(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("dlt", 1))
	createTopic(t, kc, "in", 1, map[string]string{"max.message.bytes": strconv.Itoa(4 << 20)})
	value := make([]byte, 1_500_000)
	_, _ = rand.Read(value)
	produceLarge(t, kc, "in", value)
	deadLetterOne(t, kc)

	recs := readAll(t, kc, "dlt", 1)
	require.Len(t, recs, 1)
	assert.Equal(t, "big", string(recs[0].Key))
	assert.Empty(t, recs[0].Value)
	hs := headers(recs[0])
	assert.Equal(t, "in", hs[consumer.HeaderTopic])
	assert.Equal(t, "0", hs[consumer.HeaderPartition])
	assert.Equal(t, "0", hs[consumer.HeaderOffset])
	assert.Equal(t, "1", hs[consumer.HeaderAttempts])
	assert.Contains(t, hs[consumer.HeaderError], errTest.Error())
	assert.Equal(t, "value,headers", hs[consumer.HeaderDropped])
	assert.NotContains(t, hs, "trace", "the original headers are left out with the value")
}
