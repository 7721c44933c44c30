package buckettest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/guarantee"
	"github.com/headway-go/headway/throttle"
)

// hangAfter is how long the suite waits for a call that must return
// before it calls it hung: far above any honest latency, so that it only
// ever catches a call that does not return.
const hangAfter = 10 * time.Second

// maxChain bounds how many refusals in a row the suite follows in real
// time before it gives up on a grant.
const maxChain = 1000

// budget is one fresh budget of the bucket under test, reached through one
// value (New) or two (NewPair). Every decision it sees is checked against
// the rules any decision must keep (see checkDecision).
type budget struct {
	s      *suite
	t      *testing.T
	values []throttle.Bucket

	mu       sync.Mutex
	prepared map[string]bool
	paused   map[string]bool // keys paused by the suite: a paused key's refusal may say anything about what is left
	ahead    map[string]bool // keys asked with maxWait > 0: reservations may hold them beyond the horizon
	reported map[string]int  // rule → violations reported, to keep the log short
}

// fresh returns a budget reached through one value from New.
func (s *suite) fresh(t *testing.T) *budget {
	t.Helper()
	b := s.New(t)
	if b == nil {
		t.Fatalf("Spec.New returned nil")
	}
	return s.newBudget(t, b)
}

// freshPair returns a budget reached through two values from NewPair, or
// through one from New when the Spec has no NewPair.
func (s *suite) freshPair(t *testing.T) *budget {
	t.Helper()
	if s.NewPair == nil {
		return s.fresh(t)
	}
	a, b := s.NewPair(t)
	if a == nil || b == nil {
		t.Fatalf("Spec.NewPair returned a nil bucket")
	}
	return s.newBudget(t, a, b)
}

func (s *suite) newBudget(t *testing.T, values ...throttle.Bucket) *budget {
	return &budget{s: s, t: t, values: values, prepared: map[string]bool{}, paused: map[string]bool{}, ahead: map[string]bool{}, reported: map[string]int{}}
}

// value returns the i-th value of the budget, cycling over the values.
func (b *budget) value(i int) throttle.Bucket { return b.values[i%len(b.values)] }

// prepare calls Spec.PrepareKey for each key not prepared yet. It must be
// called from the test's goroutine.
func (b *budget) prepare(keys ...string) {
	b.t.Helper()
	if b.s.PrepareKey == nil {
		return
	}
	for _, k := range keys {
		b.mu.Lock()
		done := b.prepared[k]
		b.prepared[k] = true
		b.mu.Unlock()
		if !done {
			b.s.PrepareKey(b.t, b.values[0], k)
		}
	}
}

// markPaused notes that the suite paused key.
func (b *budget) markPaused(key string) {
	b.mu.Lock()
	b.paused[key] = true
	b.mu.Unlock()
}

// free reports whether key is neither paused nor possibly reserved
// ahead, so that its decisions say what is left now.
func (b *budget) free(key string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.paused[key] && !b.ahead[key]
}

// take asks value i for n permits of key, with a background context. It
// may be called from any goroutine.
func (b *budget) take(i int, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	return b.takeCtx(context.Background(), i, key, n, maxWait)
}

// takeCtx is take with a context; it checks every decision it returns.
func (b *budget) takeCtx(ctx context.Context, i int, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	if maxWait > 0 {
		// Marked before the call: a decision of another caller that a
		// reservation made by this one affects comes after it.
		b.mu.Lock()
		b.ahead[key] = true
		b.mu.Unlock()
	}
	d, err := b.value(i).Take(ctx, key, n, maxWait)
	if err == nil {
		b.checkDecision(key, n, maxWait, d)
	}
	return d, err
}

// violation reports that a decision broke a rule, at most three times per
// rule and budget. Safe from any goroutine.
func (b *budget) violation(rule, format string, args ...any) {
	b.mu.Lock()
	b.reported[rule]++
	n := b.reported[rule]
	b.mu.Unlock()
	if n <= 3 {
		b.t.Errorf("%s: %s", rule, fmt.Sprintf(format, args...))
	}
}

