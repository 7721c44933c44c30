// Package provider is a rate-limited HTTP API that counts: the stand-in
// for "the provider" in headway's end-to-end test, its examples and its
// load harness. It is for headway's own tests and demos, not for users.
//
// A Provider listens on a loopback port, answers each request 200 or 429,
// and keeps an independent record of what it saw: the arrival time of each
// request, the records named by the topic, partition and offset query
// parameters (so that a demo can count records lost or handled twice), and
// the most requests it ever saw in one window of its policy. The path
// /healthz answers 200 and is not counted, so a client can open its
// connections before a measured run.
package provider

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/headway-go/headway/internal/guarantee"
)

// Policy is how a Provider enforces its limit.
type Policy int

const (
	// Periods enforces "at most limit per period, periods at least one
	// interval apart (less the tolerance)", the guarantee of an on-demand
	// token bucket. The provider cannot see the bucket's refills, so it
	// accepts a request when some placement of period starts explains
	// every request accepted so far and this one, and answers 429 when
	// none does. That is the check of guarantee.Periods, run online.
	Periods Policy = iota
	// Aligned enforces at most limit per window [k·interval, (k+1)·interval)
	// on the wall clock.
	Aligned
	// Sliding enforces at most limit in any span of one interval.
	Sliding
)

// String names the policy.
func (p Policy) String() string {
	switch p {
	case Periods:
		return "periods"
	case Aligned:
		return "aligned windows"
	case Sliding:
		return "sliding window"
	case Leaky:
		return "leaky bucket"
	}
	return "policy(" + strconv.Itoa(int(p)) + ")"
}

// Config sets a Provider's limit and how it is enforced.
type Config struct {
	Limit    int64
	Interval time.Duration
	Policy   Policy
	// Tolerance widens period boundaries for requests that arrive a
	// little late (the time between a grant and the request reaching the
	// provider). Default: 0.
	Tolerance time.Duration
	// Latency is how long the provider takes to answer an accepted
	// request, as a real API would; the request is counted (and decided)
	// when it arrives. Default: 0, an answer at once.
	Latency time.Duration
	// Burst is the Leaky policy's burst (default 1). NoHint answers 429
	// without Retry-After, as many real providers do. Phases change the
	// limit during the run (policies.go).
	Burst  int64
	NoHint bool
	Phases []Phase
}

// Provider is a counting, limit-enforcing HTTP server on 127.0.0.1.
type Provider struct {
	cfg Config
	srv *http.Server
	ln  net.Listener

	mu        sync.Mutex
	arrivals  []time.Time // accepted requests only
	calls     []Call      // accepted requests naming a record
	rejected  int64
	seen      map[recordID]int
	periods   periodsMeter
	windowAt  int64 // start of the current aligned window, ns (Aligned)
	inWindow  int64 // accepted in the current period or window
	maxWindow int64 // most accepted in one period or window
	served    sync.WaitGroup
	started   time.Time   // for Phases and Tallies
	refusals  []time.Time // arrival times of refused requests
	tat       time.Time   // Leaky: theoretical arrival time
}

type recordID struct {
	topic     string
	partition int32
	offset    int64
}

// Call is an accepted request that named a record (topic, partition and
// offset query parameters, and optionally key), with its arrival time.
type Call struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       string
	At        time.Time
}

// Start listens on a free loopback port and serves until Close.
func Start(cfg Config) (*Provider, error) {
	if cfg.Limit < 1 || cfg.Interval <= 0 {
		return nil, fmt.Errorf("provider: limit %d per %v: need a limit ≥ 1 and a positive interval", cfg.Limit, cfg.Interval)
	}
	if cfg.Latency < 0 {
		return nil, fmt.Errorf("provider: latency %v: must not be negative", cfg.Latency)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("provider: listen: %w", err)
	}
	p := &Provider{cfg: cfg, ln: ln, seen: make(map[recordID]int), started: guarantee.Now()}
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve), ReadHeaderTimeout: 5 * time.Second}
	p.served.Add(1)
	go func() {
		defer p.served.Done()
		_ = p.srv.Serve(ln)
	}()
	return p, nil
}

// URL is the provider's base URL, like http://127.0.0.1:41234.
func (p *Provider) URL() string { return "http://" + p.ln.Addr().String() }

