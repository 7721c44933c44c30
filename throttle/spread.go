package throttle

import (
	"context"
	"time"
)

// Spreading a period's grants.
//
// A periodic bucket (see Periodic in [Bucket]) grants its whole limit as soon as it is asked in a
// period: a crowd of callers at a period's start takes it in a few
// milliseconds. The next period's crowd comes one interval later, and a
// provider counting a sliding window of that interval sees the end of the
// first burst and the whole second one in one window: up to twice the
// limit, refused at a random period edge however well the fleet keeps the
// bucket's own guarantee.
//
// So each grant of a period waits for its place in the period: the
// permits granted before it in the period, over the limit, of 95 % of the
// interval (SpreadSpan), from the period's start. The Decision says all of
// that: the period's limit, what is left of it after this grant (the
// coalesced takes of package bucket each get their own count) and when it
// ends. A crowd's grants (callers queued at the period's start, a
// backlog) then go at the limit's even pace, and a sliding window of the
// interval holds at most the limit of them (and what a millisecond holds
// at its edge: minSpread). Grants taken sparsely are never held back:
// their places have passed.
//
// The method remembers nothing but the bucket's count, so a crowd that
// comes late in a period a trickle started (a fleet starting on a key an
// earlier fleet used in the last interval) finds its places
// passed and would go at once, to meet the next period's first grants in
// one window (up to twice the limit). A bucket that can move its period's
// end prevents it at the source: a grant behind the pace (its place
// passed) lengthens the period to end an interval after the start that
// makes that place now, so the period's remaining grants are spread as in
// a fresh period and the next period starts an interval after that
// start. bucket.TokenBucket does, for intervals up to MaxSpreadInterval
// (its doc says how a take of one token counts its place, so that
// callers paced evenly at the limit's rate are never stopped at a
// period's end); the aligned windows of bucket.FixedWindow and
// bucket.Counter cannot.
//
// Only callers that can wait for any place are spread: a wait (maxWait,
// or the context's deadline) of at least the interval, or two when the
// deadline bounds it, so that the call made with that context still has
// time (waiter.canSpread). The others go when the bucket grants, as
// before: had they to go at once whenever their place lay beyond their
// wait, a period's spread grants would meet the next period's burst in
// one window. A spread caller whose place is beyond what is left of its
// wait (the gate or the pace took the rest) goes at once too. Intervals
// longer than MaxSpreadInterval are not spread: a daily quota is not a
// pace. Permits from a lease or from the failure policy are not spread
// either.
//
// A pause reported to the Limiter (an answer with a retry time) while a
// caller waits for its place holds that caller too: when its place comes
// in the pause, it gives its permit back (if the bucket takes it) and
// asks anew. Only this process's callers learn of the pause that way; a
// grant another instance of the fleet holds for a later place goes at
// that place.

// MaxSpreadInterval is the longest interval of a periodic bucket whose
// periods a Limiter spreads: a daily quota is not a pace.
const MaxSpreadInterval = time.Minute

// SpreadSpan is the share of its interval over which a Limiter places a
// periodic bucket's grants (see Periodic in [Bucket]): the grant with b permits granted before it
// in a period of limit L waits until b/L·SpreadSpan·interval after the
// period's start (the period's end, less the interval), for callers that
// can wait that long. The last place comes a twentieth of the interval
// (and one place) before the period's end, so that a call delayed on its
// way (a loaded machine) still reaches a provider counting periods of its
// own, or fixed windows, within the period it was granted in. Any window
// of one interval still holds at most the limit: periods start an
// interval apart. A bucket that lengthens a period whose grants fall
// behind this pace (bucket.TokenBucket) uses it to keep its periods on
// the Limiter's places.
const SpreadSpan = 0.95

// minSpread is the shortest wait for a place: a place nearer than that is
// not waited for (a timer costs more than it spreads, and no provider's
// window tells a millisecond's burst from an even pace).
const minSpread = time.Millisecond

