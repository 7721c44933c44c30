package bucket

import (
	"github.com/headway-go/headway/internal/capability"
	"github.com/headway-go/headway/throttle"
)

// What each bucket offers a throttle.Limiter beyond Take, found through
// the registry of internal/capability (so that go doc of this package
// shows no method users never call): a fleet-wide pause (a provider's Retry-After,
// through the Transport of throttle/httpclient), its limit and the live
// instances (for throttle.FailLocal and the adaptive rate), the adaptive
// rate's state kept in Redis for the whole fleet, and for the Budget a
// pause per dimension.

// adaptiveStore is c's store of the adaptive rate.
func (c *common) adaptiveStore() capability.AdaptiveFuncs {
	return capability.AdaptiveFuncs{Pace: c.paceAdaptive, Swap: c.swapAdaptive}
}

func init() { capability.Register(capabilitiesOf) }

// capabilitiesOf returns the capabilities of b if b is a bucket of this
// package: what a throttle.Limiter finds there beyond Take (a fleet-wide
// pause, its limit for the failure policy, the adaptive rate's shared
// store). It asks for the
// unexported method rather than the concrete type, so that a user's
// wrapper that embeds a bucket of this package keeps its capabilities, as
// it kept its exported methods when they were the capabilities.
func capabilitiesOf(b any) (capability.Set, bool) {
	if c, ok := b.(interface{ capabilities() capability.Set }); ok {
		return c.capabilities(), true
	}
	return capability.Set{}, false
}

func (b *TokenBucket) capabilities() capability.Set {
	return capability.Set{
		Pauser:        capability.PauseFunc(b.pause),
		Fallbacker:    capability.FallbackFunc(b.fallback),
		AdaptiveStore: b.adaptiveStore(),
	}
}

func (b *GCRA) capabilities() capability.Set {
	return capability.Set{
		Pauser:        capability.PauseFunc(b.pause),
		Fallbacker:    capability.FallbackFunc(b.fallback),
		AdaptiveStore: b.adaptiveStore(),
	}
}

func (b *FixedWindow) capabilities() capability.Set {
	return capability.Set{
		Pauser:        capability.PauseFunc(b.pause),
		Fallbacker:    capability.FallbackFunc(b.fallback),
		AdaptiveStore: b.w.adaptiveStore(),
	}
}

func (b *Tiers) capabilities() capability.Set {
	return capability.Set{
		Pauser:        capability.PauseFunc(b.pause),
		Fallbacker:    capability.FallbackFunc(b.fallback),
		AdaptiveStore: b.w.adaptiveStore(),
	}
}

func (b *SlidingLog) capabilities() capability.Set {
	return capability.Set{
		Pauser:        capability.PauseFunc(b.pause),
		Fallbacker:    capability.FallbackFunc(b.fallback),
		AdaptiveStore: b.adaptiveStore(),
	}
}

func (b *Counter) capabilities() capability.Set {
	return capability.Set{
		Pauser:        capability.PauseFunc(b.pause),
		Fallbacker:    capability.FallbackFunc(b.fallback),
		AdaptiveStore: b.adaptiveStore(),
	}
}

// A Budget also pauses some of a key's dimensions (a provider's accounting
// headers naming one exhausted).
func (b *Budget) capabilities() capability.Set {
	return capability.Set{
		Pauser:          capability.PauseFunc(b.pause),
		DimensionPauser: capability.PauseDimensionsFunc(b.pauseDimensions),
		Fallbacker:      capability.FallbackFunc(b.fallback),
		AdaptiveStore:   b.adaptiveStore(),
	}
}

var _ throttle.Bucket = (*TokenBucket)(nil)
