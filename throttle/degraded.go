package throttle

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// FailLocal's degraded mode; [FailLocal] says what it guarantees. While
// the store fails, each instance paces its own grants of a key evenly, one
// slot every interval·instances/limit: evenly spaced slots put at most the
// share in any span of one interval, however the shared bucket aligns its
// periods (a sliding limit included). A take of n permits fills n slots
// and is granted when the last of them has come.
//
// Where the pacing starts keeps the fleet from doubling at the outage's
// edges. The key's ledger (periodBound) keeps the fewest permits any
// shared decision of the running period reported left, not the last to
// arrive: answers of one period arrive in no particular order (concurrent
// calls, coalesced callers told different figures). With no period known
// when the store failed (an idle key, or an instance that was refused
// until the period ended), the instance assumes that period's grants all
// used, and starts one interval after the failure, when any period begun
// before it has ended. When the store answers again, settle takes the
// local grants of the last two intervals from it, and the first-back cap
// (recoveryCap) bounds the first shared period.
//
// The limit is the key's own, as its last shared decision reported it (a
// limit set live per key stays in force, and a key whose limit was lowered
// below the default is remembered however long it idles); a key never seen
// uses the default, the limit of keys without a live one (Fallback). The
// instance count is the bucket's: the Redis buckets report the largest
// count they saw when they have not heard from the store recently. A share
// below one permit per interval (more instances than the limit) is
// refused: evenly spread single permits could still meet in one interval.

// periodBound is a key's ledger of the shared period running: when it
// ends and the fewest permits a shared decision of it reported left. Two
// decisions belong to one period when their ends are less than half an
// interval apart (periods are at least an interval apart); the later end
// is kept. A decision of an earlier period that arrives late changes
// nothing.
//
// Decisions of the period running are noted without a lock (note); only
// a decision that begins a later period takes the key's lock (start), as
// do the readers. A note racing with a start can only lower the new
// period's figure: conservative.
type periodBound struct {
	end       atomic.Int64 // on the Limiter's time base; 0: no period known
	remaining atomic.Int64 // the fewest left; an unknown Remaining counts as 0
}

// note records a shared decision that reported remaining permits left in
// a period ending at end; tol is half the bucket's interval. It returns
// false when the decision begins a later period: the caller then calls
// start, holding the key's lock.
func (p *periodBound) note(end, remaining, tol int64) bool {
	remaining = max(remaining, 0)
	cur := p.end.Load()
	switch {
	case cur == 0 || end > cur+tol:
		return false
	case end < cur-tol:
		return true // a late answer of an earlier period
	}
	atMost(&p.remaining, remaining)
	atLeast(&p.end, end)
	return true
}

// start begins the later period a decision noted (see note). The caller
// holds the key's outageKey.mu.
func (p *periodBound) start(end, remaining, tol int64) {
	if cur := p.end.Load(); cur != 0 && end <= cur+tol {
		p.note(end, remaining, tol) // begun meanwhile
		return
	}
	p.remaining.Store(max(remaining, 0))
	p.end.Store(end)
}

// outageKey is what the failure policy keeps of one key. Lock rule: the
// ledger's running period and faulted are atomics, read without a lock
// (see periodBound); the ledger's start of a later period, local and
// recovery are under mu, which guards nothing else. faulted is set while
// mu guards something of an outage (a local share or a first-back cap):
// a shared decision of a key without it takes mu only to start its
// ledger's next period.
type outageKey struct {
	faulted  atomic.Bool
	ledger   periodBound
	mu       sync.Mutex
	local    *localShare  // FailLocal's pace and debt during and after an outage
	recovery *recoveryCap // the first shared period after an outage
}

// holds reports whether o keeps something at now: permits granted locally
// that the store has not been charged for, or a first-back cap.
func (o *outageKey) holds(now int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.local != nil && o.local.holds(now) || o.recovery != nil && o.recovery.holds(now)
}

