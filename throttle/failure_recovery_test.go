package throttle_test

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
)

// TestFailLocalWeightedTakesKeepTheShare: in degraded mode an instance
// grants at most its share in any span of one interval, weighted takes
// included. With a share of 5 per second (one slot every 200 ms), takes of
// 3 are granted at least a second apart, not 600 ms (6 in one second), and
// a take of 5 at least a second after one of 1, not 200 ms (6 as well).
func TestFailLocalWeightedTakesKeepTheShare(t *testing.T) {
	for _, seq := range [][]int64{{3}, {1, 5}, {2, 4}} {
		t.Run(fmt.Sprint(seq), func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			start := clock.Now()
			// 10 per second shared by 2 instances: 5 per second here.
			f := &flaky{down: true, limit: 10, interval: time.Second, instances: 2}
			lim := throttle.New(f, throttle.WithClock(clock))
			ctx := context.Background()
			type grant struct {
				at time.Duration
				n  int64
			}
			var grants []grant
			i := 0
			for range 60 { // 6 s in steps of 100 ms
				for {
					n := seq[i%len(seq)]
					if lim.AcquireN(ctx, n, 0) != nil {
						break
					}
					grants = append(grants, grant{clock.Since(start), n})
					i++
				}
				clock.Advance(100 * time.Millisecond)
			}
			require.NotEmpty(t, grants)
			for j, g := range grants {
				sum := int64(0)
				for _, h := range grants[j:] {
					if h.at-g.at < time.Second {
						sum += h.n
					}
				}
				assert.LessOrEqual(t, sum, int64(5), "%d permits granted in the second from %v (share 5): %v", sum, g.at, grants)
			}
		})
	}
}

// TestFailLocalKeepsPerKeyLimitsOfIdleKeys: a tenant whose limit was
// lowered live keeps it while the store is down even after it was idle for
// a while and many other keys were used meanwhile: the record of its last
// decision is not swept with those of ended periods, so the outage gives
// it its own limit (3 per second), not the base key's (100).
func TestFailLocalKeepsPerKeyLimitsOfIdleKeys(t *testing.T) {
	clock := clockwork.NewFakeClock()
	s := &keyedStore{base: 100, inst: 1, limits: map[string]int64{"tenant": 3}}
	lim := throttle.New(s, throttle.WithClock(clock))
	ctx := context.Background()
	require.NoError(t, lim.Key("tenant").Acquire(ctx, 0))
	clock.Advance(2 * time.Second) // the tenant's period is over; it stays idle
	for i := range 5000 {          // other keys: enough to sweep every shard
		require.NoError(t, lim.Key(fmt.Sprint("other-", i)).Acquire(ctx, 0))
	}
	s.set(true)
	granted := 0
	for range 30 { // 3 s in steps of 100 ms
		for lim.Key("tenant").Acquire(ctx, 0) == nil {
			granted++
		}
		clock.Advance(100 * time.Millisecond)
	}
	assert.LessOrEqual(t, granted, 9, "3 per second for 3 s at most; the base key's 100 per second would give far more")
	assert.Positive(t, granted)
}

// periodStore is a shared-store stand-in with limit permits per key per
// aligned period of its clock; while down it fails. It counts, per key and
// period, what it granted (its own numbers, for the store's view).
type periodStore struct {
	clock    clockwork.Clock
	start    time.Time
	limit    int64
	interval time.Duration
	inst     int64

	mu   sync.Mutex
	down bool
	used map[string]int64 // "key/period" → permits charged
}

func (s *periodStore) set(down bool) { s.mu.Lock(); s.down = down; s.mu.Unlock() }

func (s *periodStore) Take(_ context.Context, key string, n int64, _ time.Duration) (throttle.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return throttle.Decision{}, &throttle.BackendError{Op: "take", Err: io.ErrUnexpectedEOF}
	}
	since := s.clock.Since(s.start)
	p := int64(since / s.interval)
	reset := time.Duration(p+1)*s.interval - since
	k := fmt.Sprintf("%s/%d", key, p)
	if s.used == nil {
		s.used = map[string]int64{}
	}
	if s.used[k]+n > s.limit {
		return throttle.Decision{Delay: reset, Limit: s.limit, Remaining: s.limit - s.used[k], Reset: reset}, nil
	}
	s.used[k] += n
	return throttle.Decision{Granted: true, Limit: s.limit, Remaining: s.limit - s.used[k], Reset: reset}, nil
}

