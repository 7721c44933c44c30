package bucket

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// stallMeter measures how late this test process runs its goroutines: one
// goroutine sleeps stallTick at a time and keeps the worst lateness. A
// timing bound in the fault tests adds what it measured, so that a stall of
// the whole process (a busy CI host, the race detector's GC) is not blamed
// on the code under test, while what the bounds are there to catch (an
// Acquire held through a fault, seconds long) still fails.
type stallMeter struct {
	worst atomic.Int64 // nanoseconds
	stop  chan struct{}
	done  chan struct{}

	mu sync.Mutex
	// overdue is when the meter's goroutine was due to run and did not,
	// for at least a tick: the process's stalls, not a timer's slack.
	overdue []span
}

// span is a stretch of time, [from, to).
type span struct{ from, to time.Time }

// stallTick is the stall meter's sleep; what a sleep of it overruns by is
// the process's scheduling delay at that moment.
const stallTick = time.Millisecond

// startStallMeter starts a stall meter that stops when t ends (or earlier,
// at Stop).
func startStallMeter(t *testing.T) *stallMeter {
	t.Helper()
	m := &stallMeter{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
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
			if late > time.Duration(m.worst.Load()) {
				m.worst.Store(int64(late))
			}
			if late >= stallTick {
				m.mu.Lock()
				m.overdue = append(m.overdue, span{start.Add(stallTick), woke})
				m.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { m.Stop() })
	return m
}

// Stop ends the measurement (once; later calls only read) and returns the
// worst lateness seen.
func (m *stallMeter) Stop() time.Duration {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	<-m.done
	return time.Duration(m.worst.Load())
}

// overdueDuring is how long, of the time from from to to, the meter's
// goroutine was due to run and did not, for a tick or longer at a time:
// the process's stalls then, as far as this goroutine saw them.
func (m *stallMeter) overdueDuring(from, to time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var sum time.Duration
	for _, o := range m.overdue {
		if lo, hi := later(o.from, from), earlier(o.to, to); hi.After(lo) {
			sum += hi.Sub(lo)
		}
	}
	return sum
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
