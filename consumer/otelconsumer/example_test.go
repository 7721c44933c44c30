package otelconsumer_test

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/consumer/otelconsumer"
	"github.com/headway-go/headway/throttle"
)

// A consumer's figures, read at each collection. A program would give
// the MeterProvider a Prometheus or OTLP exporter instead of the manual
// reader used here, and run the consumer; this one is never started, so
// it owns no partitions yet.
func ExampleObserve() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()

	b, err := throttle.NewLocal(100, time.Second)
	if err != nil {
		panic(err)
	}
	c, err := consumer.New(func(context.Context, *kgo.Record) error { return nil }, throttle.New(b),
		consumer.WithKafka(kgo.SeedBrokers("127.0.0.1:9092"), kgo.ConsumerGroup("mailer"), kgo.ConsumeTopics("mail")))
	if err != nil {
		panic(err)
	}
	unregister, err := otelconsumer.Observe(mp, "mailer", c)
	if err != nil {
		panic(err)
	}
	defer func() { _ = unregister() }()

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name == "headway.consumer.owned_partitions" {
			fmt.Println(m.Name, m.Unit, m.Data.(metricdata.Sum[int64]).DataPoints[0].Value)
		}
	}
	// Output: headway.consumer.owned_partitions {partition} 0
}