func (s *periodStore) Fallback() (int64, time.Duration, int64) { return s.limit, s.interval, s.inst }

// TestFailLocalRecoveryChargesTheDebtFirstOnEveryKey: after an outage the
// permits a key granted locally are charged to the shared bucket before
// its next shared grant, for every key, not only the key of the call that
// found the store up again (here "a"): key "b" is charged its debt before
// it is granted a permit, not from what is left after it, which would put
// the period one permit above the limit.
func TestFailLocalRecoveryChargesTheDebtFirstOnEveryKey(t *testing.T) {
	clock := clockwork.NewFakeClock()
	s := &periodStore{clock: clock, start: clock.Now(), limit: 10, interval: time.Second, inst: 1}
	lim := throttle.New(s, throttle.WithClock(clock))
	ctx := context.Background()
	real := 0 // permits of key "b" in period 0, counted here
	require.NoError(t, lim.Key("a").Acquire(ctx, 0))
	require.NoError(t, lim.Key("b").Acquire(ctx, 0))
	real++
	s.set(true)
	for range 9 { // 0 to 0.8 s: b's 9 left, granted locally
		for lim.Key("b").Acquire(ctx, 0) == nil {
			real++
		}
		clock.Advance(100 * time.Millisecond)
	}
	require.Equal(t, 10, real, "the shared grant and the 9 left, locally")
	s.set(false)
	require.NoError(t, lim.Key("a").Acquire(ctx, 0), "the store answers again (the probe is a's)")
	for lim.Key("b").Acquire(ctx, 0) == nil {
		real++
	}
	require.Less(t, clock.Since(s.start), time.Second, "still period 0")
	assert.LessOrEqual(t, real, 10, "key b granted %d permits in a period of limit 10", real)
}

// TestFailLocalSecondOutageStartsAfresh: a key that granted locally in one
// outage and was not called while the store was up again must not carry
// its old pace into the next outage, which would let it grant at once in
// a period the rest of the fleet had used up.
func TestFailLocalSecondOutageStartsAfresh(t *testing.T) {
	clock := clockwork.NewFakeClock()
	start := clock.Now()
	// 10 per second shared by 2 instances: a share of 5 here.
	s := &periodStore{clock: clock, start: start, limit: 10, interval: time.Second, inst: 2}
	lim := throttle.New(s, throttle.WithClock(clock))
	ctx := context.Background()
	require.NoError(t, lim.Key("b").Acquire(ctx, 0))
	s.set(true)
	require.NoError(t, lim.Key("b").Acquire(ctx, 0), "outage 1: b's share of what period 0 had left")
	clock.Advance(100 * time.Millisecond)
	s.set(false)
	require.NoError(t, lim.Key("a").Acquire(ctx, 0), "the store answers again; b is not called")

	clock.Advance(time.Second) // period 1: the other instance uses all of b's
	s.mu.Lock()
	s.used["b/1"] = 10
	s.mu.Unlock()
	require.NoError(t, lim.Key("a").Acquire(ctx, 0))
	clock.Advance(300 * time.Millisecond) // 1.4 s
	s.set(true)
	_ = lim.Key("a").Acquire(ctx, 0) // outage 2 begins
	inPeriod1 := 0
	for clock.Since(start) < 2*time.Second {
		for lim.Key("b").Acquire(ctx, 0) == nil {
			inPeriod1++
		}
		clock.Advance(50 * time.Millisecond)
	}
	assert.Zero(t, inPeriod1, "b granted %d locally in a period the fleet had used up (its last shared decision was in period 0)", inPeriod1)
}

// slowRecovery is a store that, once up again after an outage, takes 25 ms
// of its fake clock to refuse a call carrying a debt (n > 1, more than it
// has left), or the rest of the call's bound if that is shorter, and then
// fails as a call cut by its deadline does.
type slowRecovery struct {
	clock *clockwork.FakeClock
	mu    sync.Mutex
	down  bool
	calls int
}