// localShare is one key's pace while the store is down, and what it
// granted, for the account at recovery.
type localShare struct {
	emission int64 // ns per permit
	share    int64 // permits per interval
	tat      int64 // next free slot
	interval int64
	// Before until (the end of the shared period running when the store
	// failed), at most budget permits: this instance's share of what that
	// period had left.
	until, budget int64
	// granted counts local grants in the interval-long window starting at
	// winStart and in the one before it.
	winStart      int64
	granted, prev int64
	// outage is the start of the outage the pace was set in: a key left
	// unsettled from an earlier outage starts afresh in the next.
	outage int64
	// carried: a shared call is taking these grants from the store along
	// with its own permits (see claimDebt); nobody else charges them.
	carried bool
	// total counts every local grant of the key; claimed is total when
	// the carried debt was claimed. Once it is settled, what was granted
	// after the claim is still owed: at most after (capped; see settled).
	total, claimed int64
	capped         bool
	after          int64
}

func (k *localShare) count(now, n int64) {
	if now >= k.winStart+k.interval {
		if now >= k.winStart+2*k.interval {
			k.prev = 0
		} else {
			k.prev = k.granted
		}
		k.granted = 0
		k.winStart = now - (now-k.winStart)%k.interval
	}
	k.granted += n
	k.total += n
}

// owed is what the key granted locally in (about) the last two intervals
// and has not accounted for yet.
func (k *localShare) owed(now int64) int64 {
	var n int64
	switch {
	case now >= k.winStart+2*k.interval:
		n = 0
	case now >= k.winStart+k.interval:
		n = k.granted
	default:
		n = k.granted + k.prev
	}
	if k.capped {
		n = min(n, k.after)
	}
	return n
}

// holds reports whether the share still matters at now: it owes the store
// permits, or a call carries its debt.
func (k *localShare) holds(now int64) bool { return k.carried || k.owed(now) > 0 }

// take is the share's decision for n permits at now: granted, or refused
// with the delay until its next slot.
func (k *localShare) take(n, now int64) Decision {
	// tat is the first free slot; the next take starts after these n.
	// Granted at the first of them instead, takes of 3 with a share of 5
	// would come 3 slots apart: 6 permits in one interval.
	next := k.tat + (n-1)*k.emission
	if now < k.until && k.budget < n {
		next = max(next, k.until) // this instance's part of the running period is spent
	}
	if next > now {
		return Decision{Delay: time.Duration(next - now), Remaining: -1}
	}
	if now < k.until {
		k.budget -= n
	}
	k.tat = now + n*k.emission
	k.count(now, n)
	return Decision{Granted: true, Remaining: -1}
}

// localShareOf is what FailLocal's share is made of: the bucket's limit
// per interval (keyLimit instead, a key's own limit, when positive) and
// its live instances; why says why there is no share, when there is none.
func (l *Limiter) localShareOf(keyLimit int64) (limit int64, interval time.Duration, inst int64, why string) {
	fb := l.caps.fallbacker
	if fb == nil {
		return 0, 0, 0, "the bucket does not report its limit and instance count (it has no Fallback method)"
	}
	limit, interval, inst = fb.Fallback()
	if keyLimit > 0 {
		limit = keyLimit // the key's own limit, live ones included
	}
	switch {
	case inst < 1:
		why = "this instance has not reached the store since it started, so it does not know its share"
	case limit < 1 || interval <= 0:
		why = "the bucket reports no limit per interval"
	case limit < inst:
		why = fmt.Sprintf("its share would be below one permit per interval (limit %d among %d live instances)", limit, inst)
	case interval.Nanoseconds()/(limit/inst) > (1<<62)/inst:
		why = "its share's pace overflows"
	}
	return limit, interval, inst, why
}