// Close stops the server and waits for it.
func (p *Provider) Close() error {
	err := p.srv.Close()
	p.served.Wait()
	return err
}

// HealthPath answers 200 without counting (see the package doc).
const HealthPath = "/healthz"

func (p *Provider) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == HealthPath {
		w.WriteHeader(http.StatusOK)
		return
	}
	var id recordID
	q := r.URL.Query()
	hasID := q.Has("topic")
	if hasID {
		id.topic = q.Get("topic")
		part, err1 := strconv.ParseInt(q.Get("partition"), 10, 32)
		off, err2 := strconv.ParseInt(q.Get("offset"), 10, 64)
		if err1 != nil || err2 != nil {
			http.Error(w, "partition and offset must be integers", http.StatusBadRequest)
			return
		}
		id.partition, id.offset = int32(part), off
	}
	// Decide and record under one lock, with the clock read under it:
	// requests are decided, and Calls lists them, in arrival order.
	p.mu.Lock()
	now := guarantee.Now() // the clock the buckets decide on
	ok, retry := p.admitLocked(now)
	if !ok {
		p.refusals = append(p.refusals, now)
	}
	if ok && hasID {
		p.seen[id]++
		p.calls = append(p.calls, Call{Topic: id.topic, Partition: id.partition, Offset: id.offset, Key: q.Get("key"), At: now})
	}
	p.mu.Unlock()
	if !ok && !p.cfg.NoHint {
		w.Header().Set("Retry-After", strconv.Itoa(int((retry+time.Second-1)/time.Second)))
	}
	if !ok {
		http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
		return
	}
	if p.cfg.Latency > 0 {
		t := time.NewTimer(p.cfg.Latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(`{"status":"ok"}`))
}

// admit applies the policy to a request arriving at now (not before the
// last one's).
func (p *Provider) admit(now time.Time) (bool, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.admitLocked(now)
}

func (p *Provider) admitLocked(now time.Time) (bool, time.Duration) {
	c := p.cfg
	c.Limit = p.limitAt(now)
	var retry time.Duration
	switch c.Policy {
	case Leaky:
		return p.admitLeaky(now, c.Limit)
	case Periods:
		if !p.periods.admit(now.UnixNano(), c.Limit, int64(c.Interval-c.Tolerance)) {
			p.rejected++
			return false, c.Interval
		}
		p.arrivals = append(p.arrivals, now)
		return true, 0
	case Aligned:
		w := now.UnixNano() / int64(c.Interval) * int64(c.Interval)
		if w != p.windowAt {
			p.windowAt, p.inWindow = w, 0
		}
		retry = time.Duration(w + int64(c.Interval) - now.UnixNano())
	case Sliding:
		// Count accepted arrivals within the last interval.
		from := now.Add(-c.Interval)
		i, _ := slices.BinarySearchFunc(p.arrivals, from, func(a, t time.Time) int { return a.Compare(t) })
		p.inWindow = int64(len(p.arrivals) - i)
		if p.inWindow >= c.Limit {
			retry = p.arrivals[len(p.arrivals)-int(c.Limit)].Add(c.Interval).Sub(now)
		}
	}
	if p.inWindow >= c.Limit {
		p.rejected++
		return false, max(retry, 0)
	}
	p.inWindow++
	p.maxWindow = max(p.maxWindow, p.inWindow)
	p.arrivals = append(p.arrivals, now)
	return true, 0
}

// Stats is what a Provider saw.
type Stats struct {
	// Accepted and Rejected (429) requests.
	Accepted, Rejected int64
	// MaxInWindow is the most requests accepted in one window of the
	// policy (a period, an aligned window, or any sliding span).
	MaxInWindow int64
	// MaxInAnyInterval is the most requests accepted in any span of one
	// interval, whatever the policy: at most Limit under Sliding, up to
	// twice that under Periods or Aligned (the end of one window and the
	// start of the next).
	MaxInAnyInterval int64
	// Records is how many distinct records (topic, partition, offset)
	// were accepted; Duplicates how many accepted requests named a record
	// already seen.
	Records, Duplicates int64
}

