package buckettest

import (
	"context"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/headway-go/headway/throttle"
)

// load is how a workload takes from a budget.
type load struct {
	goroutines int
	weighted   bool // n from 1 to Burst; otherwise 1
	reserve    bool // some takes accept a reservation (maxWait > 0)
	refund     bool // refund some granted permits unused (a Refunder)
	pause      bool // pause the key for a quarter of an interval, a third of the way through (a Pauser)
}

// seeded returns a generator whose sequence depends on the test's name
// and i only, so that a failure on the fake clock reproduces.
func seeded(t *testing.T, i int) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(t.Name()))
	return rand.New(rand.NewPCG(h.Sum64(), uint64(i)))
}

// ask is one take a workload makes.
type ask struct {
	n       int64
	maxWait time.Duration
	refund  bool // refund the permits if granted: the caller will not use them
}

// pick chooses a take for the load.
func (s *suite) pick(rng *rand.Rand, l load) ask {
	a := ask{n: 1}
	if l.weighted && s.Burst > 1 {
		a.n = 1 + rng.Int64N(s.Burst)
	}
	if l.reserve {
		switch rng.IntN(4) {
		case 0:
			a.maxWait = s.Interval / 4
		case 1:
			a.maxWait = throttle.Forever
		}
	}
	a.refund = l.refund && rng.IntN(3) == 0
	return a
}

// recorder collects the permits a workload was granted and kept, and
// when its first Take started.
type recorder struct {
	mu      sync.Mutex
	permits []permit
	// start is the earliest start of a Take recorded, whatever its
	// outcome (see judge).
	start time.Time
	// minDelay is the shortest refusal Delay seen since it was last reset.
	minDelay time.Duration
}

func (r *recorder) add(lo, hi time.Time, n int64) {
	r.began(lo)
	r.mu.Lock()
	defer r.mu.Unlock()
	for range n {
		r.permits = append(r.permits, permit{lo, hi})
	}
}

// began records that a Take started at lo.
func (r *recorder) began(lo time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.start.IsZero() || lo.Before(r.start) {
		r.start = lo
	}
}

func (r *recorder) refused(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.minDelay == 0 || d < r.minDelay {
		r.minDelay = d
	}
}

// do makes one take through value i and records its start and its
// outcome: a grant kept is recorded at [lo, hi] moved on by its Delay;
// one the caller refunds is handed back and not recorded. It returns the decision, and
// false after an error (reported).
func (b *budget) do(i int, key string, a ask, r *recorder) (throttle.Decision, bool) {
	lo := b.s.now()
	r.began(lo)
	d, err := b.take(i, key, a.n, a.maxWait)
	hi := b.s.now()
	if err != nil {
		b.t.Errorf("Take(%q, n=%d, maxWait=%v) = %v under load", key, a.n, a.maxWait, err)
		return d, false
	}
	switch {
	case !d.Granted:
		r.refused(d.Delay)
	case a.refund:
		if err := mustOf[throttle.Refunder](b.value(i)).Refund(context.Background(), key, a.n); err != nil {
			b.t.Errorf("Refund(%q, %d) = %v", key, a.n, err)
			return d, false
		}
	default:
		r.add(lo.Add(d.Delay), hi.Add(d.Delay), a.n)
	}
	return d, true
}

// fakeRounds drives key on the fake clock: each round, l.goroutines
// goroutines make one to three takes each at the same frozen instant;
// then the clock moves on, half the time to the earliest moment a refusal
// named (as Limiters would wake), otherwise by a random step of up to
// half an interval, and now and then by up to twice the time a key takes
// to be full again (an idle key). It returns what the rounds recorded.
func (b *budget) fakeRounds(key string, rounds int, l load) *recorder {
	s, r := b.s, &recorder{}
	rng := seeded(b.t, 0)
	for round := range rounds {
		if l.pause && round == rounds/3 {
			if err := b.pause(0, key, s.Interval/4); err != nil {
				b.t.Errorf("Pause(%q) under load = %v", key, err)
			}
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range l.goroutines {
			asks := make([]ask, 1+rng.IntN(3))
			for i := range asks {
				asks[i] = s.pick(rng, l)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for _, a := range asks {
					if _, ok := b.do(g, key, a, r); !ok {
						return
					}
				}
			}()
		}
		r.minDelay = 0
		close(start)
		wg.Wait()
		step := time.Duration(rng.Int64N(int64(s.Interval/2) + 1))
		switch {
		case rng.IntN(10) == 0:
			step = time.Duration(rng.Int64N(int64(2*s.horizon) + 1))
		case rng.IntN(2) == 0 && r.minDelay > 0:
			step = r.minDelay
		}
		s.wait(step)
	}
	return r
}

// realRun drives key in real time for d: each of l.goroutines goroutines
// takes, and sleeps what a refusal names (as a Limiter would) or the
// Delay of a reservation, until d has passed. It returns what the run
// recorded.
func (b *budget) realRun(key string, d time.Duration, l load) *recorder {
	b.warm(l.goroutines)
	r := &recorder{}
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	start := make(chan struct{})
	if l.pause {
		b.markPaused(key)
		p := mustOf[throttle.Pauser](b.value(0))
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			time.Sleep(d / 3)
			if err := p.Pause(context.Background(), key, b.s.Interval/4); err != nil {
				b.t.Errorf("Pause(%q) under load = %v", key, err)
			}
		}()
	}
	for g := range l.goroutines {
		rng := seeded(b.t, g)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for time.Now().Before(end) {
				dec, ok := b.do(g, key, b.s.pick(rng, l), r)
				if !ok {
					return
				}
				time.Sleep(min(dec.Delay, time.Until(end)))
			}
		}()
	}
	close(start)
	wg.Wait()
	return r
}

// runLength is how long a real-time workload runs: three intervals, and
// at least an interval past the longest period, so that every guarantee
// sees its period end.
func (s *suite) runLength() time.Duration {
	d := 3 * s.Interval
	for _, g := range s.guarantees {
		d = max(d, g.Period+s.Interval)
	}
	return d
}

// onePermitOnly reports whether some guarantee holds for takes of one
// permit only, so that a workload must not mix in weighted takes.
func (s *suite) onePermitOnly() bool {
	return slices.ContainsFunc(s.guarantees, func(g Guarantee) bool { return g.OnePermit })
}

// warmKey is the key the suite warms a bucket's connections on; nothing
// it is granted is judged.
const warmKey = "buckettest-warm-up"

// warm makes, in real time, n concurrent takes through each value of the
// budget on warmKey, so that the takes of a timed run that follows do not
// pay for opening connections or loading scripts (which can take tens of
// milliseconds under -race, and would leave their grants too uncertain
// in time to judge). Errors and refusals are ignored.
func (b *budget) warm(n int) {
	if !b.s.real() {
		return
	}
	var wg sync.WaitGroup
	for i := range n * len(b.values) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = b.value(i).Take(context.Background(), warmKey, 1, 0)
		}()
	}
	wg.Wait()
}