func (s *slowRecovery) Take(ctx context.Context, _ string, n int64, _ time.Duration) (throttle.Decision, error) {
	s.mu.Lock()
	down := s.down
	s.calls++
	s.mu.Unlock()
	switch {
	case down:
		return throttle.Decision{}, &throttle.BackendError{Op: "take", Err: io.ErrUnexpectedEOF}
	case n == 1:
		return throttle.Decision{Granted: true, Limit: 1000, Remaining: 999, Reset: time.Second}, nil
	}
	const latency = 25 * time.Millisecond // the round trip's
	// The call's bound is on the real clock, which barely moves here:
	// what is left of it now is what the Limiter gave the call. A bound
	// shorter than the round trip cuts it: its whole bound passes.
	if dl, ok := ctx.Deadline(); ok {
		if bound := time.Until(dl); bound < latency {
			s.clock.Advance(max(bound, 0))
			<-ctx.Done()
			return throttle.Decision{}, &throttle.BackendError{Op: "take", Err: ctx.Err()}
		}
	}
	s.clock.Advance(latency)
	return throttle.Decision{Delay: time.Second, Limit: 1000, Remaining: 1, Reset: time.Second}, nil
}

func (s *slowRecovery) Fallback() (int64, time.Duration, int64) { return 1000, time.Second, 1 }

// acquireDriven runs lim.Acquire(ctx, maxWait), advancing clock by 1 ms
// whenever a goroutine waits on it, until Acquire returns.
func acquireDriven(ctx context.Context, lim *throttle.Limiter, clock *clockwork.FakeClock, maxWait time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- lim.Acquire(ctx, maxWait) }()
	for {
		bctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
		blocked := clock.BlockUntilContext(bctx, 1) == nil
		cancel()
		select {
		case err := <-done:
			return err
		default:
		}
		if blocked {
			clock.Advance(time.Millisecond)
		}
	}
}

// TestRecoveryDebtStaysWithinTheWait: accounting for the local grants
// after an outage shares the caller's deadline with the caller's own store
// call rather than getting a deadline of its own, the whole wait again:
// Acquire(50 ms) returns ErrTimeout within its wait, not after about
// 75 ms. Judged on the Limiter's fake clock, which the store's round trips
// and the Limiter's own waits move.
func TestRecoveryDebtStaysWithinTheWait(t *testing.T) {
	clock := clockwork.NewFakeClock()
	s := &slowRecovery{clock: clock}
	lim := throttle.New(s, throttle.WithClock(clock))
	defer lim.Close()
	ctx := context.Background()
	require.NoError(t, acquireDriven(ctx, lim, clock, 0))
	s.mu.Lock()
	s.down = true
	s.mu.Unlock()
	local := 0
	for range 5 {
		if acquireDriven(ctx, lim, clock, 20*time.Millisecond) == nil {
			local++
		}
	}
	require.Positive(t, local)
	s.mu.Lock()
	s.down = false
	s.mu.Unlock()
	start := clock.Now()
	err := acquireDriven(ctx, lim, clock, 50*time.Millisecond)
	took := clock.Since(start)
	t.Logf("Acquire(50 ms) returned %v after %v", err, took)
	assert.ErrorIs(t, err, throttle.ErrTimeout, "the recovered store refuses the debt: no permit within the wait")
	// The driver moves the clock by whole milliseconds.
	assert.LessOrEqual(t, took, 51*time.Millisecond, "Acquire(50 ms) returned after %v", took)
}

// heldStore is a periodStore whose calls, while held, wait until released
// and then run: a paused Redis that answers the commands queued in its
// connections when it resumes.
type heldStore struct {
	*periodStore
	held    chan struct{} // closed: calls run; nil: not held
	entered chan struct{} // a held call has arrived
}

func (s *heldStore) Take(ctx context.Context, key string, n int64, w time.Duration) (throttle.Decision, error) {
	s.mu.Lock()
	held := s.held
	s.mu.Unlock()
	if held != nil {
		s.entered <- struct{}{}
		<-held
	}
	return s.periodStore.Take(ctx, key, n, w)
}

// heldProbe is a Limiter on a heldStore of 10 per second for one instance
// that granted once from the store at 0 s, then locally (the store down)
// at 0, 0.1 and 0.2 s, and whose next probe, sent at 0.3 s when the store
// answers again, waits in it until release is called.
type heldProbe struct {
	lim   *throttle.Limiter
	ps    *periodStore
	clock *clockwork.FakeClock
	probe chan error // the probe's Acquire result
	s     *heldStore
	done  chan struct{}
}