// checkDecision checks the rules that every decision keeps, whatever the
// bucket and whenever it is asked:
//   - a refusal names a positive Delay; a grant's Delay is within maxWait
//     (0 when the caller would not wait);
//   - Delay, Reset and Limit are never negative, Remaining never below -1
//     nor above Limit;
//   - on a key neither paused nor asked for reservations: a refusal of n
//     does not claim n or more permits remain, and neither a refusal's
//     Delay nor Reset is more than twice the longest a key takes to be
//     full again;
//   - Limit is 0 or one of the limits the Spec states.
func (b *budget) checkDecision(key string, n int64, maxWait time.Duration, d throttle.Decision) {
	s := b.s
	switch {
	case !d.Granted && d.Delay <= 0:
		b.violation("refusal without a delay", "Take(%q, n=%d) refused with Delay %v: a refusal must name when asking again can succeed, or callers poll", key, n, d.Delay)
	case d.Granted && d.Delay > maxWait:
		b.violation("reservation beyond the wait", "Take(%q, n=%d, maxWait=%v) granted with Delay %v: a bucket may reserve at most maxWait ahead", key, n, maxWait, d.Delay)
	case d.Granted && d.Delay < 0:
		b.violation("negative delay", "Take(%q, n=%d) granted with Delay %v", key, n, d.Delay)
	}
	if d.Reset < 0 || d.Limit < 0 || d.Remaining < -1 {
		b.violation("negative field", "Take(%q, n=%d) = %+v: Reset and Limit must be ≥ 0 and Remaining ≥ -1", key, n, d)
	}
	if d.Limit > 0 && d.Remaining > d.Limit {
		b.violation("remaining above limit", "Take(%q, n=%d) = %+v: Remaining above Limit", key, n, d)
	}
	if d.Limit != 0 && !s.limits[d.Limit] {
		b.violation("unknown limit", "Take(%q, n=%d) = %+v: Limit is none of the Spec's limits %v", key, n, d, slices.Collect(maps.Keys(s.limits)))
	}
	if !b.free(key) {
		return
	}
	if !d.Granted && d.Remaining >= n {
		b.violation("refused with enough remaining", "Take(%q, n=%d) refused while Remaining = %d says enough is left", key, n, d.Remaining)
	}
	// Twice the horizon: a bucket may count a permit a little longer
	// than its interval (a token bucket's margin and round trips); this
	// rule is for delays out of all proportion.
	far := 2 * s.horizon
	if !d.Granted && d.Delay > far {
		b.violation("refusal delay beyond the horizon", "Take(%q, n=%d) refused with Delay %v, more than twice the longest a key takes to be full again (%v)", key, n, d.Delay, s.horizon)
	}
	if d.Reset > far {
		b.violation("reset beyond the horizon", "Take(%q, n=%d) = %+v: Reset more than twice the longest a key takes to be full again (%v)", key, n, d, s.horizon)
	}
}

// now reads the clock the bucket decides on.
func (s *suite) now() time.Time {
	if s.Clock != nil {
		return s.Clock.Now()
	}
	return guarantee.Now() // the wall clock: see the package doc's Time
}

// wait lets d pass: the fake clock is moved, real time is slept.
func (s *suite) wait(d time.Duration) {
	if d <= 0 {
		return
	}
	if s.Clock != nil {
		s.Clock.Advance(d)
		return
	}
	time.Sleep(d)
}

// clockStep is how far a pause may end before the suite's reckoning of
// it: nothing on a fake clock; in real time a millisecond, for stores
// whose clock counts whole milliseconds (a Redis server starts a pause
// at the millisecond its clock reads, up to 1 ms before the call).
func (s *suite) clockStep() time.Duration {
	if s.real() {
		return time.Millisecond
	}
	return 0
}

