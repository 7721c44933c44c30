package buckettest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/headway-go/headway/throttle"
)

// checkRefusalDelay: once a key is spent, a refusal names a positive
// Delay, and asking again after it succeeds: on a fake clock at the very
// first try, in real time after at most transient refusals (a bucket may
// ask to come back shortly while a refill or reset it needs is under
// way).
func checkRefusalDelay(t *testing.T, s *suite) {
	b := s.fresh(t)
	const key = "delay"
	b.prepare(key)
	if _, ok := b.grant(0, key, s.Burst, "a fresh key grants Burst"); !ok {
		return
	}
	ref, ok := b.spend(0, key)
	if !ok || ref.Delay <= 0 { // a refusal without a delay is reported by the budget
		return
	}
	s.wait(ref.Delay)
	d, err := b.take(0, key, 1, 0)
	if err != nil {
		t.Fatalf("Take after the refusal's Delay = %v", err)
	}
	if !d.Granted && !s.real() {
		t.Fatalf("asked again %v after a refusal, as its Delay said: refused again (%+v); Delay must be a time after which asking can succeed", ref.Delay, d)
	}
	if d, err = b.settle(0, key, 1, d); err != nil || !d.Granted {
		t.Fatalf("asked again %v after a refusal, as its Delay said: %+v, %v; want a grant, or only short refusals (≤ %v) before one", ref.Delay, d, err, s.transient())
	}
}

// checkAllOrNothing: a take of n when fewer than n are left is refused and
// charges nothing. Two fresh keys are driven alike, except that one also
// gets a take too large for what it has left; from then on both must
// answer alike.
func checkAllOrNothing(t *testing.T, s *suite) {
	// With Burst 1 every take is of one permit: the key is spent, and the
	// extra take, of one, must charge nothing just the same.
	pre, extra := s.Burst-1, int64(2)
	if s.Burst == 1 {
		pre, extra = 1, 1
	}
	for attempt := 0; ; attempt++ {
		b := s.fresh(t)
		x, y := fmt.Sprintf("x%d", attempt), fmt.Sprintf("y%d", attempt)
		b.prepare(x, y)
		for _, k := range []string{x, y} {
			if _, ok := b.grant(0, k, pre, "a fresh key grants Burst"); !ok {
				return
			}
		}
		d, err := b.take(0, y, extra, 0)
		if err != nil {
			t.Fatalf("Take(%q, n=%d) with %d of %d permits taken = %v; want a refusal", y, extra, pre, s.Burst, err)
		}
		if d.Granted {
			if s.real() && attempt < 5 {
				continue // the budget refilled meanwhile; try again
			}
			t.Fatalf("Take(%q, n=%d) with %d of %d permits taken was granted (%+v): more than the burst at once", y, extra, pre, s.Burst, d)
		}
		// Both keys are now in the same state, if the refusal charged
		// nothing. (x is asked first: in real time it has had less time
		// to refill than y will have.)
		dx, errx := b.take(0, x, 1, 0)
		dy, erry := b.take(0, y, 1, 0)
		if errx != nil || erry != nil {
			t.Fatalf("Take(1) after the refusal: %v, %v", errx, erry)
		}
		if dx.Granted && !dy.Granted {
			t.Fatalf("after a refused take of %d, the key refuses 1 (%+v) that a key without that refusal grants (%+v): the refusal charged permits", extra, dy, dx)
		}
		if s.real() || dx.Granted {
			return
		}
		// On a fake clock a key that refuses both (a pacer, or Burst 1)
		// must name the same delay for both, and grant both after it.
		if dx.Delay != dy.Delay {
			t.Fatalf("after a refused take of %d, the key names Delay %v where a key without that refusal names %v: the refusal charged permits", extra, dy.Delay, dx.Delay)
		}
		s.wait(dx.Delay)
		gx, _ := b.take(0, x, 1, 0)
		gy, _ := b.take(0, y, 1, 0)
		if gx.Granted != gy.Granted {
			t.Fatalf("after a refused take of %d and the Delay %v: the key answers %+v, one without that refusal %+v", extra, dx.Delay, gy, gx)
		}
		return
	}
}

