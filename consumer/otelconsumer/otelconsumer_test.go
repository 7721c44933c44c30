package otelconsumer_test

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/consumer/otelconsumer"
	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/internal/oteltest"
	"github.com/headway-go/headway/throttle"
)

// A consumer on a real (in-process) Kafka: its figures reach the reader,
// the gauges show a partition waiting while the limiter holds it back, and
// unregister stops the reports.
func TestObserveConsumer(t *testing.T) {
	const parts, records = 2, 40
	kc := kafkaenv.New(t, kafkaenv.Topic("metrics", parts))
	recs := make([]*kgo.Record, records)
	for i := range recs {
		recs[i] = &kgo.Record{Key: []byte{byte(i)}, Value: []byte("v")}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, kc.Produce(ctx, "metrics", recs...))

	// 20 permits at once, then one a minute: the consumer handles 20 and
	// then waits.
	local, err := throttle.NewLocal(20, 20*time.Minute)
	require.NoError(t, err)
	var handled atomic.Int64
	c, err := consumer.New(func(context.Context, *kgo.Record) error {
		handled.Add(1)
		return nil
	}, throttle.New(local),
		consumer.WithKafka(append(kafkaenv.FastClientOpts(),
			kgo.SeedBrokers(kc.Addrs()...), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("metrics"))...),
		consumer.WithHandlerTimeout(time.Second),
		consumer.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
	)
	require.NoError(t, err)

	r := oteltest.NewReader(t, otelconsumer.ScopeName)
	unregister, err := otelconsumer.Observe(r.MP, "mailer", c)
	require.NoError(t, err)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		<-done
	}()

	// Wait, bounded, until 20 are handled and a partition waits.
	const series = "headway.consumer=mailer"
	var got map[string]int64
	deadline := time.Now().Add(20 * time.Second)
	for {
		m := r.Collect(t)
		if m["headway.consumer.handled.records"] != nil && m["headway.consumer.waiting_partitions"] != nil {
			got = oteltest.Sums(t, m["headway.consumer.handled.records"])
			w := oteltest.UpDowns(t, m["headway.consumer.waiting_partitions"])
			if got[series] == 20 && w[series] >= 1 {
				assert.Equal(t, int64(parts), oteltest.UpDowns(t, m["headway.consumer.owned_partitions"])[series])
				// Every record not handled is held, and so may be a handled
				// one behind an unfinished record of its partition (not yet
				// committable).
				buffered := oteltest.UpDowns(t, m["headway.consumer.buffered_records"])[series]
				assert.GreaterOrEqual(t, buffered, int64(records-20), "every record not handled is buffered")
				assert.LessOrEqual(t, buffered, int64(records), "no record is counted twice")
				bytes := oteltest.UpDowns(t, m["headway.consumer.buffered_bytes"])[series]
				// A handled record behind an unfinished one keeps only its
				// entry in the partition's span (a few bytes), not its
				// overhead: it is the records not handled that count it.
				assert.GreaterOrEqual(t, bytes, int64(records-20)*consumer.RecordOverhead, "each record not handled counts its overhead at least")
				assert.Zero(t, oteltest.Sums(t, m["headway.consumer.parked.records"])[series])
				assert.Zero(t, oteltest.UpDowns(t, m["headway.consumer.active_calls"])[series])
				assert.Zero(t, oteltest.Sums(t, m["headway.consumer.dead_lettered.records"])[series])
				pw, ok := m["headway.consumer.permit.wait.time"].(metricdata.Sum[float64])
				assert.True(t, ok && len(pw.DataPoints) == 1 && pw.IsMonotonic, "permit.wait: %#v", m["headway.consumer.permit.wait.time"])
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("handled %v, not 20 with a partition waiting, within 20 s", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	assert.EqualValues(t, 20, handled.Load(), "the reader's figure is the handler's own count")

	require.NoError(t, unregister())
	m := r.Collect(t)
	if h := m["headway.consumer.handled.records"]; h != nil {
		assert.Empty(t, oteltest.Sums(t, h), "no report after unregister")
	}
}

func TestObserveRefusesBadArguments(t *testing.T) {
	_, err := otelconsumer.Observe(nil, "c", nil)
	assert.ErrorIs(t, err, throttle.ErrInvalid)
}
