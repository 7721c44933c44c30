package bucket

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/redisenv"
)

// stallMeter measures how late this test process runs its goroutines:
// stallCanaries goroutines each sleep stallTick at a time, and the meter
// keeps the worst lateness any of them saw and when they were overdue. A
// timing bound in the fault tests adds what it measured, so that a stall of
// the process (a busy CI host, the race detector's GC) is not blamed on the
// code under test, while what the bounds are there to catch (an Acquire
// held through a fault, seconds long) still fails.
//
// One goroutine is not enough: a sleeping goroutine's timer waits in the
// heap of the P it slept on, and while the host deschedules that P's
// thread, its timers fire only when the thread runs again or an idle P
// steals them (none is idle while the test's callers keep both busy), so
// callers can return late together while a lone meter goroutine on the
// other P sees nothing. Several canaries spread over the Ps as the
// callers do, and a stalled P shows as overdue on those whose timers it
// holds.
type stallMeter struct {
	worst atomic.Int64 // nanoseconds
	stop  chan struct{}
	wg    sync.WaitGroup

	mu sync.Mutex
	// overdue is when a canary was due to run and did not, for at least
	// a tick: the process's stalls, not a timer's slack. Spans of
	// different canaries overlap.
	overdue []span
}

// span is a stretch of time, [from, to).
type span struct{ from, to time.Time }

// stallTick is a canary's sleep; what a sleep of it overruns by is the
// process's scheduling delay at that moment.
const stallTick = time.Millisecond

// stallCanaries is how many canaries a meter runs per P, at most
// maxStallCanaries in all: with 8 on 2 Ps, all of them sit on the same one
// about one time in 128; more would only load a large machine.
const stallCanaries, maxStallCanaries = 4, 16

// startStallMeter starts a stall meter that stops when t ends (or earlier,
// at Stop).
func startStallMeter(t *testing.T) *stallMeter {
	t.Helper()
	m := &stallMeter{stop: make(chan struct{})}
	for range min(stallCanaries*runtime.GOMAXPROCS(0), maxStallCanaries) {
		m.wg.Go(m.canary)
	}
	t.Cleanup(func() { m.Stop() })
	return m
}

// canary sleeps a tick at a time until the meter stops, recording its
// lateness.
func (m *stallMeter) canary() {
	for {
		select {
		case <-m.stop:
			return
		default:
		}
		start := time.Now()
		time.Sleep(stallTick) // measured, not waited on
		woke := time.Now()
		late := woke.Sub(start) - stallTick
		for {
			w := m.worst.Load()
			if int64(late) <= w || m.worst.CompareAndSwap(w, int64(late)) {
				break
			}
		}
		if late >= stallTick {
			m.mu.Lock()
			m.overdue = append(m.overdue, span{start.Add(stallTick), woke})
			m.mu.Unlock()
		}
	}
}

// Stop ends the measurement (once; later calls only read) and returns the
// worst lateness seen.
func (m *stallMeter) Stop() time.Duration {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	m.wg.Wait()
	return time.Duration(m.worst.Load())
}

// overdueDuring is how long, of the time from from to to, some canary was
// due to run and did not, for a tick or longer at a time: the process's
// stalls then, as far as the canaries saw them (overlapping stalls of
// several canaries count once).
func (m *stallMeter) overdueDuring(from, to time.Time) time.Duration {
	var sum time.Duration
	for _, o := range m.stalls(from, to) {
		sum += o.to.Sub(o.from)
	}
	return sum
}

// longestStall is how long one goroutine of the process was held at most
// from from to to: the longest time a single canary was overdue. The
// union of several canaries' stalls is no goroutine's.
func (m *stallMeter) longestStall(from, to time.Time) time.Duration {
	var longest time.Duration
	for _, o := range m.clipped(from, to) {
		longest = max(longest, o.to.Sub(o.from))
	}
	return longest
}

// clipped is the canaries' overdue spans from from to to, cut to that
// stretch.
func (m *stallMeter) clipped(from, to time.Time) []span {
	m.mu.Lock()
	defer m.mu.Unlock()
	var in []span
	for _, o := range m.overdue {
		if lo, hi := later(o.from, from), earlier(o.to, to); hi.After(lo) {
			in = append(in, span{lo, hi})
		}
	}
	return in
}

// stalls is the canaries' overdue spans from from to to, cut to that
// stretch and merged where they overlap or touch, in order.
func (m *stallMeter) stalls(from, to time.Time) []span {
	in := m.clipped(from, to)
	slices.SortFunc(in, func(a, b span) int { return a.from.Compare(b.from) })
	var out []span
	for _, o := range in {
		if n := len(out); n > 0 && !o.from.After(out[n-1].to) {
			out[n-1].to = later(out[n-1].to, o.to)
			continue
		}
		out = append(out, o)
	}
	return out
}

