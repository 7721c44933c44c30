package throttle

import (
	"context"
	"math"
	"sync"
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
// time (waiter.canSpread). The others are not placed: had they to go at
// once whenever their place lay beyond their wait, a period's spread
// grants would meet the next period's burst in one window. They keep to
// a sliding view of the limit instead (see "A sliding view" below). A
// spread caller whose place lies beyond what is left of its wait (the
// gate or the pace took the rest) does not go at once: it is refused
// before it asks the bucket when this process's view of the period
// shows it (periodView), else its permits are given back (or spent) and
// it fails with ErrTimeout. Intervals longer than MaxSpreadInterval are
// not spread: a daily quota is not a pace. Permits from a lease or from
// the failure policy are not spread either.
//
// A pause reported to the Limiter (an answer with a retry time) while a
// caller waits for its place holds that caller too: when its place comes
// in the pause, it gives its permit back (if the bucket takes it) and
// asks anew. Only this process's callers learn of the pause that way; a
// grant another instance of the fleet holds for a later place goes at
// that place.

// MaxSpreadInterval is the longest interval of a [Periodic] bucket whose
// periods a Limiter spreads: a daily quota is not a pace.
const MaxSpreadInterval = time.Minute

// SpreadSpan is the share of its interval over which a Limiter places a
// [Periodic] bucket's grants: the grant with b permits granted before it
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
// call against the next period's first is refused. Refusals that do not
// name the period's end (a bucket busy refilling asks for a retry in a
// millisecond) get no gap: their callers are the period's first.
func (l *Limiter) periodGap(d Decision) time.Duration {
	gap := min(time.Duration(l.interval)/100, maxPeriodGap)
	if d.Reset <= gap || d.Delay < d.Reset {
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
// the bucket takes permits back ([Refunder]), else they are spent. again
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

// A sliding view, for callers that cannot wait for any place.
//
// Callers whose wait is shorter than what canSpread asks are not placed
// in the period: they take their permits as the bucket grants them. That
// keeps a provider's sliding window within the limit only while each
// period's grants come as one burst at its start (a backlog, a crowd):
// periods start an interval apart. At first contact they do not: calls
// arriving faster than the limit from a standing start take the first
// period's permits as they arrive (40 in the first half second for 40/s
// and calls at 80/s), and the next period's backlog goes at its start, in
// the same window as most of them (a provider counting 50/s refused 4 or
// 5 of the 80 and paused the fleet a second).
//
// So the Limiter keeps, per key, when this process's last limit's worth
// of such grants went (slidingView), and a grant goes no sooner than one
// interval after the grant a limit before it: any window of one interval
// holds at most the limit of them, whatever the periods' phase, and a
// period's grants follow the previous period's pattern, an interval on.
// A burst after a quiet interval, and a crowd that finds fewer than a
// limit of grants in the last interval, go at once, as before. A caller
// whose slot lies beyond its wait (half of what is left of it when its
// context's deadline bounds it, so that its call still has time) is
// refused before it asks the bucket (ErrTimeout, nothing taken): had it
// taken a permit and gone at once, its call would land in a full window.
// One that learns only after its take that its slot lies beyond its wait
// (another caller claimed the slot it saw) gives its permits back if the
// bucket takes them back (else they are spent, uncalled) and fails the
// same way.
//
// The view holds this process's grants only. Once a period has ended, the
// "limit" it counts back is this process's share of it: its takes over
// the most the bucket's answers to it counted (at least its share: the
// others' takes after its last are not seen), so that instances seeing
// like traffic each keep their own share and the fleet its limit; before
// that, the whole limit. It is held in at most maxSlidingView times: for
// a limit above that, one time per group of limit/maxSlidingView grants
// (rounded up), the group's first, which lets a window hold up to a
// group more than the limit.

// spreadKey is the spread's state of one key: what this process last
// heard of the key's running period, for placed callers (period), and
// when its last grants of callers not placed in the period went (slide).
// Each view has its own mutex, which guards that view alone and is held
// only inside the view's methods: no other lock is taken under it, and
// it is never taken under another.
type spreadKey struct {
	period periodView
	slide  slidingView
}

// maxSlidingView bounds the times a slidingView keeps per key.
const maxSlidingView = 128

// slidingView is when this process's last grants of a key went, for
// callers that are not placed in the period (see "A sliding view").
type slidingView struct {
	mu      sync.Mutex
	limit   int64   // the limit the ring was built for
	group   int64   // grants per time kept
	times   []int64 // ring of the groups' first send times, on the time base
	next    int     // where the next group's time goes (after the newest)
	written int     // times written, up to len(times)
	count   int64   // grants in the group being filled
	first   int64   // its first grant's send time

	// This process's share of the fleet's grants, from the last period
	// it took grants in: its own grants (own) of the fleet's (fleet, the
	// most the bucket's answers counted) in the period ending at end.
	// 0 until a period has ended: the whole limit.
	end, own, fleet int64
	share           float64
}

// slot is when the next grant may go: an interval after this process's
// grant its share of the limit before it; 0 when it has not made that
// many. v.mu is held.
func (v *slidingView) slot(interval int64) int64 {
	if len(v.times) == 0 {
		return 0
	}
	mine := float64(v.limit)
	if v.share > 0 {
		mine *= v.share
	}
	back := min(max(int(math.Ceil(mine/float64(v.group))), 1), len(v.times))
	if v.written < back {
		return 0
	}
	return v.times[(v.next-back+len(v.times))%len(v.times)] + interval
}

// ahead is how long after now the next grant may go, for a key of the
// given interval: 0 when it may go now.
func (v *slidingView) ahead(now, interval int64) time.Duration {
	v.mu.Lock()
	defer v.mu.Unlock()
	return time.Duration(max(v.slot(interval)-now, 0))
}

// claim records a grant d of n permits (the bucket asked at asked) going
// no sooner than its slot, and returns how long after now that is. A
// slot beyond room is not claimed: ok is false, and only the grant's
// count (for this process's share) is recorded.
func (v *slidingView) claim(n int64, d Decision, asked, now, interval int64, room time.Duration) (wait time.Duration, ok bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if d.Limit != v.limit {
		// First use, or a limit changed live: start a fresh view.
		v.limit, v.group = d.Limit, (d.Limit+maxSlidingView-1)/maxSlidingView
		v.times, v.next, v.written, v.count = make([]int64, (d.Limit+v.group-1)/v.group), 0, 0, 0
	}
	v.countFleet(d, asked, interval)
	v.own += n // taken by this process, sent or not
	at := max(now, v.slot(interval))
	if time.Duration(at-now) > room {
		return time.Duration(at - now), false
	}
	for range n {
		if v.count == 0 {
			v.first = at
		}
		if v.count++; v.count == v.group {
			v.times[v.next] = v.first
			v.next = (v.next + 1) % len(v.times)
			v.written = min(v.written+1, len(v.times))
			v.count = 0
		}
	}
	return time.Duration(at - now), true
}

// countFleet notes the fleet's count of the period d (the bucket asked at
// asked) tells of: a later period's start makes the last one tell this
// process's share. v.mu is held.
func (v *slidingView) countFleet(d Decision, asked, interval int64) {
	if end := asked + int64(d.Reset); end > v.end+interval/2 {
		if v.fleet > 0 {
			v.share = min(float64(v.own)/float64(v.fleet), 1)
		}
		v.end, v.own, v.fleet = end, 0, 0
	}
	v.fleet = max(v.fleet, d.Limit-d.Remaining)
}

// noteRefusal counts the fleet's grants of the period a refusal d (the
// bucket asked at asked) tells of: a period spent counts the whole limit.
func (v *slidingView) noteRefusal(d Decision, asked, interval int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.countFleet(d, asked, interval)
}

// noteDecision records what the bucket's answer d, asked at asked, tells
// of the key's period: for a placed caller, in the period view; a
// refusal, for a caller keeping to the sliding view, in that view's
// count of the fleet's grants (a period spent counts the whole limit).
func (l *Limiter) noteDecision(st *keyState, spread, slide bool, asked int64, d Decision) {
	switch {
	case spread:
		st.spread.period.note(asked, d, l.interval)
	case slide && !d.Granted && d.Limit >= 1 && d.Remaining >= 0 && d.Reset > 0:
		st.spread.slide.noteRefusal(d, asked, l.interval)
	}
}

// slideRoom is how far ahead a caller not placed in the period may wait
// for its slot in the sliding view: what is left of its wait, or half of
// it when its context's deadline bounds it, so that the call made with
// that context still has time.
func (w *waiter) slideRoom() time.Duration {
	left := w.left()
	if w.tb.ctxBound {
		return left / 2
	}
	return left
}

// slides reports whether w's grants of l's bucket keep to the key's
// sliding view: permits (not a cost) of a periodic bucket spread, and a
// caller not placed in the period that can wait at all.
func (l *Limiter) slides(w *waiter, placed bool) bool {
	return !placed && w.cost == nil && l.spreads() && !w.noWait()
}

// beyondWait is the ErrTimeout of a caller that must not ask the bucket:
// placed in the period (spread), the next grant's place as this process
// last heard of the period lies beyond what is left of its wait; keeping
// to the sliding view (slide), its slot lies beyond its room
// (slideRoom). nil when it may ask. now is the clock's reading.
func (l *Limiter) beyondWait(st *keyState, w *waiter, spread, slide bool, now int64) error {
	var ahead, room time.Duration
	switch {
	case spread:
		ahead, room = st.spread.period.ahead(now, l.interval), w.left()
	case slide:
		ahead, room = st.spread.slide.ahead(now, l.interval), w.slideRoom()
	}
	if ahead > 0 && ahead >= room {
		return w.tb.err(ahead)
	}
	return nil
}

// periodView is what a Limiter last heard of a key's running period from
// the bucket's answers to callers placed in it: its end (on the time base)
// and the permits granted in it, so that a caller whose place lies beyond
// its wait is refused before it takes a permit. Other instances' grants
// since make the real place later still: a caller refused on the view
// would have been refused on its place.
//
// A placed caller whose place is beyond its wait (the gate or the pace
// took the rest, or the view was behind) is not sent at once either: its
// permits are given back if the bucket takes them back, else spent, and
// it fails with ErrTimeout. Sent at once, its call would land in the
// previous period's window: a backlog of callers near their deadline
// (calls arriving faster than the limit, each with a client timeout)
// went in bursts that a sliding window refused.
type periodView struct {
	mu      sync.Mutex
	end     int64 // 0: none heard
	granted int64
	limit   int64
}

// note records d, an answer of the bucket asked at asked.
func (p *periodView) note(asked int64, d Decision, interval int64) {
	if d.Limit < 1 || d.Remaining < 0 || d.Reset <= 0 {
		return
	}
	end, granted := asked+int64(d.Reset), d.Limit-d.Remaining
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case end > p.end+interval/2: // a later period
		p.end, p.granted, p.limit = end, granted, d.Limit
	case end >= p.end-interval/2: // the same one, seen by another call
		p.end, p.granted, p.limit = max(p.end, end), max(p.granted, granted), d.Limit
	}
}

// ahead is how long after now the next grant's place comes, as far as
// the view knows: 0 when no period is known to run.
func (p *periodView) ahead(now, interval int64) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end == 0 || now >= p.end || p.limit < 1 {
		return 0
	}
	place := p.end - interval + int64(SpreadSpan*float64(interval)*float64(min(p.granted, p.limit))/float64(p.limit))
	return time.Duration(max(place-now, 0))
}

// keepToSlide is the sliding view's stage for a grant c of st's key (the
// bucket asked at asked): it claims the grant's slot in the view and
// waits for it. A slot beyond the caller's room (another caller claimed
// the one it saw before its take) gives the grant back within the wait
// (waiter.giveBack: if the bucket takes it back) and ends the wait with
// ErrTimeout: sent at once, the call would land in a full window. again
// reports that a pause came first: the grant was given back, and the
// caller asks anew.
func (w *waiter) keepToSlide(st *keyState, c *decision, asked int64) (again bool, err error) {
	l, d := w.l, c.Decision
	if d.Limit < 1 || d.Remaining < 0 || d.Reset <= 0 {
		return false, nil // not a period's count: nothing to keep to
	}
	s, ok := st.spread.slide.claim(w.n, d, asked, l.tb.now(), l.interval, w.slideRoom())
	if !ok {
		w.giveBack(c)
		return false, w.tb.err(s)
	}
	if s < minSpread {
		return false, nil
	}
	if again, err := l.spreadOut(w.ctx, st, w.n, s, w.giveBackBound); again || err != nil {
		return again, err
	}
	return false, w.keep(c, true)
}
