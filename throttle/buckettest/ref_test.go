package buckettest_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/headway-go/headway/throttle"
	"github.com/jonboulle/clockwork"
)

// bug is a defect a reference bucket can be built with, to show that the
// suite catches it.
type bug int

const (
	correct         bug = iota
	overAdmit           // grants one permit beyond the burst
	zeroDelay           // refuses with Delay 0
	shortDelay          // refuses with half the Delay needed
	partialCharge       // a refused take spends what is left
	sharedKeys          // every key shares one budget
	truncatedKeys       // keys are told apart by their first 64 bytes only
	noExceeds           // n above the burst is refused with a Delay
	acceptsZero         // n < 1 is granted
	remainingOff        // Remaining is one too many
	pauseShortens       // a shorter pause replaces a longer one
	pauseOverflows      // a pause is not clamped: a long one overflows into none
	refundNaive         // a refund moves the state back, whichever permits it returns
	racy                // check and update are not atomic
	ignoresCtx          // a Take whose context ended is decided anyway
	fastRate            // refills 30 % faster than stated
	rootRacy            // racy for the bucket's own key "" only
	sweepsLive          // with more than 1000 keys, forgets them all, spent or not
	unlimitedBraces     // a key holding '{' is never limited
	shortTTL            // forgets a key idle for one emission interval, full or not
	pauseRefills        // a pause leaves the key full when it ends
)

var bugNames = map[bug]string{
	correct: "correct", overAdmit: "overAdmit", zeroDelay: "zeroDelay", shortDelay: "shortDelay",
	partialCharge: "partialCharge", sharedKeys: "sharedKeys", truncatedKeys: "truncatedKeys",
	noExceeds: "noExceeds", acceptsZero: "acceptsZero", remainingOff: "remainingOff",
	pauseShortens: "pauseShortens", pauseOverflows: "pauseOverflows", refundNaive: "refundNaive",
	racy: "racy", ignoresCtx: "ignoresCtx", fastRate: "fastRate",
	rootRacy: "rootRacy", sweepsLive: "sweepsLive", unlimitedBraces: "unlimitedBraces",
	shortTTL: "shortTTL", pauseRefills: "pauseRefills",
}

func (b bug) String() string { return bugNames[b] }

// ref is a plain GCRA bucket (a token bucket of capacity burst refilled
// continuously at limit per interval) with reservations, pauses and
// refunds, written for these tests: as a user would write a bucket,
// behind one mutex, on a clockwork clock.
type ref struct {
	bug      bug
	clock    clockwork.Clock
	limit    int64
	burst    int64
	emission time.Duration

	mu     sync.Mutex
	tats   map[string]int64 // key → theoretical arrival time, ns on clock
	pauses map[string]int64 // key → end of its pause, ns on clock
	seen   map[string]int64 // shortTTL: key → its last take, ns on clock
	racyMu sync.Mutex       // racy: guards the maps only, not the decision
}

func newRef(clock clockwork.Clock, limit, burst int64, interval time.Duration, b bug) *ref {
	em := interval / time.Duration(limit)
	if b == fastRate {
		em = em * 10 / 13
	}
	return &ref{bug: b, clock: clock, limit: limit, burst: burst, emission: em, tats: map[string]int64{}, pauses: map[string]int64{}, seen: map[string]int64{}}
}

func (r *ref) now() int64 { return r.clock.Now().UnixNano() }

func (r *ref) id(key string) string {
	switch {
	case r.bug == sharedKeys:
		return ""
	case r.bug == truncatedKeys && len(key) > 64:
		return key[:64]
	}
	return key
}

