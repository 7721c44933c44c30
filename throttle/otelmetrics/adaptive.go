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

// Adapted records key's adaptive rate after a change the Limiter made
// (headway.limiter.adaptive.rate): it makes o a throttle.AdaptiveObserver,
// which a throttle.Limiter calls after each change of a key's adaptive
// rate. A user's Observer that embeds *Observer keeps it.
func (o *Observer) Adapted(key string, s throttle.AdaptiveState) {
	o.adaptive.Record(o.noContext, s.Rate, o.keyed(o.plain, key).record...)
}