// maxPeriodGap bounds periodGap.
const maxPeriodGap = 10 * time.Millisecond

// periodGap is how long after the end of a period callers refused in it
// wait besides, before they ask for the next one: a hundredth of the
// interval, at most maxPeriodGap. The bucket starts a period when it is
// first asked after the last one ended, so the fleet's periods then start
// at least the gap apart from one interval to the next, and the k-th
// grants of two periods (each at its place) reach a provider counting a
// sliding window at least an interval apart even when one of them was
// delayed on its way by up to the gap. Without it the fleet runs at the
// provider's exact limit, and a millisecond's delay of a period's first
// call against the next period's first is refused. A refusal that names a
// time before the period's end (bucket.TokenBucket's sliding bound,
// holding the period's tokens until an earlier period's grants are an
// interval old) gets the gap too: the grants then follow the earlier ones
// an interval on, the same edge. Refusals whose period ends within the
// gap (a bucket busy refilling asks for a retry in a millisecond) get no
// gap: their callers are the period's first.
func (l *Limiter) periodGap(d Decision) time.Duration {
	gap := min(time.Duration(l.interval)/100, maxPeriodGap)
	if d.Reset <= gap {
		return 0
	}
	return gap
}

// spreads reports whether grants of l's bucket are spread over their
// period.
func (l *Limiter) spreads() bool {
	return l.caps.periodic && l.leasing == nil && l.interval > 0 && time.Duration(l.interval) <= MaxSpreadInterval
}

// spreadDelay is how long a grant d of n permits waits for its place in
// the period, elapsed after the bucket was asked; 0 when it goes at once.
// The period is taken to end Reset after the bucket was asked (it ends
// Reset after the store decided, which came later): a reply that took
// long (a store that stalled) moves the places earlier, never past the
// period's end, where the next period's grants begin.
func (l *Limiter) spreadDelay(n int64, d Decision, elapsed time.Duration) time.Duration {
	if !l.spreads() || d.Limit < 1 || d.Remaining < 0 || d.Reset <= 0 {
		return 0
	}
	interval := time.Duration(l.interval)
	before := d.Limit - d.Remaining - n // the period's permits granted before these
	if before <= 0 {
		return 0
	}
	// The period started interval before it ends (a period lengthened by
	// the bucket started earlier still: its places come a little late).
	place := time.Duration(SpreadSpan * float64(interval) * float64(min(before, d.Limit)) / float64(d.Limit))
	if wait := min(d.Reset-interval+place, d.Reset) - elapsed; wait >= minSpread {
		return wait
	}
	return 0
}

// spreadOut waits delay (a grant's place in its period) for the caller's
// n permits of st's key; a caller that leaves first gives them back if
// the bucket takes permits back (its Refund), else they are spent. again
// reports that a pause of the key reported meanwhile (Report with a retry
// time) still holds when the place comes: the permits are given back the
// same way, and the caller must ask anew, as a caller arriving now would,
// rather than call the provider during the pause it asked for. The
// caller waits for a give-back at most giveBack (waiter.giveBackBound).
func (l *Limiter) spreadOut(ctx context.Context, st *keyState, n int64, delay time.Duration, giveBack func() time.Duration) (again bool, err error) {
	if err := l.sleep(ctx, delay); err != nil {
		l.cancelWithin(ctx, giveBack(), st.key, n, Decision{})
		return false, err
	}
	if st.pausedUntil.Load() > l.tb.now() {
		l.cancelWithin(ctx, giveBack(), st.key, n, Decision{})
		return true, nil
	}
	return false, nil
}

// notePause records a pause of the key until until (on the Limiter's time
// base), for the callers waiting for their place.
func (st *keyState) notePause(until int64) {
	for {
		old := st.pausedUntil.Load()
		if old >= until || st.pausedUntil.CompareAndSwap(old, until) {
			return
		}
	}
}