// localTake is FailLocal's decision for n permits of st's key: granted now,
// or refused with the delay until this instance's next slot. why is set
// when FailLocal cannot decide and refuses (the Limiter then fails
// closed): it says why. err is set when n is above one share.
func (l *Limiter) localTake(st *keyState, n int64) (d Decision, why string, err error) {
	limit, interval, inst, why := l.localShareOf(st.limit.Load())
	if why != "" {
		return Decision{}, why, nil
	}
	iv := interval.Nanoseconds()
	share := limit / inst
	now := l.tb.now()
	down := l.outage.since.Load()
	st.out.mu.Lock()
	defer st.out.mu.Unlock()
	k := st.out.local
	if k == nil || k.share != share || k.interval != iv || k.outage != down {
		nk := &localShare{emission: ceilDiv(iv, share), share: share, interval: iv, tat: max(addSat(down, interval), now), winStart: now, outage: down}
		if end := st.out.ledger.end.Load(); end > down {
			// The period of the ledger was still running when the store
			// failed: this instance's share of the fewest permits it was
			// reported to have left, before its end.
			nk.tat, nk.until, nk.budget = now, end, st.out.ledger.remaining.Load()/inst
		}
		if k != nil {
			if k.outage == down { // the share changed during the outage: keep the pace
				nk.tat, nk.until, nk.budget = max(k.tat, now), k.until, k.budget
			}
			// Keep the count, still to be accounted for (a new outage
			// began before the key's first shared call after the last).
			nk.winStart, nk.granted, nk.prev, nk.carried = k.winStart, k.granted, k.prev, k.carried
			nk.total, nk.claimed, nk.capped, nk.after = k.total, k.claimed, k.capped, k.after
			if k.capped && k.outage != down {
				// New grants come on top of what the last outage still
				// owes: count that as granted now.
				nk.winStart, nk.granted, nk.prev, nk.capped = now, k.owed(now), 0, false
			}
		}
		st.out.local = nk
		st.out.faulted.Store(true)
		k = nk
	}
	if n > k.share {
		return Decision{}, "", fmt.Errorf("throttle: acquire %d permit(s): bucket store failed and %d permit(s) exceed this instance's local share of %d per %v (FailLocal)", n, n, k.share, interval)
	}
	return k.take(n, now), "", nil
}

// claimDebt returns what st's key granted locally and has not accounted for
// yet, for a shared call that takes it from the store together with its
// own permits, so that the debt is charged before the call's grant. It
// returns 0 when there is none, or when another call carries it already
// (the debt is charged once). A claim ends with settled (charged) or
// releaseDebt. The caller holds st.out.mu.
func (o *outageKey) claimDebt(now int64) int64 {
	k := o.local
	if k == nil || k.carried {
		return 0
	}
	owed := k.owed(now)
	k.carried, k.claimed = owed > 0, k.total
	return owed
}

// releaseDebt ends a claim whose call did not charge the debt. The caller
// holds st.out.mu.
func (o *outageKey) releaseDebt() {
	if o.local != nil {
		o.local.carried = false
	}
}

// settled forgets the key's local grants up to its claim: the store has
// accounted for them. Grants made locally after the claim (while the call
// that carried it waited for the store) stay owed, as far as they fall in
// the last two intervals (owed), for settle to take. The caller holds
// st.out.mu.
func (o *outageKey) settled() {
	k := o.local
	if k == nil {
		return
	}
	if after := k.total - k.claimed; after > 0 {
		k.carried, k.claimed = false, k.total
		k.capped, k.after = true, after
		return
	}
	o.local = nil
}

// takeOwed removes the key's local share and returns what it still owes,
// for settle; 0 when a call carries the debt (it is left in place). The
// caller holds st.out.mu.
func (o *outageKey) takeOwed(now int64) int64 {
	k := o.local
	if k == nil || k.carried {
		return 0
	}
	o.local = nil
	return k.owed(now)
}