// storeMeter measures how late the store answers, as the stall meter does
// this process: a goroutine pings it on a connection of its own every
// storeTick and keeps each ping that took storeSlow or longer (or
// failed). A bound on when the failure policy may decide allows what the
// store's own delays explain: a host that deschedules redis-server cuts
// off the callers' store calls as a stall of this process would (the
// meter's pings are held by either), and that is not the code under
// test.
type storeMeter struct {
	stop chan struct{}
	wg   sync.WaitGroup

	mu   sync.Mutex
	late []span // each slow ping, from when it was sent to its answer
}

// storeTick is how often the store meter pings; storeSlow, the round trip
// that counts as late (a healthy loopback Redis answers in well under a
// millisecond).
const storeTick, storeSlow = 2 * time.Millisecond, 5 * time.Millisecond

// startStoreMeter starts a store meter on the Redis at addr, which stops
// when t ends (or earlier, at Stop).
func startStoreMeter(t *testing.T, addr string) *storeMeter {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, ReadTimeout: time.Second, WriteTimeout: time.Second})
	m := &storeMeter{stop: make(chan struct{})}
	m.wg.Go(func() {
		defer rdb.Close()
		for {
			select {
			case <-m.stop:
				return
			case <-time.After(storeTick):
			}
			sent := time.Now()
			err := rdb.Ping(context.Background()).Err()
			if back := time.Now(); err != nil || back.Sub(sent) >= storeSlow {
				m.mu.Lock()
				m.late = append(m.late, span{sent, back})
				m.mu.Unlock()
			}
		}
	})
	t.Cleanup(m.Stop)
	return m
}

// Stop ends the measurement; later calls do nothing.
func (m *storeMeter) Stop() {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	m.wg.Wait()
}

// lateDuring is the longest round trip of a slow ping in flight at some
// time from from to to; 0 when the store answered every ping then in
// time.
func (m *storeMeter) lateDuring(from, to time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var longest time.Duration
	for _, p := range m.late {
		if p.from.Before(to) && p.to.After(from) {
			longest = max(longest, p.to.Sub(p.from))
		}
	}
	return longest
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// TestStallMeterSeesAStall: with one P held by a busy loop, the meter's
// goroutine runs only when the scheduler preempts the loop (every ~10 ms),
// and its 1 ms sleeps show that as lateness.
func TestStallMeterSeesAStall(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	m := startStallMeter(t)
	start := time.Now()
	for time.Since(start) < 60*time.Millisecond {
	}
	end := time.Now()
	if got := m.Stop(); got < 5*time.Millisecond {
		t.Fatalf("stall meter saw %v of lateness while one busy loop held the only P for 60ms, want ≥ 5ms", got)
	}
	if got := m.overdueDuring(start, end); got < 5*time.Millisecond {
		t.Fatalf("stall meter was overdue %v in total while one busy loop held the only P for 60ms, want ≥ 5ms", got)
	}
}

// TestStallMeterCountsOverlappingStallsOnce: two canaries overdue over the
// same stretch are one stall of the process, not two, as long as their
// union; the stretch is cut to the call's span. The longest stall is one
// canary's, not a union's.
func TestStallMeterCountsOverlappingStallsOnce(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	m := &stallMeter{overdue: []span{
		{at(10), at(40)}, // one canary
		{at(20), at(30)}, // another, inside it
		{at(35), at(60)}, // a third, overlapping its end
		{at(80), at(90)},
	}}
	for _, tc := range []struct {
		from, to int
		want     time.Duration
	}{
		{0, 100, 60 * time.Millisecond},
		{25, 85, 40 * time.Millisecond},
		{60, 80, 0},
	} {
		if got := m.overdueDuring(at(tc.from), at(tc.to)); got != tc.want {
			t.Errorf("overdue during [%d ms, %d ms) = %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
	if got, want := m.longestStall(at(0), at(100)), 30*time.Millisecond; got != want {
		t.Errorf("longest stall = %v, want %v (one canary's, 10–40 ms)", got, want)
	}
	if got, want := m.longestStall(at(85), at(100)), 5*time.Millisecond; got != want {
		t.Errorf("longest stall from 85 ms = %v, want %v", got, want)
	}
}

// TestStoreMeterSeesAStoppedStore: a Redis stopped for 200 ms answers
// the meter's ping in flight that long late, less the ping's start (its
// goroutine may be held a while too), and the meter names the stretch.
func TestStoreMeterSeesAStoppedStore(t *testing.T) {
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "SIGSTOP")
	m := startStoreMeter(t, srv.Addr())
	begin := time.Now()
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the fault's duration
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	end := time.Now()
	m.Stop()
	if got := m.lateDuring(begin, end); got < 100*time.Millisecond {
		t.Fatalf("store meter saw a ping at most %v late while Redis was stopped for 200 ms, want ≥ 100 ms", got)
	}
	if got := m.lateDuring(end.Add(time.Second), end.Add(2*time.Second)); got != 0 {
		t.Fatalf("store meter names %v of lateness after it stopped", got)
	}
}