// transient is the longest refusal the suite follows where the contract
// expects a grant, in real time: a bucket may ask a caller to come back
// shortly while something it needs is under way (a refill, a reset a
// moment overdue). In fake time nothing is transient.
func (s *suite) transient() time.Duration {
	if s.real() {
		return s.Interval / 10
	}
	return 0
}

// settle follows refusals of n permits of key through value i, starting
// from d, as long as each is transient (see transient): it returns the
// first grant, or the first refusal that is not transient.
func (b *budget) settle(i int, key string, n int64, d throttle.Decision) (throttle.Decision, error) {
	limit := b.s.transient()
	deadline := time.Now().Add(hangAfter)
	for hops := 0; !d.Granted && d.Delay > 0 && d.Delay <= limit && hops < maxChain && time.Now().Before(deadline); hops++ {
		b.s.wait(d.Delay)
		var err error
		if d, err = b.take(i, key, n, 0); err != nil {
			return d, err
		}
	}
	return d, nil
}

// grant asks value i for n permits of key, which the suite expects to be
// granted now (after transient refusals in real time). It reports a
// failure, with why, and returns false otherwise.
func (b *budget) grant(i int, key string, n int64, why string) (throttle.Decision, bool) {
	b.t.Helper()
	d, err := b.take(i, key, n, 0)
	if err == nil {
		d, err = b.settle(i, key, n, d)
	}
	switch {
	case err != nil:
		b.t.Errorf("Take(%q, n=%d) = %v; want a grant (%s)", key, n, err, why)
		return d, false
	case !d.Granted:
		b.t.Errorf("Take(%q, n=%d) refused (%+v); want a grant (%s)", key, n, d, why)
		return d, false
	}
	return d, true
}

// spend takes one permit of key at a time until refused and returns the
// refusal. A bucket that refills in real time cannot keep up with takes
// back to back for long; one that never refuses fails the test.
func (b *budget) spend(i int, key string) (throttle.Decision, bool) {
	b.t.Helper()
	limit := 4*b.s.Burst + 100
	for range limit {
		d, err := b.take(i, key, 1, 0)
		if err != nil {
			b.t.Errorf("Take(%q, 1) = %v while spending the key", key, err)
			return d, false
		}
		if !d.Granted {
			return d, true
		}
	}
	b.t.Errorf("%d takes of one permit of %q in a row were all granted: the bucket does not limit (Burst %d)", limit, key, b.s.Burst)
	return throttle.Decision{}, false
}

// returns runs f and fails the test if it does not return within
// hangAfter. what names the call.
func returns[T any](t *testing.T, what string, f func() T) T {
	t.Helper()
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	timer := time.NewTimer(hangAfter)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("%s did not return within %v: it hangs", what, hangAfter)
	}
	var zero T
	return zero
}

// result is a Take's answer, for returns.
type result struct {
	d   throttle.Decision
	err error
}

// takeReturns is take through returns.
func (b *budget) takeReturns(ctx context.Context, i int, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	b.t.Helper()
	r := returns(b.t, fmt.Sprintf("Take(%q, n=%d, maxWait=%v)", key, n, maxWait), func() result {
		d, err := b.takeCtx(ctx, i, key, n, maxWait)
		return result{d, err}
	})
	return r.d, r.err
}

// pause pauses key for d through value i (a bucket that pauses).
func (b *budget) pause(i int, key string, d time.Duration) error {
	b.t.Helper()
	p, ok := throttle.BucketAs[throttle.Pauser](b.value(i))
	if !ok {
		b.t.Fatalf("%T does not pause", b.value(i))
	}
	b.markPaused(key)
	return returns(b.t, fmt.Sprintf("Pause(%q, %v)", key, d), func() error {
		return p.Pause(context.Background(), key, d)
	})
}

// isInvalid reports whether err wraps throttle.ErrInvalid.
func isInvalid(err error) bool { return errors.Is(err, throttle.ErrInvalid) }
