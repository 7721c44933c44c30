package otelmetrics_test

import (
	"context"
	"fmt"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/otelmetrics"
)

// A Limiter reporting to an OpenTelemetry MeterProvider. A program would
// give the provider a Prometheus or OTLP exporter instead of the manual
// reader used here to show the figures.
func ExampleNew() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()

	obs, err := otelmetrics.New(mp)
	if err != nil {
		panic(err)
	}
	b, err := throttle.NewLocal(2, time.Minute)
	if err != nil {
		panic(err)
	}
	lim := throttle.New(b, throttle.WithObserver(obs))
	for range 3 {
		_ = lim.Acquire(context.Background(), 0) // 2 granted, 1 timeout
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name != "headway.limiter.acquire.calls" {
			continue
		}
		for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
			outcome, _ := dp.Attributes.Value(otelmetrics.OutcomeKey)
			fmt.Println(outcome.AsString(), dp.Value)
		}
	}
	// Unordered output:
	// granted 2
	// timeout 1
}
