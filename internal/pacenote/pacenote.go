// Package pacenote carries, in a context, what the consumer's scheduler
// and a throttle.Limiter tell each other about one wait: whether the wait
// was paced by the bucket, and until when the permit it handed over may be
// used. It is internal: the consumer and the Limiter are its only users.
package pacenote

import (
	"context"
	"sync/atomic"
	"time"
)

// Note, carried by a context ([With]), learns whether a
// throttle.Limiter's wait under that context waited for its bucket's
// pace: for a grant's place in its period, a refusal's retry time (in
// private or behind the key's closed gate), a reservation, or the
// adaptive pace. A grant that came without any of these came as fast as
// the bucket answered. The consumer's fairness scheduler keeps more
// permit requests outstanding only while grants come that fast (more
// requests then make more permits), and one while the Limiter paces them
// (more would only take places in a row). Safe for concurrent use.
//
// It also learns until when the permit the wait handed over may be used
// (UseBy): its time plus the bucket's margin (throttle.Decision.Margin),
// so that a holder of a permit it cannot use at once (the scheduler,
// waiting for a worker) drops it rather than send late.
type Note struct {
	paced atomic.Bool
	useBy atomic.Int64 // Unix ns; 0: no bound
}

// Paced reports whether a wait under the note's context waited for the
// bucket's pace since the note was made or last Reset.
func (n *Note) Paced() bool { return n.paced.Load() }

// UseBy is until when the permit of the last wait under the note's
// context may be used; zero when its bucket bounds nothing.
func (n *Note) UseBy() time.Time {
	if ns := n.useBy.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Reset forgets what the note learned, for the next wait under its
// context.
func (n *Note) Reset() {
	n.paced.Store(false)
	n.useBy.Store(0)
}

type noteKey struct{}

// Of returns the Note ctx carries, nil if none.
func Of(ctx context.Context) *Note {
	n, _ := ctx.Value(noteKey{}).(*Note)
	return n
}

// With returns ctx carrying n.
func With(ctx context.Context, n *Note) context.Context {
	return context.WithValue(ctx, noteKey{}, n)
}

// MarkPaced tells the Note ctx carries, if any, that its wait waited
// for the bucket's pace; the Limiter calls it before each such wait.
func MarkPaced(ctx context.Context) {
	if n, ok := ctx.Value(noteKey{}).(*Note); ok {
		n.paced.Store(true)
	}
}

// SetUseBy tells the Note ctx carries, if any, until when the permit
// its wait hands over may be used; the Limiter calls it as it returns.
func SetUseBy(ctx context.Context, t time.Time) {
	if n, ok := ctx.Value(noteKey{}).(*Note); ok {
		n.useBy.Store(t.UnixNano())
	}
}

type useByKey struct{}

// WithUseBy returns ctx carrying t, until when the permits a
// throttle.Keyed.ContextWithPermit made with it (or a context derived
// from it) hold may be used: the consumer hands its attempt's permit to
// the handler that way, and a call made later takes one of its own.
func WithUseBy(ctx context.Context, t time.Time) context.Context {
	if t.IsZero() {
		return ctx
	}
	return context.WithValue(ctx, useByKey{}, t)
}

// UseByOf returns the time WithUseBy put in ctx, zero if none.
func UseByOf(ctx context.Context) time.Time {
	t, _ := ctx.Value(useByKey{}).(time.Time)
	return t
}