// Take implements throttle.Bucket.
func (r *ref) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	if err := ctx.Err(); err != nil && r.bug != ignoresCtx {
		return throttle.Decision{}, err
	}
	if n < 1 {
		if r.bug == acceptsZero {
			return throttle.Decision{Granted: true, Remaining: -1}, nil
		}
		return throttle.Decision{}, fmt.Errorf("ref: n = %d: %w", n, throttle.ErrInvalid)
	}
	if n > r.burst && r.bug != noExceeds {
		return throttle.Decision{}, fmt.Errorf("ref: n = %d above burst %d: %w", n, r.burst, throttle.ErrExceedsLimit)
	}
	n = min(n, 1<<20) // noExceeds: keep the arithmetic finite
	id := r.id(key)
	if r.bug == unlimitedBraces && strings.Contains(key, "{") {
		return throttle.Decision{Granted: true, Limit: r.limit, Remaining: r.limit}, nil
	}
	if r.bug == racy || r.bug == rootRacy && key == "" {
		// The decision reads and writes the state in separate steps.
		r.racyMu.Lock()
		tat, pause := r.tats[id], r.pauses[id]
		r.racyMu.Unlock()
		runtime.Gosched()
		d, next := r.decide(tat, pause, n, maxWait)
		if d.Granted {
			r.racyMu.Lock()
			r.tats[id] = next
			r.racyMu.Unlock()
		}
		return d, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.bug == sweepsLive && len(r.tats) > 1000:
		clear(r.tats)
	case r.bug == shortTTL:
		if now := r.now(); now-r.seen[id] > int64(r.emission) {
			delete(r.tats, id)
		}
		r.seen[id] = r.now()
	}
	d, next := r.decide(r.tats[id], r.pauses[id], n, maxWait)
	if d.Granted || r.bug == partialCharge && n > 1 {
		r.tats[id] = next
	}
	return d, nil
}

// decide is GCRA on a theoretical arrival time and a pause's end.
func (r *ref) decide(tat, pause, n int64, maxWait time.Duration) (throttle.Decision, int64) {
	now := r.now()
	em := int64(r.emission)
	tol := r.burst * em
	if r.bug == overAdmit {
		tol += em
	}
	t := max(tat, now, pause) // a pause moves every slot to its end or later
	next := t + n*em
	wait := max(next-tol-now, pause-now)
	remaining := min(max(0, (now+tol-t)/em), r.limit)
	if wait > 0 && time.Duration(wait) > maxWait {
		d := throttle.Decision{Delay: time.Duration(wait), Limit: r.limit, Remaining: remaining, Reset: time.Duration(t - now)}
		switch r.bug {
		case zeroDelay:
			d.Delay = 0
		case shortDelay:
			d.Delay /= 2
		}
		if r.bug == partialCharge {
			return d, now + tol // what was left is gone
		}
		return d, tat
	}
	rem := min(max(0, (now+tol-next)/em), r.limit)
	if r.bug == remainingOff {
		rem = min(rem+1, r.limit)
	}
	return throttle.Decision{Granted: true, Delay: time.Duration(max(wait, 0)), Limit: r.limit, Remaining: rem, Reset: time.Duration(next - now)}, next
}

// Pause is the optional Pause of throttle.Bucket.
func (r *ref) Pause(_ context.Context, key string, d time.Duration) error {
	if r.bug != pauseOverflows {
		d = min(d, throttle.MaxPause)
	}
	if d <= 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	id := r.id(key)
	until := r.now() + int64(d) // pauseOverflows: wraps negative for Forever
	if until > r.pauses[id] || r.bug == pauseShortens {
		r.pauses[id] = until
	}
	if r.bug == pauseRefills {
		delete(r.tats, id)
	}
	return nil
}

// Refund is the optional Refund of throttle.Bucket and, like throttle.Local's, gives
// nothing back: Refund does not say which permits come back, and moving
// the state back frees the slots of permits granted since (to another
// caller, under concurrency), which the suite catches (see refundNaive).
func (r *ref) Refund(_ context.Context, key string, n int64) error {
	if n < 1 || r.bug != refundNaive {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	id := r.id(key)
	r.tats[id] = max(r.tats[id]-n*int64(r.emission), r.now())
	return nil
}