// startHeldProbe builds a heldProbe; granted counts every permit granted
// (in period 0).
func startHeldProbe(t *testing.T) (h *heldProbe, granted int) {
	t.Helper()
	clock := clockwork.NewFakeClock()
	ps := &periodStore{clock: clock, start: clock.Now(), limit: 10, interval: time.Second, inst: 1}
	s := &heldStore{periodStore: ps, entered: make(chan struct{}, 1)}
	h = &heldProbe{lim: throttle.New(s, throttle.WithClock(clock)), ps: ps, clock: clock, s: s, probe: make(chan error, 1), done: make(chan struct{})}
	ctx := context.Background()
	require.NoError(t, h.lim.Acquire(ctx, 0))
	granted++
	ps.set(true)
	for range 3 { // 0 to 0.2 s: granted locally, each call a failed probe
		for h.lim.Acquire(ctx, 0) == nil {
			granted++
		}
		clock.Advance(100 * time.Millisecond)
	}
	s.mu.Lock()
	s.held = h.done
	s.mu.Unlock()
	ps.set(false)
	go func() { h.probe <- h.lim.Acquire(ctx, throttle.Forever) }()
	<-s.entered
	return h, granted
}

// release lets the held probe's call run and returns its result.
func (h *heldProbe) release() error {
	h.s.mu.Lock()
	h.s.held = nil
	h.s.mu.Unlock()
	close(h.done)
	return <-h.probe
}

// TestFailLocalChargesGrantsMadeWhileTheProbeWaited (the pause
// scenario's resume second): the probe that finds the store up again was
// sent while it was down and carries what the instance had granted
// locally until then; the permits granted locally while it waited for the
// store are owed too, not forgotten when the probe's grant comes back, so
// that the fleet's burst at the resume does not come on top of them: the
// period keeps to its limit of 10.
func TestFailLocalChargesGrantsMadeWhileTheProbeWaited(t *testing.T) {
	h, inPeriod := startHeldProbe(t)
	ctx := context.Background()
	for range 4 { // 0.3 to 0.6 s: granted locally while the probe waits
		for h.lim.Acquire(ctx, 0) == nil {
			inPeriod++
		}
		h.clock.Advance(100 * time.Millisecond)
	}
	require.NoError(t, h.release(), "the probe is granted")
	inPeriod++
	for h.lim.Acquire(ctx, 0) == nil {
		inPeriod++
	}
	require.Less(t, h.clock.Since(h.ps.start), time.Second, "still period 0")
	assert.LessOrEqual(t, inPeriod, 10, "%d permits granted in a period of limit 10", inPeriod)
}

// TestFailLocalLongProbeChargesOnlyRecentGrants: grants made
// while a probe waited several intervals are owed only as far as they
// fall in the last two intervals, as any local grant is; they are not
// charged in full to the period the probe comes back in, long after the
// provider counted them.
func TestFailLocalLongProbeChargesOnlyRecentGrants(t *testing.T) {
	h, _ := startHeldProbe(t)
	ctx := context.Background()
	for i := range 50 { // 0.3 to 5.3 s; local grants only until 1.8 s
		for i < 15 && h.lim.Acquire(ctx, 0) == nil {
		}
		h.clock.Advance(100 * time.Millisecond)
	}
	require.NoError(t, h.release())
	p := int64(h.clock.Since(h.ps.start) / time.Second)
	require.Equal(t, int64(5), p)
	h.ps.mu.Lock()
	used := h.ps.used[fmt.Sprintf("/%d", p)]
	h.ps.mu.Unlock()
	// The probe carried the 3 local grants made before it was sent (its
	// claim rides with it); those made while it waited are not charged.
	assert.Equal(t, int64(1+3), used, "period 5 charged %d: the probe's permit and its claim only (no local grant in the last two intervals)", used)
}

// splitStore is one instance's view of a shared periodStore: it fails
// while its own down is set (its client has not found the store again),
// whatever the others see.
type splitStore struct {
	*periodStore
	down atomic.Bool
}

func (s *splitStore) Take(ctx context.Context, key string, n int64, w time.Duration) (throttle.Decision, error) {
	if s.down.Load() {
		return throttle.Decision{}, &throttle.BackendError{Op: "take", Err: io.ErrUnexpectedEOF}
	}
	return s.periodStore.Take(ctx, key, n, w)
}