// settle accounts, after an outage, for owed permits key granted locally:
// they are taken from the shared bucket (as many as it has left) before
// the key's shared grants resume. It is called on a shared decision's
// path and is bounded by w's wait as that call is (waiter.storeCall):
// what it cannot settle in time stays unaccounted for (logged).
func (l *Limiter) settle(w *waiter, key string, owed int64) {
	tctx, cancel, _, _ := w.storeCall(w.left())
	defer cancel()
	for try := 0; owed > 0 && try < 8; try++ {
		d, err := l.bucket.Take(tctx, key, owed, 0)
		switch {
		case errors.Is(err, ErrExceedsLimit):
			owed /= 2 // more than the bucket grants at once: take less
		case err != nil:
			l.cfg.logger.Warn("throttle: accounting for the permits granted while the store failed", "key", key, "n", owed, "err", err)
			return
		case d.Granted:
			return
		case d.Remaining > 0 && d.Remaining < owed:
			owed = d.Remaining // take what is left
		default:
			return // nothing left this period: the local grants are covered
		}
	}
}

// The first shared period after an outage. The instances of a fleet find
// the store again at different times (a failover: each client finds the
// promoted master on its own). The first one back would take the whole
// shared period while the others still grant their local shares, and
// their debts, when they come back, would find nothing left to charge:
// the fleet above the limit by the others' shares. So a key that granted
// locally in the outage takes from the store, until the end of the first
// shared period it sees afterwards (or the next: recoveryCap), at most its
// share of the limit less what it owed on its return; after that, the
// shared limit alone decides. When every instance comes back at once, the
// shares add up to the limit less the debts, as without the cap; its cost
// is in [FailLocal]'s doc. A weighted take above the room is refused until
// the cap ends. The cap counts what is taken from the store, a lease's
// batch included (see [Leasing]). Known gap: calls of the key already on
// their way to the store when the first one comes back are not capped
// (during an outage only the probe asks the store, so this matters when
// another key's probe ended the outage).

// recoveryCap is a key's room in its first shared period after an outage.
// When the store's first answer was a refusal (the period it reported is
// spent, or held by a bucket that lost it: bucket.TokenBucket's "lost
// period"), the first period the key can take from is the next one: the
// cap then goes on to next's end, with the share as its room.
type recoveryCap struct {
	until int64 // the period's end, on the Limiter's time base
	room  int64 // permits this instance may still take from the store in it
	next  int64 // the next period's end (0: none), with share as its room
	share int64
}

// newRecoveryCap is the cap after a first shared decision d at now that
// took took permits, for a key whose share is share and which owed owed;
// nil when no cap is due (d tells no period, or the key owed nothing: it
// granted nothing locally in the last two intervals).
func newRecoveryCap(d Decision, now, share, owed, took, interval int64) *recoveryCap {
	if d.Reset <= 0 || share <= 0 || owed <= 0 {
		return nil
	}
	until := addSat(now, d.Reset)
	rc := &recoveryCap{until: until, room: max(share-owed-took, 0)}
	if !d.Granted && interval > 0 {
		rc.next, rc.share = addSat(until, time.Duration(interval)), share
	}
	return rc
}

// holds reports whether the cap still applies at now or later.
func (rc *recoveryCap) holds(now int64) bool { return now < rc.until || now < rc.next }

// reserve reserves n permits of the room before a store call at now. It
// returns the period's end when it did (reserved; give them back with
// unreserve if the call grants nothing), a refusal until the period's end
// when the room is spent, or neither when the cap has ended.
func (rc *recoveryCap) reserve(n, now int64) (refusal Decision, refused bool, reserved int64) {
	if now >= rc.until && now < rc.next {
		rc.until, rc.room, rc.next = rc.next, rc.share, 0
	}
	if now >= rc.until {
		return Decision{}, false, 0
	}
	if rc.room >= n {
		rc.room -= n
		return Decision{}, false, rc.until
	}
	until := rc.until
	if rc.next > 0 && n > rc.share {
		until = rc.next // nor will the next period's room fit n
	}
	return Decision{Delay: time.Duration(until - now), Remaining: 0}, true, 0
}

// unreserve gives back n permits reserved in the period ending at reserved,
// if the cap is still in that period.
func (rc *recoveryCap) unreserve(n, reserved int64) {
	if rc.until == reserved {
		rc.room += n
	}
}
