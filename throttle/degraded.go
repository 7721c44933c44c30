package throttle

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"time"
)

// FailLocal's degraded mode. While the store fails, each instance paces
// its own grants of a key, evenly, at its share of the key's limit:
// limit ÷ live instances per interval, one slot every
// interval·instances/limit. Evenly spaced slots put at most the share in
// any span of one interval, however the shared bucket aligns its periods,
// so the fleet grants at most the limit per interval (a sliding limit
// included) while the store is down. A take of n permits fills n slots and
// is granted when the last of them has come.
//
// Where the pacing starts is what keeps the fleet from doubling at the
// outage's edges:
//
//   - The period running when the store failed may have granted most of
//     the limit already. The key's last shared decision says how much was
//     left (Remaining) and when the period ends (Reset): the instance
//     takes at most its share of what was left, by starting its slots
//     that many slots before the period's end.
//   - If the last decision is older than that period (an idle key, or an
//     instance that was refused until the period ended), the current
//     period's grants are unknown: the instance assumes them all used, and
//     starts one interval after the store failed, when any period begun
//     before the failure has ended.
//   - When the store answers again, the permits granted locally in the
//     last two intervals are taken from the shared bucket (as far as it
//     has them) before the key's next shared grant is handed out.
//
// The limit is the key's own, as its last shared decision reported it (a
// limit set live per key stays in force); a key never seen uses the
// bucket's ([Fallbacker]). The instance count is the bucket's: the Redis
// buckets report the largest count they saw when they have not heard from
// the store recently. A share below one permit per interval (more
// instances than the limit) is refused: evenly spread single permits
// could still meet in one interval.
//
// What stays unbounded without a store: an outage seen by one instance
// only (a network partition) lets the others go on sharing the full limit
// while it grants its share; the fleet then grants up to limit·(1 + 1/k).

// seenDecision is a key's last shared decision.
type seenDecision struct {
	limit     int64
	remaining int64 // -1 unknown
	end       int64 // ns since the failover's epoch: the period's end
}

// seenDecisions remembers the last shared decision of each key, in shards.
type seenDecisions struct {
	seed   maphash.Seed
	shards [localShards]seenShard
}

type seenShard struct {
	mu    sync.Mutex
	m     map[string]seenDecision
	sweep int
}

func (s *seenDecisions) init() {
	s.seed = maphash.MakeSeed()
	for i := range s.shards {
		s.shards[i].m = make(map[string]seenDecision)
		s.shards[i].sweep = 64
	}
}

// note records d, a shared decision made at now, for key. When the shard
// has grown, it forgets the keys whose period has ended, except those
// whose limit is below base() (the bucket's own, see [Fallbacker]): a
// limit lowered live for a key must outlast an idle spell of the key,
// or an outage would give the key the bucket's limit.
func (s *seenDecisions) note(key string, d Decision, now int64, base func() int64) {
	if d.Reset <= 0 {
		return
	}
	sh := &s.shards[maphash.String(s.seed, key)%localShards]
	sh.mu.Lock()
	if len(sh.m) >= sh.sweep {
		b := base()
		for k, v := range sh.m {
			if v.end < now && !(v.limit > 0 && v.limit < b) {
				delete(sh.m, k)
			}
		}
		sh.sweep = max(64, 2*len(sh.m))
	}
	sh.m[key] = seenDecision{limit: d.Limit, remaining: d.Remaining, end: now + int64(d.Reset)}
	sh.mu.Unlock()
}

