package otelmetrics

import (
	"go.opentelemetry.io/otel/metric"

	"github.com/headway-go/headway/internal/capability"
)

// newAdaptive creates the gauge of the fleet's adaptive rate.
func (o *Observer) newAdaptive(m metric.Meter) error {
	var err error
	o.adaptive, err = m.Float64Gauge("headway.limiter.adaptive.rate",
		metric.WithUnit("{permit}"),
		metric.WithDescription("The fleet's adaptive rate in permits per interval of the bucket, after each change this process made; 0 when not adapting (grants not paced)."))
	return err
}

var _ capability.AdaptiveObserver = (*Observer)(nil)

// Adapted is called by a throttle.Limiter after each change of a key's
// adaptive rate (capability.AdaptiveObserver): it records the new
// adaptive rate (headway.limiter.adaptive.rate).
func (o *Observer) Adapted(key string, s capability.AdaptiveState) {
	o.adaptive.Record(o.noContext, s.Rate, o.keyed(o.plain, key).record...)
}
