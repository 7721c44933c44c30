package otelmetrics

import "github.com/headway-go/headway/throttle"

// Adapted records key's adaptive rate after a change the Limiter made
// (headway.limiter.adaptive.rate): it makes o a throttle.AdaptiveObserver,
// which a throttle.Limiter calls after each change of a key's adaptive
// rate. A user's Observer that embeds *Observer keeps it.
func (o *Observer) Adapted(key string, s throttle.AdaptiveState) {
	o.adaptive.Record(o.noContext, s.Rate, o.keyed(o.plain, key).record...)
}