func (s *seenDecisions) get(key string) (seenDecision, bool) {
	sh := &s.shards[maphash.String(s.seed, key)%localShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	v, ok := sh.m[key]
	return v, ok
}

// degradedKey is one key's pacer while the store is down, and what it
// granted, for the account at recovery.
type degradedKey struct {
	emission int64 // ns per permit
	share    int64 // permits per interval
	tat      int64 // next free slot, ns since epoch
	interval int64
	// Before until (the end of the shared period running when the store
	// failed), at most budget permits: this instance's share of what that
	// period had left.
	until, budget int64
	// granted counts local grants in the interval-long window starting at
	// winStart and in the one before it.
	winStart      int64
	granted, prev int64
	// outage is the downSince of the outage the pace was set in: a key
	// left unsettled from an earlier outage starts afresh in the next.
	outage int64
	// carried: a shared call is taking these grants from the store along
	// with its own permits (see claimDebt); nobody else charges them.
	carried bool
	// total counts every local grant of the key; claimed is total when
	// the carried debt was claimed. A call sent while the store was down
	// (a probe) claims what was granted until it was sent; what is
	// granted while it waits for the store is still owed when it returns:
	// at most after (when capped), the latest of the grants the windows
	// count.
	total, claimed int64
	capped         bool
	after          int64
}

func (k *degradedKey) count(now, n int64) {
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

// owed is what key granted locally in (about) the last two intervals and
// has not accounted for yet.
func (k *degradedKey) owed(now int64) int64 {
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

func (f *failover) now(l *Limiter) int64 { return int64(l.cfg.clock.Since(f.epoch)) }

// localTake is FailLocal's decision for n permits of key: granted now, or
// refused with the delay until this instance's next slot. ok is false when
// no share is known (the Limiter then fails closed); err is set when n is
// above one share.
func (l *Limiter) localTake(key string, n int64) (d Decision, ok bool, err error) {
	fb, isFB := l.bucket.(Fallbacker)
	if !isFB {
		return Decision{}, false, nil
	}
	limit, interval, inst := fb.Fallback()
	f := &l.fail
	seen, wasSeen := f.seen.get(key)
	if wasSeen && seen.limit > 0 {
		limit = seen.limit // the key's own limit, live ones included
	}
	if limit < 1 || interval <= 0 || inst < 1 || limit < inst {
		return Decision{}, false, nil
	}
	iv := interval.Nanoseconds()
	now := f.now(l)
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.local[key]
	down := f.downSince.Load()
	if share := limit / inst; k == nil || k.share != share || k.interval != iv || k.outage != down {
		em := ceilDiv(iv, share)
		if share > 0 && iv/share > (1<<62)/max(inst, 1) {
			return Decision{}, false, nil
		}
		nk := &degradedKey{emission: em, share: share, interval: iv, tat: max(down+iv, now), winStart: now, outage: down}
		if wasSeen && seen.end > down {
			// The period of the last shared decision was still running
			// when the store failed: this instance's share of what it had
			// left, before its end. (Otherwise that period's grants are
			// unknown: nothing until any period begun before the failure
			// has ended.)
			nk.tat, nk.until, nk.budget = now, seen.end, max(seen.remaining, 0)/inst
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
		} else {
			if f.local == nil {
				f.local = make(map[string]*degradedKey)
			}
			f.pending.Add(1)
		}
		f.local[key] = nk
		k = nk
	}
	if n > k.share {
		return Decision{}, true, fmt.Errorf("throttle: acquire %d permit(s): bucket store failed and %d permit(s) exceed this instance's local share of %d per %v", n, n, k.share, interval)
	}
	// A take of n fills n slots: it is granted when the last of them has
	// come (tat is the first free one), and the next take starts after
	// them. Granted at the first slot instead, takes of 3 with a share of
	// 5 came 3 slots apart: 6 permits in one interval.
	next := k.tat + (n-1)*k.emission
	if now < k.until && k.budget < n {
		next = max(next, k.until) // this instance's part of the running period is spent
	}
	if next > now {
		return Decision{Delay: time.Duration(next - now), Remaining: -1}, true, nil
	}
	if now < k.until {
		k.budget -= n
	}
	k.tat = now + n*k.emission
	k.count(now, n)
	return Decision{Granted: true, Remaining: -1}, true, nil
}

// claimDebt returns what key granted locally and has not accounted for
// yet, for a shared call that takes it from the store together with its
// own permits, so that the debt is charged before the call's grant. It
// returns 0 when there is none, or when another call carries it already
// (the debt is charged once). A claim ends with settled (charged) or
// releaseDebt.
func (l *Limiter) claimDebt(key string) int64 {
	f := &l.fail
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.local[key]
	if k == nil || k.carried {
		return 0
	}
	owed := k.owed(f.now(l))
	k.carried, k.claimed = owed > 0, k.total
	return owed
}

// releaseDebt ends a claim of claimDebt whose call did not charge the debt.
func (l *Limiter) releaseDebt(key string) {
	f := &l.fail
	f.mu.Lock()
	defer f.mu.Unlock()
	if k := f.local[key]; k != nil {
		k.carried = false
	}
}

// settled forgets key's local grants up to its claim: the store has
// accounted for them. Grants made locally after the claim (while the call
// that carried it waited for the store) stay owed, as far as they fall in
// the last two intervals (owed), for settle to take.
func (l *Limiter) settled(key string) {
	f := &l.fail
	f.mu.Lock()
	defer f.mu.Unlock()
	k, ok := f.local[key]
	if !ok {
		return
	}
	if after := k.total - k.claimed; after > 0 {
		k.carried, k.claimed = false, k.total
		k.capped, k.after = true, after
		return
	}
	delete(f.local, key)
	f.pending.Add(-1)
}

// settle accounts, after an outage, for what key granted locally: those
// permits are taken from the shared bucket (as many as it has left) before
// the key's shared grants resume. It is called on a shared decision's
// path, only while some key has local grants to account for, and is
// bounded by what is left of the caller's wait (left, noWait, of which the
// caller's own store call took elapsed) as that call is: what it cannot
// settle in time stays unaccounted for (logged).
func (l *Limiter) settle(ctx context.Context, key string, left time.Duration, noWait bool, elapsed time.Duration) {
	f := &l.fail
	f.mu.Lock()
	k := f.local[key]
	if k == nil || k.carried {
		f.mu.Unlock()
		return
	}
	delete(f.local, key)
	f.pending.Add(-1)
	owed := k.owed(f.now(l))
	f.mu.Unlock()
	timeout := f.timeout
	switch {
	case noWait && timeout > 0:
		timeout = max(timeout-elapsed, minStoreCall)
	case !noWait && left != Forever:
		left = max(left-elapsed, 0)
	}
	tctx, cancel, _, _ := boundStoreCall(ctx, left, noWait, timeout)
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
// shared period it sees afterwards, at most its share of the limit less
// what it owed on its return (if the store's first answer refused it, the
// period it reported is one it cannot take from: the cap goes on through
// the next, with the share as its room); after that, the shared limit
// alone decides. When every instance comes back at once, the shares add up
// to the limit less the debts, as without the cap. Cost: an instance is
// held to its share even when the others do not use theirs; with demand
// on one instance of k, it gets 1/k of the limit in that period (or two).
// A weighted take above the room is refused until the cap ends. Known
// gap: calls of the key already on their way to the store when the first
// one comes back are not capped (during an outage only the probe asks the
// store, so this matters when another key's probe ended the outage).

// recoveryCap is a key's room in its first shared period after an outage.
// When the store's first answer was a refusal (the period it reported is
// spent, or held by a bucket that lost it: bucket.TokenBucket's "lost
// period"), the first period the key can take from is the next one: the
// cap then goes on to next's end, with the share as its room.
type recoveryCap struct {
	until int64 // ns since the failover's epoch: the period's end
	room  int64 // permits this instance may still take from the store in it
	next  int64 // the next period's end (0: none), with share as its room
	share int64
}

// localOwed returns what key owes for its local grants of the outage, and
// its share of the limit and the interval (ns) then; ok is false when it
// granted nothing locally.
func (l *Limiter) localOwed(key string) (owed, share, interval int64, ok bool) {
	f := &l.fail
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.local[key]
	if k == nil {
		return 0, 0, 0, false
	}
	return k.owed(f.now(l)), k.share, k.interval, true
}

// startRecovery caps key's shared grants until the end of the period d
// reports (see recoveryCap): share, less owed and the took permits d
// granted. A key that owes nothing (it granted nothing locally in the last
// two intervals: idle since the outage, or only refused then) is not
// capped, and a cap already running is left as it is (calls of the key
// have reserved from it).
func (l *Limiter) startRecovery(key string, d Decision, share, owed, took, interval int64) {
	if d.Reset <= 0 || share <= 0 || owed <= 0 {
		return
	}
	f := &l.fail
	now := f.now(l)
	f.mu.Lock()
	defer f.mu.Unlock()
	if rc := f.recovering[key]; rc != nil && now < rc.until {
		return
	}
	if f.recovering == nil {
		f.recovering = make(map[string]*recoveryCap)
	}
	if _, ok := f.recovering[key]; !ok {
		f.recoveringN.Add(1)
	}
	until := now + int64(d.Reset)
	rc := &recoveryCap{until: until, room: max(share-owed-took, 0)}
	if !d.Granted && interval > 0 {
		rc.next, rc.share = until+interval, share
	}
	f.recovering[key] = rc
	f.recoveryEnd = max(f.recoveryEnd, until, rc.next)
}

// reserveRecovery reserves n permits of key's room in its first shared
// period after an outage, before its store call. It returns the period's
// end when it did (reserved, 0 otherwise: give them back with
// unreserveRecovery if the call grants nothing), or a refusal until the
// period's end when the room is spent.
func (l *Limiter) reserveRecovery(key string, n int64) (refusal Decision, refused bool, reserved int64) {
	f := &l.fail
	now := f.now(l)
	f.mu.Lock()
	defer f.mu.Unlock()
	if now >= f.recoveryEnd {
		// Every cap has run out: forget them all at once (keys that
		// are not called again would stay otherwise, and keep the hot
		// path taking this lock).
		clear(f.recovering)
		f.recoveringN.Store(0)
		return Decision{}, false, 0
	}
	rc := f.recovering[key]
	switch {
	case rc == nil:
		return Decision{}, false, 0
	case now >= rc.until && now < rc.next:
		rc.until, rc.room, rc.next = rc.next, rc.share, 0
	case now >= rc.until:
		delete(f.recovering, key)
		f.recoveringN.Add(-1)
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

// unreserveRecovery gives back n permits that reserveRecovery reserved in
// the period ending at reserved, if the cap is still in that period.
func (l *Limiter) unreserveRecovery(key string, n, reserved int64) {
	f := &l.fail
	f.mu.Lock()
	defer f.mu.Unlock()
	if rc := f.recovering[key]; rc != nil && rc.until == reserved {
		rc.room += n
	}
}