// bothLocal starts two instances on buckets a and b of ps (their stores
// fail and answer by da and db) as the first-back tests do: both fail
// late in period 0 and grant locally until 2.1 s. step advances the clock
// 100 ms and lets both ask greedily, counting grants per period; greedy
// asks one instance until it is refused.
func bothLocal(clock *clockwork.FakeClock, ps *periodStore, a, b throttle.Bucket, da, db *splitStore) (la *throttle.Limiter, step func(), perPeriod map[int64]int, greedy func(*throttle.Limiter) int) {
	la, lb := throttle.New(a, throttle.WithClock(clock)), throttle.New(b, throttle.WithClock(clock))
	ctx := context.Background()
	greedy = func(l *throttle.Limiter) (n int) {
		for l.Acquire(ctx, 0) == nil {
			n++
		}
		return n
	}
	perPeriod = map[int64]int{}
	step = func() { // 100 ms on, then both instances ask greedily
		clock.Advance(100 * time.Millisecond)
		perPeriod[int64(clock.Since(ps.start)/time.Second)] += greedy(la) + greedy(lb)
	}
	clock.Advance(900 * time.Millisecond) // late in period 0
	da.down.Store(true)
	db.down.Store(true)
	for range 12 { // 1.0 to 2.1 s: local grants only
		step()
	}
	return la, step, perPeriod, greedy
}

// TestFailLocalFirstBackKeepsToItsShare (the Sentinel failover):
// two instances share 10 per second; the store fails for both, and comes
// back for one of them (its client found the promoted master) while the
// other still grants its local share. In the first shared period after
// its return, the first instance takes at most its share less what it
// owes; the second's local grants and, once back, its debt and shared
// grants fit the rest. The first back does not take the whole period,
// which would let the fleet grant 10 + the other's share in it.
func TestFailLocalFirstBackKeepsToItsShare(t *testing.T) {
	clock := clockwork.NewFakeClock()
	ps := &periodStore{clock: clock, start: clock.Now(), limit: 10, interval: time.Second, inst: 2}
	a, b := &splitStore{periodStore: ps}, &splitStore{periodStore: ps}
	la, step, perPeriod, greedy := bothLocal(clock, ps, a, b, a, b)
	a.down.Store(false) // 2.1 s, period 2: a is back, b is not yet
	for range 5 {       // 2.2 to 2.6 s
		step()
	}
	b.down.Store(false) // 2.6 s: b is back too
	for range 3 {       // 2.7 to 2.9 s
		step()
	}
	require.Less(t, clock.Since(ps.start), 3*time.Second, "still period 2")
	t.Logf("grants per period: %v", perPeriod)
	assert.LessOrEqual(t, perPeriod[1], 10, "period 1, both local")
	assert.LessOrEqual(t, perPeriod[2], 10, "period 2, a back first: %d grants for a limit of 10", perPeriod[2])
	assert.GreaterOrEqual(t, perPeriod[2], 5, "period 2: the shares are used")
	// From the next period the shared limit alone decides: a greedy
	// instance may take it all.
	clock.Advance(time.Second)
	assert.Equal(t, 10, greedy(la), "period 3: a takes the whole limit")
}

// TestFailLocalIdleKeyIsNotCappedLater: a key that granted
// locally in an outage and was not called again until long after it is
// not held to its share when it is: it owes nothing any more, and gets
// the whole limit, not half of it and refusals until the period's end.
func TestFailLocalIdleKeyIsNotCappedLater(t *testing.T) {
	clock := clockwork.NewFakeClock()
	ps := &periodStore{clock: clock, start: clock.Now(), limit: 10, interval: time.Second, inst: 2}
	lim := throttle.New(ps, throttle.WithClock(clock))
	ctx := context.Background()
	require.NoError(t, lim.Key("k").Acquire(ctx, 0))
	ps.set(true)
	clock.Advance(100 * time.Millisecond)
	require.NoError(t, lim.Key("k").Acquire(ctx, 0), "a local grant of k")
	ps.set(false)
	require.NoError(t, lim.Key("other").Acquire(ctx, 0), "the store answers again, for another key")
	clock.Advance(time.Hour)
	granted := 0
	for lim.Key("k").Acquire(ctx, 0) == nil {
		granted++
	}
	assert.Equal(t, 10, granted, "k an hour after the outage: the whole limit, not a share")
}

