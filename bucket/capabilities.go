package bucket

import (
	"github.com/headway-go/headway/internal/capability"
	"github.com/headway-go/headway/throttle"
)

// What each bucket offers a throttle.Limiter beyond Take, found through
// its Capabilities method: a fleet-wide pause (a provider's Retry-After,
// through the Transport of throttle/httpclient), its limit and the live
// instances (for throttle.FailLocal and the adaptive rate), the adaptive
// rate's state kept in Redis for the whole fleet, and for some a refund,
// a pause per dimension, or the mark of a periodic bucket (whose grants
// the Limiter spreads over the period).

// adaptiveStore is c's store of the adaptive rate.
func (c *common) adaptiveStore() capability.AdaptiveFuncs {
	return capability.AdaptiveFuncs{Pace: c.paceAdaptive, Swap: c.swapAdaptive}
}

// Capabilities is used by [throttle.Limiter]: it finds there what b
// offers beyond Take (a fleet-wide pause, its limit for the failure
// policy, the adaptive rate's shared store, a period the Limiter spreads
// grants over). It is not for direct use: its type is internal.
func (b *TokenBucket) Capabilities() capability.Set {
	return capability.Set{
		Pauser:        capability.PauseFunc(b.pause),
		Fallbacker:    capability.FallbackFunc(b.fallback),
		AdaptiveStore: b.adaptiveStore(),
		Periodic:      true, // a period's tokens are all there at its start
	}
}

// Capabilities is used by [throttle.Limiter]; see [TokenBucket.Capabilities].
func (b *GCRA) Capabilities() capability.Set {
	return capability.Set{
		Pauser:        capability.PauseFunc(b.pause),
		Fallbacker:    capability.FallbackFunc(b.fallback),
		AdaptiveStore: b.adaptiveStore(),
	}
}

// Capabilities is used by [throttle.Limiter]; see [TokenBucket.Capabilities].
func (b *FixedWindow) Capabilities() capability.Set {
	return capability.Set{
		Pauser:        capability.PauseFunc(b.pause),
		Fallbacker:    capability.FallbackFunc(b.fallback),
		AdaptiveStore: b.w.adaptiveStore(),
		Periodic:      true, // a window's permits are all there at its start
	}
}

// Capabilities is used by [throttle.Limiter]; see [TokenBucket.Capabilities].
func (b *Tiers) Capabilities() capability.Set {
	return capability.Set{
		Pauser:        capability.PauseFunc(b.pause),
		Fallbacker:    capability.FallbackFunc(b.fallback),
		AdaptiveStore: b.w.adaptiveStore(),
	}
}

// Capabilities is used by [throttle.Limiter]; see [TokenBucket.Capabilities].
func (b *SlidingLog) Capabilities() capability.Set {
	return capability.Set{
		Pauser:        capability.PauseFunc(b.pause),
		Fallbacker:    capability.FallbackFunc(b.fallback),
		AdaptiveStore: b.adaptiveStore(),
	}
}

// Capabilities is used by [throttle.Limiter]; see [TokenBucket.Capabilities].
func (b *Counter) Capabilities() capability.Set {
	return capability.Set{
		Pauser:        capability.PauseFunc(b.pause),
		Fallbacker:    capability.FallbackFunc(b.fallback),
		AdaptiveStore: b.adaptiveStore(),
		Periodic:      true, // a period's calls may all come at its start
	}
}

// Capabilities is used by [throttle.Limiter]; see [TokenBucket.Capabilities].
// A Budget also takes back permits (a settle-down, leased permits handed
// back) and pauses some of a key's dimensions (a provider's accounting
// headers naming one exhausted).
func (b *Budget) Capabilities() capability.Set {
	return capability.Set{
		Refunder:        capability.RefundFunc(b.refund),
		Pauser:          capability.PauseFunc(b.pause),
		DimensionPauser: capability.PauseDimensionsFunc(b.pauseDimensions),
		Fallbacker:      capability.FallbackFunc(b.fallback),
		AdaptiveStore:   b.adaptiveStore(),
	}
}

var (
	_ capability.Provider = (*TokenBucket)(nil)
	_ capability.Provider = (*GCRA)(nil)
	_ capability.Provider = (*FixedWindow)(nil)
	_ capability.Provider = (*Tiers)(nil)
	_ capability.Provider = (*SlidingLog)(nil)
	_ capability.Provider = (*Counter)(nil)
	_ capability.Provider = (*Budget)(nil)
	_ throttle.Bucket     = (*TokenBucket)(nil)
)