// trickyKeys returns keys that a store must keep apart: the bucket's own
// "", case and space variants, the characters of Redis Cluster hash tags
// and of escapings, separators, unicode, bytes that are not UTF-8, and
// two pairs of keys of the maximum length that differ in their first or
// last byte only.
func trickyKeys(maxLen int) []string {
	keys := []string{
		"", "a", "A", "a ", " a", "b",
		"{", "}", "{}", "}{", "{a}", "a{b}c", "{a", "a}", "{{a}}",
		"%", "%25", "%7B", "%7D", "a%7Bb", "a{b", "%2F", "a%2Fb",
		"/", "a/b", "//", ":", "a:b", "*", "?", "[a]", "\\",
		"é", "e\u0301", "日本語", "🙂", "\x00", "a\x00b", "\n", "\t", "\xff\xfe",
		"tenant-1", "tenant-10",
	}
	long := func(first, last byte) string {
		const unit = "{}/%é日"
		body := strings.Repeat(unit, maxLen/len(unit)+1)
		return string(first) + body[:maxLen-2] + string(last)
	}
	return append(keys, long('a', 'a'), long('a', 'b'), long('b', 'a'))
}

// checkKeysIndependent: every key has its own budget, and every key is
// limited. Each of many tricky keys, then of many plain ones (enough for
// an in-memory bucket to sweep its maps), grants a whole Burst while all
// the keys before it are spent; then each is asked for one permit more.
// Each key's permits are judged on their own against the guarantee.
func checkKeysIndependent(t *testing.T, s *suite) {
	b := s.fresh(t)
	keys := trickyKeys(s.maxKey)
	plain := 2000 // enough for an in-memory bucket to sweep its maps
	if s.real() {
		plain = 10 // a store's: each key may need something running (a resetter)
	}
	for i := range plain {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	b.prepare(keys...)
	got := make([]*recorder, len(keys))
	for i, k := range keys {
		why := "a key whose budget nobody has touched"
		if i > 0 {
			why += fmt.Sprintf(", after the keys before it were spent (%d keys, the last %q): it shares a budget with one of them", i, keys[i-1])
		}
		lo := s.now()
		d, ok := b.grant(0, k, s.Burst, why)
		if !ok {
			return
		}
		got[i] = &recorder{}
		got[i].add(lo.Add(d.Delay), s.now().Add(d.Delay), s.Burst)
	}
	for i, k := range keys {
		b.do(0, k, ask{n: 1}, got[i])
	}
	aside, all := 0, 0
	for i, k := range keys {
		aside += s.judge(t, fmt.Sprintf("key %.40q", k), got[i], s.Burst == 1)
		all += len(got[i].permits)
		if t.Failed() {
			return
		}
	}
	t.Logf("%d keys, %d permits judged; %d set aside from the timed check, their Take having taken more than a tenth of the interval", len(keys), all, aside)
}

// checkLongKey: a key longer than MaxKeyLen is refused with an error
// wrapping throttle.ErrInvalidKey and throttle.ErrInvalid that names the
// key, by Take and Pause, never cut short or sent on to the store.
func checkLongKey(t *testing.T, s *suite) {
	b := s.fresh(t)
	if s.MaxKeyLen == 0 {
		k := strings.Repeat("k", 64<<10)
		b.prepare(k)
		b.grant(0, k, s.Burst, "a key of 64 KiB, where Spec.MaxKeyLen sets no maximum")
		return
	}
	base := strings.Repeat("k", s.MaxKeyLen)
	for _, k := range []string{base + "x", base + "y", base + base} {
		d, err := b.takeReturns(context.Background(), 0, k, 1, 0)
		if !isInvalid(err) || !errors.Is(err, throttle.ErrInvalidKey) || !strings.Contains(err.Error(), "key") {
			t.Errorf("Take(key of %d bytes, MaxKeyLen %d) = %+v, %v; want an error wrapping throttle.ErrInvalidKey and throttle.ErrInvalid that names the key", len(k), s.MaxKeyLen, d, err)
		}
		if _, ok := throttle.BucketAs[throttle.Pauser](b.value(0)); ok {
			if err := b.pause(0, k, time.Second); !isInvalid(err) || !errors.Is(err, throttle.ErrInvalidKey) {
				t.Errorf("Pause(key of %d bytes, MaxKeyLen %d) = %v; want an error wrapping throttle.ErrInvalidKey and throttle.ErrInvalid", len(k), s.MaxKeyLen, err)
			}
		}
	}
	// The longest key allowed is a key like any other.
	b.prepare(base)
	b.grant(0, base, s.Burst, fmt.Sprintf("a key of exactly MaxKeyLen = %d bytes", s.MaxKeyLen))
}

// checkExceedsLimit: n above the burst fails at once with an error
// wrapping throttle.ErrExceedsLimit, whatever the wait the caller allows,
// on a fresh key and on a spent one of a budget that never saw such a
// take (a refusal would make a Limiter wait in vain), and charges
// nothing.
func checkExceedsLimit(t *testing.T, s *suite) {
	const key = "big"
	tooMany := func(b *budget, when string) {
		t.Helper()
		for _, c := range []struct {
			n       int64
			maxWait time.Duration
		}{
			{s.Burst + 1, 0},
			{s.Burst + 1, throttle.Forever},
			{2*s.Burst + 7, s.Interval},
			{math.MaxInt64, throttle.Forever},
		} {
			d, err := b.takeReturns(context.Background(), 0, key, c.n, c.maxWait)
			if !errors.Is(err, throttle.ErrExceedsLimit) {
				t.Errorf("%s: Take(n=%d, maxWait=%v) with Burst %d = %+v, %v; want an error wrapping throttle.ErrExceedsLimit (waiting cannot help)",
					when, c.n, c.maxWait, s.Burst, d, err)
			}
		}
	}
	b := s.fresh(t)
	b.prepare(key)
	tooMany(b, "on a fresh key")
	// The errors charged nothing: the whole burst is still there.
	b.grant(0, key, s.Burst, "a fresh key grants Burst after takes of too many permits, which must charge nothing")

	b = s.fresh(t)
	b.prepare(key)
	if _, ok := b.grant(0, key, s.Burst, "a fresh key grants Burst"); ok {
		tooMany(b, "on a spent key")
	}
}

// checkInvalidN: n < 1 fails with an error wrapping throttle.ErrInvalid and
// charges nothing.
func checkInvalidN(t *testing.T, s *suite) {
	b := s.fresh(t)
	const key = "n"
	b.prepare(key)
	for _, n := range []int64{0, -1, math.MinInt64} {
		for _, mw := range []time.Duration{0, throttle.Forever} {
			d, err := b.takeReturns(context.Background(), 0, key, n, mw)
			if !isInvalid(err) {
				t.Errorf("Take(n=%d, maxWait=%v) = %+v, %v; want an error wrapping throttle.ErrInvalid", n, mw, d, err)
			}
		}
	}
	b.grant(0, key, s.Burst, "a fresh key grants Burst after takes of n < 1, which must charge nothing")
}

// checkDecisionFields: besides the rules every decision keeps (see
// budget.checkDecision), the first grant of n on a fresh key reports
// Remaining = min(Burst − n, Limit) when it reports it at all, and a
// refusal of one permit reports none left.
func checkDecisionFields(t *testing.T, s *suite) {
	b := s.fresh(t)
	ns := []int64{1}
	if s.Burst > 2 {
		ns = append(ns, s.Burst/2)
	}
	if s.Burst > 1 {
		ns = append(ns, s.Burst)
	}
	for i, n := range ns {
		key := fmt.Sprintf("f%d", i)
		b.prepare(key)
		d, ok := b.grant(0, key, n, "a fresh key grants up to Burst")
		if !ok {
			return
		}
		want := min(s.Burst-n, s.Limit)
		if d.Remaining != -1 && d.Remaining != want {
			t.Errorf("first Take(n=%d) of a fresh key = %+v; want Remaining %d (Burst %d, Limit %d) or -1 (unknown)", n, d, want, s.Burst, s.Limit)
		}
		if d.Delay != 0 {
			t.Errorf("first Take(n=%d, maxWait=0) of a fresh key = %+v; want Delay 0", n, d)
		}
	}
	ref, ok := b.spend(0, "f0")
	if ok && ref.Remaining != 0 && ref.Remaining != -1 {
		t.Errorf("refusal of one permit = %+v; want Remaining 0 (or -1, unknown)", ref)
	}
}

// pauseLong is a pause the suite never waits for: long enough that any
// check after it, however slow the machine, runs well within it.
const pauseLong = time.Hour

// checkPauseShared: a pause through one value holds every value sharing
// the budget (both values of NewPair): a take is refused for the pause
// left, or, if the bucket reserves, granted for after the pause only. It
// holds the paused key only.
func checkPauseShared(t *testing.T, s *suite) {
	b := s.freshPair(t)
	const key = "p"
	others := []string{"q0", "q1"}
	b.prepare(key)
	b.prepare(others...)
	start := s.now()
	if err := b.pause(0, key, pauseLong); err != nil {
		t.Fatalf("Pause(%q, %v) = %v", key, pauseLong, err)
	}
	for i := range b.values {
		for _, mw := range []time.Duration{0, throttle.Forever} {
			d, err := b.take(i, key, 1, mw)
			left := pauseLong - s.now().Sub(start) - s.clockStep()
			switch {
			case err != nil:
				t.Errorf("value %d: Take(%q, maxWait=%v) during a pause = %v", i, key, mw, err)
			case d.Delay < left:
				t.Errorf("value %d: Take(%q, maxWait=%v) during a pause with at least %v left = %+v; want refused, or granted for after the pause", i, key, mw, left, d)
			case !d.Granted && d.Delay > pauseLong+time.Millisecond:
				t.Errorf("value %d: Take(%q) during a pause of %v = %+v; want a Delay of the pause left", i, key, pauseLong, d)
			}
		}
		b.grant(i, others[i], 1, "a key nobody paused")
	}
}

// checkPauseNotShortened: a shorter pause, through either value, never
// shortens a longer one.
func checkPauseNotShortened(t *testing.T, s *suite) {
	b := s.freshPair(t)
	const key = "p"
	b.prepare(key)
	start := s.now()
	if err := b.pause(0, key, pauseLong); err != nil {
		t.Fatalf("Pause(%v) = %v", pauseLong, err)
	}
	for _, d := range []time.Duration{time.Nanosecond, time.Millisecond, s.Interval} {
		if err := b.pause(len(b.values)-1, key, d); err != nil {
			t.Fatalf("Pause(%v) = %v", d, err)
		}
	}
	for i := range b.values {
		d, err := b.take(i, key, 1, 0)
		if left := pauseLong - s.now().Sub(start) - s.clockStep(); err != nil || d.Granted || d.Delay < left {
			t.Errorf("value %d: Take after Pause(%v) then shorter pauses = %+v, %v; want refused for at least the %v left of the longer pause", i, pauseLong, d, err, left)
		}
	}
}

// checkPauseEnds: a pause refuses for its length, and asking again after
// the Delay it names succeeds.
func checkPauseEnds(t *testing.T, s *suite) {
	b := s.freshPair(t)
	const key = "p"
	b.prepare(key)
	length := s.Interval + s.Interval/2
	start := s.now()
	if err := b.pause(0, key, length); err != nil {
		t.Fatalf("Pause(%v) = %v", length, err)
	}
	last := len(b.values) - 1
	d, err := b.take(last, key, 1, 0)
	if err != nil {
		t.Fatalf("Take during the pause = %v", err)
	}
	if s.now().Sub(start) < length/2 { // else the machine was too slow to tell
		if left := length - s.now().Sub(start) - s.clockStep(); d.Granted || d.Delay < left || d.Delay > length+time.Millisecond {
			t.Fatalf("Take during a pause of %v with %v left = %+v; want refused with a Delay of the pause left", length, left, d)
		}
	}
	if d.Granted {
		return
	}
	s.wait(d.Delay)
	g, err := b.take(last, key, 1, 0)
	if err == nil {
		g, err = b.settle(last, key, 1, g)
	}
	if err != nil || !g.Granted {
		t.Errorf("Take after the pause's Delay %v = %+v, %v; want a grant", d.Delay, g, err)
	}
}

// checkPauseClamped: a pause longer than throttle.MaxPause, up to
// throttle.Forever, is clamped to MaxPause: it neither overflows into no
// pause nor lasts longer, and a shorter pause after it does not shorten
// it. On a fake clock, the key grants again once MaxPause has passed.
func checkPauseClamped(t *testing.T, s *suite) {
	b := s.freshPair(t)
	lengths := []time.Duration{throttle.Forever, throttle.Forever - time.Microsecond, throttle.MaxPause + time.Hour, throttle.MaxPause + time.Nanosecond, throttle.MaxPause}
	for i, l := range lengths {
		key := fmt.Sprintf("p%d", i)
		b.prepare(key)
		if err := b.pause(0, key, l); err != nil {
			t.Errorf("Pause(%v) = %v; want it clamped to throttle.MaxPause", l, err)
			continue
		}
		if err := b.pause(0, key, time.Millisecond); err != nil {
			t.Errorf("Pause(1ms) after Pause(%v) = %v", l, err)
		}
		for v := range b.values {
			d, err := b.take(v, key, 1, 0)
			if err != nil || d.Granted || d.Delay < throttle.MaxPause-time.Minute || d.Delay > throttle.MaxPause+time.Millisecond {
				t.Errorf("value %d: Take after Pause(%v) = %+v, %v; want refused for throttle.MaxPause (%v)", v, l, d, err, throttle.MaxPause)
			}
		}
	}
	if s.real() {
		return
	}
	s.wait(throttle.MaxPause + time.Millisecond)
	for i := range lengths {
		b.grant(0, fmt.Sprintf("p%d", i), 1, "throttle.MaxPause after a pause clamped to it")
	}
}

// checkPauseZero: a pause of zero or less does nothing (it may be refused
// as invalid).
func checkPauseZero(t *testing.T, s *suite) {
	b := s.fresh(t)
	const key = "z"
	b.prepare(key)
	for _, d := range []time.Duration{0, -time.Nanosecond, -time.Hour, math.MinInt64} {
		if err := b.pause(0, key, d); err != nil && !isInvalid(err) {
			t.Errorf("Pause(%v) = %v; want nil, or an error wrapping throttle.ErrInvalid", d, err)
		}
	}
	b.mu.Lock()
	delete(b.paused, key)
	b.mu.Unlock()
	b.grant(0, key, s.Burst, "a key paused for zero or less only")
}

// checkRefunds: refunds never let the permits kept exceed the guarantee.
// First late hand-backs: a few permits granted one at a time and not used
// are handed back, one between each two takes, after the key has filled
// up again and been spent (leases returned, reservations abandoned late);
// the bucket cannot tell them from permits granted just before. Then a
// workload in which callers hand back, unused, a third of the permits
// they are granted (reservations among them, before their time).
func checkRefunds(t *testing.T, s *suite) {
	b := s.fresh(t)
	const late, unused = "late", 3
	b.prepare(late)
	for range unused {
		d, err := b.take(0, late, 1, 0)
		if err == nil && !d.Granted {
			s.wait(d.Delay)
			d, err = b.take(0, late, 1, 0)
			if err == nil {
				d, err = b.settle(0, late, 1, d)
			}
		}
		if err != nil || !d.Granted {
			t.Fatalf("Take(%q, 1) = %+v, %v; want a grant after the refusal's Delay", late, d, err)
		}
	}
	s.wait(s.horizon + s.Interval) // the key is full again
	r := &recorder{}
	spend := func() {
		for range s.Burst + 2 {
			if d, ok := b.do(0, late, ask{n: 1}, r); !ok || !d.Granted {
				return
			}
		}
	}
	spend()
	for range unused {
		if err := mustOf[throttle.Refunder](b.value(0)).Refund(context.Background(), late, 1); err != nil {
			t.Fatalf("Refund(%q, 1) = %v", late, err)
		}
		spend()
	}
	s.judgeRun(t, "permits kept while old ones were handed back", r, true)

	b = s.freshPair(t)
	const key = "r"
	b.prepare(key)
	l := load{goroutines: 4, weighted: !s.onePermitOnly(), reserve: true, refund: true}
	var r2 *recorder
	if s.real() {
		l.goroutines = 8
		r2 = b.realRun(key, s.runLength(), l)
	} else {
		r2 = b.fakeRounds(key, 60, l)
	}
	if len(r2.permits) == 0 {
		t.Fatalf("no permit kept: the workload was granted nothing")
	}
	s.judgeRun(t, "permits kept while others were refunded", r2, !l.weighted)
}

// checkCostGiveBacks: a cost bucket's grant of a whole period's burst,
// settled down to nothing only after the next period has been spent (a
// call that straddled the period's end), gives the next period nothing:
// the permits granted, the late grant's counted as used, stay within the
// guarantee.
func checkCostGiveBacks(t *testing.T, s *suite) {
	b := s.fresh(t)
	cb := b.value(0).(throttle.CostBucket)
	const key = "late-cost"
	b.prepare(key)
	ctx := context.Background()
	r := &recorder{}
	take := func(n int64) throttle.Decision {
		t.Helper()
		lo := s.now()
		d, err := cb.TakeCost(ctx, key, throttle.Cost{s.CostDimension: n}, 0)
		hi := s.now()
		if err != nil {
			t.Fatalf("TakeCost(%q, %s=%d) = %v", key, s.CostDimension, n, err)
		}
		b.checkDecision(key, n, 0, d)
		if d.Granted {
			r.add(lo, hi, n)
		}
		return d
	}
	// grantAfter follows refusals of n (each Delay waited out) to a grant.
	grantAfter := func(n int64, d throttle.Decision) throttle.Decision {
		t.Helper()
		for hops := 0; !d.Granted && hops < 3; hops++ {
			s.wait(d.Delay)
			d = take(n)
		}
		if !d.Granted {
			t.Fatalf("TakeCost(%q, %s=%d) refused after its Delays: %+v", key, s.CostDimension, n, d)
		}
		return d
	}
	first := grantAfter(s.Burst, take(s.Burst))
	if first.Settle == nil {
		t.Fatalf("TakeCost(%q, %s=%d) granted with no Decision.Settle: a CostBucket's grant must say how to settle it", key, s.CostDimension, s.Burst)
	}
	// The next period: spent by others while the first call runs on.
	grantAfter(1, take(1))
	for range s.Burst + 2 {
		if !take(1).Granted {
			break
		}
	}
	// The first call ends now: it used nothing.
	if err := first.Settle(ctx, throttle.Cost{s.CostDimension: -s.Burst}); err != nil {
		t.Fatalf("Settle of the first grant = %v", err)
	}
	for range s.Burst + 2 {
		if !take(1).Granted {
			break
		}
	}
	s.judgeRun(t, "permits kept while a grant of an ended period was settled down", r, false)
}

// checkConcurrent: many goroutines, spread over both values of NewPair,
// take one permit of the bucket's own key "" at a time at the same moment
// until refused, three times over (each burst after the refusal's Delay):
// they are granted no more than the guarantee allows, counted from the
// grants they saw.
func checkConcurrent(t *testing.T, s *suite) {
	b := s.freshPair(t)
	// Key "" is the bucket's own, often a path of its own (lock-free in
	// memory, keys built once for a store).
	const key, goroutines, bursts = "", 32, 3
	b.prepare(key)
	b.warm(goroutines / len(b.values))
	r := &recorder{}
	perGoroutine := int(s.Burst) + 50
	for range bursts {
		var wg sync.WaitGroup
		start := make(chan struct{})
		delays := make([]time.Duration, goroutines)
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for range perGoroutine {
					d, ok := b.do(g, key, ask{n: 1}, r)
					if !ok || !d.Granted {
						delays[g] = d.Delay
						return
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		// Wake, as Limiters would, at the earliest time a refusal named.
		next := time.Duration(0)
		for _, d := range delays {
			if d > 0 && (next == 0 || d < next) {
				next = d
			}
		}
		s.wait(next)
	}
	if len(r.permits) == 0 {
		t.Fatalf("%d goroutines taking at once were granted nothing", goroutines)
	}
	s.judgeRun(t, fmt.Sprintf("%d goroutines taking at once", goroutines), r, true)
}

// checkGuarantee: goroutines take, and wait what refusals name, for
// several intervals (on a fake clock, over many instants: see
// fakeRounds); some accept a reservation; a Pauser is paused for a while.
// The permits granted keep the guarantee, and every bound of Also, judged
// on their times. On a fake clock, a run of one permit per take, and a
// weighted one when Burst > 1; in real time, one run, weighted unless a
// bound holds for one permit only (OnePermit).
func checkGuarantee(t *testing.T, s *suite) {
	runs := []load{{goroutines: 6, reserve: true}}
	if s.Burst > 1 {
		runs = append(runs, load{goroutines: 6, reserve: true, weighted: true})
	}
	if s.real() {
		// One run: weighted unless a bound holds for single permits only.
		runs = []load{{goroutines: 16, reserve: true, weighted: s.Burst > 1 && !s.onePermitOnly()}}
	}
	for i, l := range runs {
		b := s.freshPair(t)
		_, l.pause = throttle.BucketAs[throttle.Pauser](b.value(0))
		key := fmt.Sprintf("g%d", i)
		b.prepare(key)
		var r *recorder
		if s.real() {
			r = b.realRun(key, s.runLength(), l)
		} else {
			r = b.fakeRounds(key, 80, l)
		}
		what := "takes of one permit"
		if l.weighted {
			what = "weighted takes"
		}
		if len(r.permits) == 0 {
			t.Fatalf("%s: nothing granted", what)
		}
		s.judgeRun(t, what, r, !l.weighted)
	}
}

// checkContext: a Take whose context has ended (cancelled, or its
// deadline passed) fails with an error that wraps the context's error (a
// *throttle.BackendError for a Remote bucket), returns, and charges
// nothing; a Take with a deadline returns.
func checkContext(t *testing.T, s *suite) {
	b := s.fresh(t)
	const key = "ctx"
	b.prepare(key)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, c := range []struct {
		name string
		ctx  context.Context
		want error
	}{{"cancelled", cancelled, context.Canceled}, {"past its deadline", expired, context.DeadlineExceeded}} {
		for _, mw := range []time.Duration{0, throttle.Forever} {
			d, err := b.takeReturns(c.ctx, 0, key, s.Burst, mw)
			var be *throttle.BackendError
			switch {
			case !errors.Is(err, c.want):
				t.Errorf("Take(n=%d, maxWait=%v) with a context %s = %+v, %v; want an error wrapping %v", s.Burst, mw, c.name, d, err, c.want)
			case s.Remote && !errors.As(err, &be):
				t.Errorf("Take with a context %s = %v; want a *throttle.BackendError (Spec.Remote)", c.name, err)
			}
		}
	}
	if _, ok := b.grant(0, key, s.Burst, "a fresh key grants Burst after takes whose context had ended, which must charge nothing"); !ok {
		return
	}
	// The key is spent: an ended context still fails the take, rather
	// than a refusal telling the caller to wait.
	d, err := b.takeReturns(cancelled, 0, key, 1, throttle.Forever)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Take(n=1, maxWait=Forever) of a spent key with a context cancelled = %+v, %v; want an error wrapping context.Canceled", d, err)
	}
	// A caller willing to wait for ever: Take still returns by itself (a
	// bucket decides, it never sleeps).
	ctx, cancel3 := context.WithTimeout(context.Background(), s.Interval)
	defer cancel3()
	b.takeReturns(ctx, 0, key, 1, throttle.Forever)
}