// lostStore answers as bucket.TokenBucket does in a period the server lost
// (Redis restarted empty, a replica promoted without the latest refill):
// no token until that period's end.
type lostStore struct {
	*splitStore
	lost int64 // the period held
}

func (s *lostStore) Take(ctx context.Context, key string, n int64, w time.Duration) (throttle.Decision, error) {
	since := s.clock.Since(s.start)
	if p := int64(since / s.interval); !s.down.Load() && p == s.lost {
		reset := time.Duration(p+1)*s.interval - since
		return throttle.Decision{Delay: reset, Limit: s.limit, Remaining: 0, Reset: reset}, nil
	}
	return s.splitStore.Take(ctx, key, n, w)
}

// TestFailLocalFirstBackRefusedKeepsToItsShareNext: the first
// instance back finds its period held (or spent): its first answer is a
// refusal. Its cap goes on through the next period, the first it can take
// from, with its share as the room, while the other still grants locally.
// The cap does not end with the held period, which would let the first
// back take the whole next one: 15 in a period of 10.
func TestFailLocalFirstBackRefusedKeepsToItsShareNext(t *testing.T) {
	clock := clockwork.NewFakeClock()
	ps := &periodStore{clock: clock, start: clock.Now(), limit: 10, interval: time.Second, inst: 2}
	a, b := &lostStore{splitStore: &splitStore{periodStore: ps}, lost: 2}, &splitStore{periodStore: ps}
	la, step, perPeriod, greedy := bothLocal(clock, ps, a, b, a.splitStore, b)
	a.down.Store(false) // 2.1 s: a is back, its period held; b is not back
	for range 18 {      // 2.2 to 3.9 s
		step()
	}
	require.Less(t, clock.Since(ps.start), 4*time.Second, "still period 3")
	t.Logf("grants per period: %v", perPeriod)
	assert.LessOrEqual(t, perPeriod[2], 10, "period 2, held for a")
	assert.LessOrEqual(t, perPeriod[3], 10, "period 3, the first a can take from: %d grants for a limit of 10", perPeriod[3])
	assert.GreaterOrEqual(t, perPeriod[3], 5, "period 3: the shares are used")
	// From the next period the shared limit alone decides.
	b.down.Store(false)
	clock.Advance(time.Second)
	assert.Equal(t, 10, greedy(la), "period 4: a takes the whole limit")
}

// TestFailLocalWeightedTakeAboveTheShareWaitsForTheCapsEnd: after
// a refused first answer, the cap's next period has the share as its room;
// a take of more than the share fits in neither period of the cap: it is
// refused until the cap ends, told so, and granted then.
func TestFailLocalWeightedTakeAboveTheShareWaitsForTheCapsEnd(t *testing.T) {
	clock := clockwork.NewFakeClock()
	ps := &periodStore{clock: clock, start: clock.Now(), limit: 100, interval: time.Second, inst: 4}
	a := &lostStore{splitStore: &splitStore{periodStore: ps}, lost: 2}
	lim := throttle.New(a, throttle.WithClock(clock))
	ctx := context.Background()
	clock.Advance(900 * time.Millisecond)
	a.down.Store(true)
	for range 24 { // 0.95 to 2.1 s: local grants (share 25)
		clock.Advance(50 * time.Millisecond)
		for lim.Acquire(ctx, 0) == nil {
		}
	}
	a.down.Store(false)
	require.Error(t, lim.Acquire(ctx, 0), "2.1 s: the first answer, held")
	clock.Advance(950 * time.Millisecond)
	err := lim.AcquireN(ctx, 30, 0)
	require.ErrorIs(t, err, throttle.ErrTimeout)
	assert.Contains(t, err.Error(), "next in 950ms", "3.05 s: 30 > the share of the cap's next period")
	granted := 0
	for lim.Acquire(ctx, 0) == nil {
		granted++
	}
	assert.Equal(t, 25, granted, "3.05 s: the share")
	clock.Advance(950 * time.Millisecond)
	assert.NoError(t, lim.AcquireN(ctx, 30, 0), "4 s: the cap has ended")
}
