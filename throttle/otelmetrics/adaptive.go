package otelmetrics

import (
	"go.opentelemetry.io/otel/metric"

	"github.com/headway-go/headway/throttle"
)

// newAdaptive creates the gauge of the fleet's adaptive rate.
func (o *Observer) newAdaptive(m metric.Meter) error {
	var err error
	o.adaptive, err = m.Float64Gauge("headway.limiter.adaptive.rate",
		metric.WithUnit("{permit}"),
		metric.WithDescription("The fleet's adaptive rate in permits per interval of the bucket, after each change this process made; 0 when not adapting (grants not paced)."))
	return err
}

var _ throttle.AdaptiveObserver = (*Observer)(nil)

// Adapted implements [throttle.AdaptiveObserver]: it records the new
// adaptive rate (headway.limiter.adaptive.rate).
func (o *Observer) Adapted(key string, s throttle.AdaptiveState) {
	o.adaptive.Record(o.noContext, s.Rate, o.keyed(o.plain, key).record...)
}
