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

// A throttle.Limiter tells an Observer of its adaptive rate through the
// registry of internal/capability, so that go doc of this package shows
// no method users never call. Asking for the unexported method rather
// than the type keeps it for a user's Observer that embeds *Observer.
func init() {
	capability.RegisterAdapted(func(o any) (func(string, capability.AdaptiveState), bool) {
		if a, ok := o.(interface {
			adapted(key string, s capability.AdaptiveState)
		}); ok {
			return a.adapted, true
		}
		return nil, false
	})
}

// adapted is called by a throttle.Limiter after each change of a key's
// adaptive rate: it records the new adaptive rate
// (headway.limiter.adaptive.rate).
func (o *Observer) adapted(key string, s capability.AdaptiveState) {
	o.adaptive.Record(o.noContext, s.Rate, o.keyed(o.plain, key).record...)
}
