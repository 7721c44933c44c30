package throttle

import (
	"context"
	"time"
)

// Spreading a period's grants.
//
// A [Periodic] bucket grants its whole limit as soon as it is asked in a
// period: a crowd of callers at a period's start takes it in a few
// milliseconds. The next period's crowd comes one interval later, and a
// provider counting a sliding window of that interval sees the end of the
// first burst and the whole second one in one window: up to twice the
// limit, refused at a random period edge however well the fleet keeps the
// bucket's own guarantee.
//
// Once a key was heard from (any answer reported: a provider is being
// called), each grant of the key's period waits for its place in the
// period: the permits granted before it in the period, over the limit, of
// the interval, from the period's start. The Decision says all of that:
// the period's limit, what is left of it after this grant (the coalesced
// takes of package bucket each get their own count) and when it ends. So
// a crowd's grants (callers queued at the period's start, a backlog) go
// at the limit's even pace, and a sliding window of the interval holds at
// most the limit of them (one more at its edge). Grants taken sparsely
// are never held back: their places have passed. That is also the limit
// of the method, which remembers nothing but the bucket's count: a crowd
// that comes late in a period a trickle started finds its places passed
// and goes at once, and the next period's first grants can meet it in one
// window (fewer than without spreading, up to twice the limit at worst).
//
// The place is waited for within the caller's wait left: a caller that
// cannot wait that long (maxWait 0) goes when its wait runs out, as the
// bucket granted it; one whose context's deadline comes first goes at
// once (at its deadline, its call could no longer be made). Intervals
// longer than maxSpreadInterval are not spread: a daily quota is not a
// pace. Permits from a lease or from the failure policy are not spread
// either.

// maxSpreadInterval is the longest interval whose periods are spread.
const maxSpreadInterval = time.Minute

// spreadDelay is how long a grant d of n permits of st's key waits for its
// place in the period; 0 when it goes at once.
func (l *Limiter) spreadDelay(st *keyState, n int64, d Decision) time.Duration {
	if !l.caps.periodic || l.leasing != nil || !st.heard.Load() {
		return 0
	}
	interval := time.Duration(l.interval)
	if interval <= 0 || interval > maxSpreadInterval || d.Limit < 1 || d.Remaining < 0 || d.Reset <= 0 {
		return 0
	}
	before := d.Limit - d.Remaining - n // the period's permits granted before these
	if before <= 0 {
		return 0
	}
	// The period started interval before it ends (a period lengthened by
	// the bucket started earlier still: its places come a little late).
	place := time.Duration(float64(interval) * float64(min(before, d.Limit)) / float64(d.Limit))
	return min(d.Reset-interval+place, d.Reset)
}

// hear notes that a provider's answer for st's key was reported.
func (st *keyState) hear() {
	if !st.heard.Load() {
		st.heard.Store(true)
	}
}

// spreadOut waits delay (a grant's place in its period) for the caller's
// n permits of key; a caller that leaves first gives them back if the
// bucket takes permits back ([Refunder]), else they are spent.
func (l *Limiter) spreadOut(ctx context.Context, key string, n int64, delay time.Duration) error {
	if err := l.sleep(ctx, delay); err != nil {
		l.cancelReservation(ctx, key, n, Decision{})
		return err
	}
	return nil
}
