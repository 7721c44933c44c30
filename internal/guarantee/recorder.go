package guarantee

import (
	"math/bits"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"time"
)

// Recorder collects grant times from many goroutines. Call [Recorder.Record]
// right after each grant (when Acquire returns nil), then hand
// [Recorder.Times] to a checker once the goroutines are done.
//
// A Recorder is safe for concurrent use and cheap under contention: a
// record is one append to one of several locked shards, chosen at random,
// so goroutines rarely wait for one another. Its zero value is ready to use.
//
// Times are readings of the wall clock ([Now]), the clock the buckets
// decide on.
type Recorder struct {
	once   sync.Once
	shards []recShard
}

type recShard struct {
	mu sync.Mutex
	ns []int64  // wall-clock readings, ns since the Unix epoch
	_  [32]byte // one shard per cache line
}

func (r *Recorder) init() {
	r.once.Do(func() {
		n := 1 << bits.Len(uint(4*runtime.GOMAXPROCS(0)-1)) // ≥ 4 per P, a power of two
		r.shards = make([]recShard, max(n, 8))
	})
}

// Now reads the wall clock without a monotonic reading: the clock the
// buckets decide on (see the package doc's Clock). Use it for every grant
// or arrival time handed to a checker.
func Now() time.Time { return time.Now().Round(0) }

// Record records a grant now.
func (r *Recorder) Record() {
	r.init()
	r.add(Now().UnixNano())
}

// RecordAt records a grant at t, for callers that read the clock
// themselves (for instance before doing other work with the permit).
func (r *Recorder) RecordAt(t time.Time) {
	r.init()
	r.add(t.UnixNano())
}

func (r *Recorder) add(d int64) {
	s := &r.shards[rand.Uint32()&uint32(len(r.shards)-1)]
	s.mu.Lock()
	s.ns = append(s.ns, d)
	s.mu.Unlock()
}

// Len returns how many grants have been recorded so far.
func (r *Recorder) Len() int {
	r.init()
	n := 0
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		n += len(s.ns)
		s.mu.Unlock()
	}
	return n
}

// Times returns the recorded grant times, sorted. It may be called while
// goroutines still record; it then returns a snapshot.
func (r *Recorder) Times() []time.Time {
	r.init()
	var all []int64
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		all = append(all, s.ns...)
		s.mu.Unlock()
	}
	slices.Sort(all)
	out := make([]time.Time, len(all))
	for i, d := range all {
		out[i] = time.Unix(0, d)
	}
	return out
}