// Stats returns what the provider has seen so far.
func (p *Provider) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Stats{Accepted: int64(len(p.arrivals)), Rejected: p.rejected, MaxInWindow: p.maxWindow, Records: int64(len(p.seen))}
	if p.cfg.Policy == Periods {
		s.MaxInWindow = int64(guarantee.Periods(p.arrivals, p.cfg.Limit, p.cfg.Interval, p.cfg.Tolerance).Worst)
	}
	for _, n := range p.seen {
		s.Duplicates += int64(n - 1)
	}
	lo := 0
	for hi := range p.arrivals {
		for p.arrivals[hi].Sub(p.arrivals[lo]) >= p.cfg.Interval {
			lo++
		}
		s.MaxInAnyInterval = max(s.MaxInAnyInterval, int64(hi-lo+1))
	}
	return s
}

// Seen reports how many times the record was accepted.
func (p *Provider) Seen(topic string, partition int32, offset int64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[recordID{topic, partition, offset}]
}

// Calls returns the accepted requests that named a record, in the order of
// their arrival (not of their answers).
func (p *Provider) Calls() []Call {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

// Arrivals returns the arrival times of accepted requests, in order.
func (p *Provider) Arrivals() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.arrivals)
}

// Rate returns how many requests were accepted within the last span.
func (p *Provider) Rate(span time.Duration) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	from := guarantee.Now().Add(-span)
	i, _ := slices.BinarySearchFunc(p.arrivals, from, func(a, t time.Time) int { return a.Compare(t) })
	return int64(len(p.arrivals) - i)
}

// periodsMeter decides online whether a request can belong to some
// placement of periods (at most limit requests each, starts at least gap
// apart) that also explains every request accepted before it.
//
// For each accepted request b it keeps E[b], the earliest time a period
// opening with b can have started over all valid placements of the
// requests before it (none if no period can open there). An earlier start
// only loosens what may follow, so E is all that matters about the past:
//
//	E[0] = t0
//	E[b] = max(t[b-1], M + gap) if that is ≤ t[b], else none,
//	       M = min E[a] for a in [b-limit, b-1]
//
// A request that can open no period must join one opened within the last
// limit-1 requests; if none did, it is refused. Only the last limit
// entries matter, so memory stays bounded.
type periodsMeter struct {
	base int64   // index of t[0] and e[0] among all accepted requests
	t, e []int64 // times and E of accepted requests from base on
	// q holds indices (absolute) with E != none, E increasing: the
	// sliding-window minimum of E.
	q []int64
}

const noStart = int64(^uint64(0) >> 1)

// admit reports whether a request at t (ns, not before the last one) is
// allowed, and records it if so.
func (m *periodsMeter) admit(t, limit, gap int64) bool {
	n := m.base + int64(len(m.t)) // index the request would take
	for len(m.q) > 0 && m.q[0] < n-limit {
		m.q = m.q[1:]
	}
	e := noStart
	switch {
	case n == 0:
		e = t
	case len(m.q) > 0:
		if cand := m.at(m.e, m.q[0]) + gap; cand <= t {
			e = max(m.at(m.t, n-1), cand)
		}
	}
	if e == noStart && !(len(m.q) > 0 && m.q[0] >= n-limit+1 || len(m.q) > 1) {
		return false
	}
	m.t = append(m.t, t)
	m.e = append(m.e, e)
	if e != noStart {
		for len(m.q) > 0 && m.at(m.e, m.q[len(m.q)-1]) >= e {
			m.q = m.q[:len(m.q)-1]
		}
		m.q = append(m.q, n)
	}
	// Keep the last limit entries (and the deque's), dropping the rest.
	if keep := limit + 1; int64(len(m.t)) > 4*keep {
		drop := int64(len(m.t)) - keep
		if len(m.q) > 0 {
			drop = min(drop, m.q[0]-m.base)
		}
		if drop > 0 {
			m.t = append(m.t[:0], m.t[drop:]...)
			m.e = append(m.e[:0], m.e[drop:]...)
			m.base += drop
		}
	}
	return true
}

func (m *periodsMeter) at(s []int64, i int64) int64 { return s[i-m.base] }

// Refusals returns the arrival times of refused requests, in order.
func (p *Provider) Refusals() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.refusals)
}
