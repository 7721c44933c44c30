package throttle

import (
	"context"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/internal/capability"
)

// The other packages of this module (throttle/httpclient, consumer, the
// examples and commands) reach what they need of a Keyed's Limiter (its
// clock, what its bucket offers, the permits a context holds) through
// capability.KeyedLimiter, registered here, rather than through an
// exported method that go doc would show users who never call it.
func init() { capability.RegisterKeyed(keyedLimiter) }

// keyedLimiter returns the view of k, a Keyed, for capability.KeyedLimiter;
// any other value gets the view of a zero Keyed (inert).
func keyedLimiter(k any) capability.Limiter {
	kk, _ := k.(Keyed)
	return internalView(kk)
}

// internalView is a Keyed seen from the other packages of this module.
type internalView Keyed

func (v internalView) Clock() clockwork.Clock {
	if v.l == nil {
		return clockwork.NewRealClock()
	}
	return v.l.cfg.clock
}

func (v internalView) Capabilities() capability.Set {
	if v.l == nil || v.l.bucket == nil {
		return capability.Set{}
	}
	b := v.l.bucket
	var s capability.Set
	s.Refunder, _ = findCap[capability.Refunder](b)
	s.Pauser, _ = findCap[capability.Pauser](b)
	s.DimensionPauser, _ = findCap[capability.DimensionPauser](b)
	s.Fallbacker, _ = findCap[capability.Fallbacker](b)
	s.AdaptiveStore, _ = findCap[capability.AdaptiveStore](b)
	s.Immediate = v.l.caps.immediate
	return s
}

func (v internalView) None() bool { return v.l == nil }

func (v internalView) Forfeit(ctx context.Context) int64 { return Keyed(v).forfeit(ctx) }

func (v internalView) AdaptiveState(ctx context.Context) (capability.AdaptiveState, error) {
	if v.l == nil {
		return capability.AdaptiveState{}, nil
	}
	return v.l.adaptiveState(ctx, v.key)
}
