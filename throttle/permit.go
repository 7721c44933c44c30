package throttle

import (
	"context"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/internal/pacenote"
)

// ContextWithPermit returns a copy of ctx that carries n permits the
// caller has already acquired from k, for the code it calls with that
// context. The first Acquire or AcquireN of the same budget made with the
// returned context (or one derived from it) that asks for at most the
// permits still held uses them instead of taking new ones; later ones take
// their own. The same budget is the same key of the same Limiter, or of
// another Limiter over the same bucket.
//
// This is how one call is charged once when two layers each take a permit
// for it: the consumer of package consumer acquires a permit for a
// record's attempt and passes it to the handler's context, and a
// Transport of package throttle/httpclient built on the same Limiter uses
// it for the handler's first request instead of waiting for a second
// permit. A second request of the same attempt, or a retry the Transport
// makes after a provider's pause, takes a permit of its own.
//
// Held permits are used at most once, however many goroutines share the
// context. The consumer passes with its attempt's permit the end of that
// permit's margin (Decision.Margin), after which the permit is not used:
// a call made then takes a permit of its own, whose time is its own.
// Permits held from an Acquire of the caller's own carry no such bound:
// hand them on at once, for a call made at once. A pause reported for the
// key to the Limiter asked ([Limiter.Report] with a retry time) gives up
// the permits held when they are asked for in it, as [Keyed.Forfeit]
// does: they were taken for a time the provider refused. n < 1, or a
// zero Keyed, holds nothing and returns ctx.
func (k Keyed) ContextWithPermit(ctx context.Context, n int64) context.Context {
	if k.l == nil || n < 1 {
		return ctx
	}
	h := &heldPermits{l: k.l, key: k.key, until: pacenote.UseByOf(ctx)}
	h.left.Store(n)
	h.outer, _ = ctx.Value(heldKey{}).(*heldPermits)
	return context.WithValue(ctx, heldKey{}, h)
}

// Forfeit gives up the permits of k's key that ctx holds
// ([Keyed.ContextWithPermit]), without returning them to the bucket, and
// returns how many of the innermost ones were never used (given up now,
// or by an earlier Forfeit; never an enclosing context's): later Acquire
// calls with ctx take new ones. A client that finds the
// key paused by the provider calls it before waiting out the pause (the
// Transport of throttle/httpclient does): a permit taken before the pause
// belongs to the time the provider refused, and spent after it, it would
// come on top of the permits the bucket grants then.
func (k Keyed) Forfeit(ctx context.Context) int64 {
	if k.l == nil {
		return 0
	}
	n := int64(-1)
	for h, _ := ctx.Value(heldKey{}).(*heldPermits); h != nil; h = h.outer {
		if h.key == k.key && (h.l == k.l || sameBucket(h.l.bucket, k.l.bucket)) {
			if d := h.dropped.Add(max(h.left.Swap(0), 0)); n < 0 {
				n = d
			}
		}
	}
	return max(n, 0)
}

type heldKey struct{}

// heldPermits are permits of one budget passed down a context; outer
// holds those of the enclosing context, for other budgets.
type heldPermits struct {
	l    *Limiter
	key  string
	left atomic.Int64
	// dropped counts the permits Forfeit gave up, never used.
	dropped atomic.Int64
	until   time.Time // zero: no bound
	outer   *heldPermits
}

// useHeld takes n permits of l's key from those ctx holds, if it holds
// enough of the same budget; while a pause reported for the key lasts, it
// gives them up instead (see ContextWithPermit).
func (l *Limiter) useHeld(ctx context.Context, key string, n int64) bool {
	h, _ := ctx.Value(heldKey{}).(*heldPermits)
	checked := false
	for ; h != nil; h = h.outer {
		if h.key != key || h.l != l && !sameBucket(h.l.bucket, l.bucket) || h.left.Load() < n {
			continue
		}
		if !checked {
			checked = true
			if l.pausedNow(key) {
				Keyed{l: l, key: key}.Forfeit(ctx)
				return false
			}
		}
		if !h.until.IsZero() && l.cfg.clock.Now().After(h.until) {
			continue // past their margin: a call now would come late
		}
		if _, ok := spend(&h.left, n); ok {
			return true
		}
	}
	return false
}

// pausedNow reports whether a pause reported for key is in force.
func (l *Limiter) pausedNow(key string) bool {
	now := l.tb.now()
	st := l.stateAt(key, now)
	defer l.release(st)
	return st.pausedUntil.Load() > now
}

// sameBucket reports whether a and b are the same bucket value; buckets
// that cannot be compared are never the same, nor are those of a
// comparable type holding a value that cannot be (an interface field
// holding a func), whose comparison would panic.
func sameBucket(a, b Bucket) bool {
	if a == nil || b == nil {
		return false
	}
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	return va.Type() == vb.Type() && va.Comparable() && vb.Comparable() && a == b
}
