// Package llmprovider is an LLM-like API that limits requests per window
// (RPM), tokens per window (TPM) and calls in flight (a concurrency cap),
// and counts: the stand-in for OpenAI in headway's tests and examples. It
// is for headway's own tests and demos, not for users.
//
// A Provider listens on a loopback port. On each request's arrival it
// draws the call's token cost at random (seedable) between two bounds, and
// admits the call only if, counting it, no limit is exceeded: at most RPM
// calls and TPM tokens in any span of one Window (a sliding window, by
// arrival), at most Concurrency calls in flight. An admitted call is
// answered 200 after Latency with `{"usage":{"total_tokens":N}}`, so the
// caller learns its cost only after the call; a refused one 429 at once,
// with Retry-After when a window must move. Both carry OpenAI's
// x-ratelimit-* headers. The provider keeps its own record: most calls in
// flight at once, most calls and tokens in any window, refusals per
// limit, and records seen more than once (by the [RecordHeader]).
package llmprovider

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/internal/errs"
)

// RecordHeader names the record a call is for; the provider counts the
// records it admitted more than once ([Stats.Duplicates]).
const RecordHeader = "X-Record-Id"

// RefusedHeader, on a 429, names the limit that refused the call:
// "requests", "tokens" or "concurrency".
const RefusedHeader = "X-Refused-By"

// HealthPath answers 200 without counting, so that a client can open its
// connections before a measured run.
const HealthPath = "/healthz"

// Config sets a Provider's limits. A limit of 0 is no limit.
type Config struct {
	// RPM is the most calls admitted in any span of one Window.
	RPM int64
	// TPM is the most tokens admitted in any span of one Window, each
	// call counted at its arrival with its drawn cost.
	TPM int64
	// Concurrency is the most calls in flight at once, from arrival until
	// the answer is written (a caller holding the answer never finds its
	// call still counted).
	Concurrency int
	// Window is the span RPM and TPM count over. Default: one minute
	// (tests use a second).
	Window time.Duration
	// MinTokens and MaxTokens bound each call's cost, drawn uniformly
	// (both included). Default: 1 each. Seed seeds the draws.
	MinTokens, MaxTokens int64
	Seed                 uint64
	// Latency is how long an admitted call takes to answer.
	Latency time.Duration
	// Clock is the provider's clock: arrivals, windows and latency.
	// Default: the real clock.
	Clock clockwork.Clock
}

// Provider is a counting, limit-enforcing LLM-like HTTP server on
// 127.0.0.1. Build it with [Start]; stop it with Close.
type Provider struct {
	cfg   Config
	clock clockwork.Clock
	srv   *http.Server
	ln    net.Listener
	done  sync.WaitGroup

	mu       sync.Mutex
	rng      *rand.Rand
	window   []arrival // admitted calls within the last Window, oldest first
	inWindow int64     // tokens of window
	inFlight int
	seen     map[string]int
	stats    Stats
	all      []arrival // every admitted call, for Tallies
}

// arrival is an admitted call: when it arrived and what it cost.
type arrival struct {
	at     time.Time
	tokens int64
}

// Tally is what a Provider admitted in one window.
type Tally struct{ Requests, Tokens int64 }

// Tallies returns the calls and tokens admitted in each consecutive
// Window from the first admitted call's arrival (the last one partial).
func (p *Provider) Tallies() []Tally {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.all) == 0 {
		return nil
	}
	first := p.all[0].at
	out := make([]Tally, int(p.all[len(p.all)-1].at.Sub(first)/p.cfg.Window)+1)
	for _, a := range p.all {
		t := &out[int(a.at.Sub(first)/p.cfg.Window)]
		t.Requests++
		t.Tokens += a.tokens
	}
	return out
}

// Stats is what a Provider counted, by arrival.
type Stats struct {
	// Accepted calls, and the tokens they cost.
	Accepted, Tokens int64
	// Refused calls (429), in all and per limit.
	Refused, RefusedRequests, RefusedTokens, RefusedConcurrency int64
	// MaxInFlight is the most calls in flight at once.
	MaxInFlight int
	// MaxRequestsInWindow and MaxTokensInWindow are the most calls and
	// tokens admitted in any span of one Window.
	MaxRequestsInWindow, MaxTokensInWindow int64
	// Records is how many distinct records (RecordHeader) were admitted;
	// Duplicates how many admitted calls named a record already seen.
	Records, Duplicates int64
}

// String is a one-line summary.
func (s Stats) String() string {
	return fmt.Sprintf("%d calls accepted (%d tokens), %d refused (requests %d, tokens %d, concurrency %d); at most %d in flight, %d calls and %d tokens in one window; %d records, %d duplicates",
		s.Accepted, s.Tokens, s.Refused, s.RefusedRequests, s.RefusedTokens, s.RefusedConcurrency,
		s.MaxInFlight, s.MaxRequestsInWindow, s.MaxTokensInWindow, s.Records, s.Duplicates)
}

// Start checks cfg, listens on a free loopback port and serves until
// Close. Bad values are refused with an error naming the field.
func Start(cfg Config) (*Provider, error) {
	if cfg.Window == 0 {
		cfg.Window = time.Minute
	}
	if cfg.MinTokens == 0 && cfg.MaxTokens == 0 {
		cfg.MinTokens, cfg.MaxTokens = 1, 1
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	const pkg = "llmprovider: Start"
	switch {
	case cfg.RPM < 0:
		return nil, errs.Invalid(pkg, "RPM", cfg.RPM, "must be 0 (no limit) or more")
	case cfg.TPM < 0:
		return nil, errs.Invalid(pkg, "TPM", cfg.TPM, "must be 0 (no limit) or more")
	case cfg.Concurrency < 0:
		return nil, errs.Invalid(pkg, "Concurrency", cfg.Concurrency, "must be 0 (no limit) or more")
	case cfg.Window < 0:
		return nil, errs.Invalid(pkg, "Window", cfg.Window, "must be positive")
	case cfg.MinTokens < 1:
		return nil, errs.Invalid(pkg, "MinTokens", cfg.MinTokens, "must be at least 1")
	case cfg.MaxTokens < cfg.MinTokens:
		return nil, errs.Invalid(pkg, "MaxTokens", cfg.MaxTokens, "must be at least MinTokens")
	case cfg.TPM > 0 && cfg.MaxTokens > cfg.TPM:
		return nil, errs.Invalid(pkg, "MaxTokens", cfg.MaxTokens, "must be at most TPM, or some calls could never pass")
	case cfg.Latency < 0:
		return nil, errs.Invalid(pkg, "Latency", cfg.Latency, "must not be negative")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("llmprovider: listen: %w", err)
	}
	p := &Provider{
		cfg:   cfg,
		clock: cfg.Clock,
		ln:    ln,
		rng:   rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		seen:  make(map[string]int),
	}
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve), ReadHeaderTimeout: 5 * time.Second}
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		_ = p.srv.Serve(ln)
	}()
	return p, nil
}

// URL is the provider's base URL, like http://127.0.0.1:41234.
func (p *Provider) URL() string { return "http://" + p.ln.Addr().String() }

// Close stops the server, ending calls in flight, and waits for it.
func (p *Provider) Close() error {
	err := p.srv.Close()
	p.done.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// Stats returns what the provider counted so far.
func (p *Provider) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Records = int64(len(p.seen))
	return s
}

// Seen reports how many times a call for record id was admitted.
func (p *Provider) Seen(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[id]
}

// decision is what the provider decided on a call's arrival, and the
// state of its limits for the headers.
type decision struct {
	refusedBy  string        // "" when admitted
	retry      time.Duration // on a refusal by a window: until the call would pass
	tokens     int64         // the call's cost
	remReq     int64
	remTok     int64
	resetReq   time.Duration
	resetTok   time.Duration
	reqLimited bool
	tokLimited bool
}

func (p *Provider) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == HealthPath {
		w.WriteHeader(http.StatusOK)
		return
	}
	d := p.arrive(r.Header.Get(RecordHeader))
	p.headers(w.Header(), d)
	if d.refusedBy != "" {
		w.Header().Set(RefusedHeader, d.refusedBy)
		if d.retry > 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(int64((d.retry+time.Second-1)/time.Second), 10))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintf(w, `{"error":{"type":"rate_limit_exceeded","message":"%s limit reached"}}`, d.refusedBy)
		return
	}
	if p.cfg.Latency > 0 {
		t := p.clock.NewTimer(p.cfg.Latency)
		select {
		case <-t.Chan():
		case <-r.Context().Done():
			t.Stop()
			p.leave()
			return
		}
	}
	// The call leaves before its answer is written: a caller that
	// starts another once it has the answer never finds this one still
	// counted.
	p.leave()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"usage":{"total_tokens":%d}}`, d.tokens)
}

// arrive decides a call arriving now, counts it, and returns the decision.
func (p *Provider) arrive(record string) decision {
	c := p.cfg
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	// Drop the calls that left the window: the window holds arrivals
	// less than one Window before now.
	drop := 0
	for drop < len(p.window) && now.Sub(p.window[drop].at) >= c.Window {
		p.inWindow -= p.window[drop].tokens
		drop++
	}
	p.window = p.window[drop:]
	d := decision{tokens: c.MinTokens + p.rng.Int64N(c.MaxTokens-c.MinTokens+1)}
	switch {
	case c.Concurrency > 0 && p.inFlight >= c.Concurrency:
		d.refusedBy = "concurrency"
		p.stats.RefusedConcurrency++
	case c.RPM > 0 && int64(len(p.window))+1 > c.RPM:
		d.refusedBy = "requests"
		d.retry = p.window[len(p.window)-int(c.RPM)].at.Add(c.Window).Sub(now)
		p.stats.RefusedRequests++
	case c.TPM > 0 && p.inWindow+d.tokens > c.TPM:
		d.refusedBy = "tokens"
		// Until enough of the oldest calls leave the window.
		need := p.inWindow + d.tokens - c.TPM
		for _, a := range p.window {
			need -= a.tokens
			if need <= 0 {
				d.retry = a.at.Add(c.Window).Sub(now)
				break
			}
		}
		p.stats.RefusedTokens++
	}
	if d.refusedBy != "" {
		p.stats.Refused++
	} else {
		p.window = append(p.window, arrival{at: now, tokens: d.tokens})
		p.all = append(p.all, arrival{at: now, tokens: d.tokens})
		p.inWindow += d.tokens
		p.inFlight++
		s := &p.stats
		s.Accepted++
		s.Tokens += d.tokens
		s.MaxInFlight = max(s.MaxInFlight, p.inFlight)
		s.MaxRequestsInWindow = max(s.MaxRequestsInWindow, int64(len(p.window)))
		s.MaxTokensInWindow = max(s.MaxTokensInWindow, p.inWindow)
		if record != "" {
			if p.seen[record] > 0 {
				s.Duplicates++
			}
			p.seen[record]++
		}
	}
	// What remains, and when the oldest counted call leaves the window.
	var reset time.Duration
	if len(p.window) > 0 {
		reset = p.window[0].at.Add(c.Window).Sub(now)
	}
	d.reqLimited, d.tokLimited = c.RPM > 0, c.TPM > 0
	d.remReq, d.remTok = c.RPM-int64(len(p.window)), c.TPM-p.inWindow
	d.resetReq, d.resetTok = reset, reset
	return d
}

// leave ends an admitted call.
func (p *Provider) leave() {
	p.mu.Lock()
	p.inFlight--
	p.mu.Unlock()
}

// headers writes OpenAI's x-ratelimit-* headers for the limits set: the
// limit, what remains of it in the window (after this call, when
// admitted), and when some of it comes back (the oldest counted call
// leaves the window), as a Go duration.
func (p *Provider) headers(h http.Header, d decision) {
	if d.reqLimited {
		h.Set("X-Ratelimit-Limit-Requests", strconv.FormatInt(p.cfg.RPM, 10))
		h.Set("X-Ratelimit-Remaining-Requests", strconv.FormatInt(d.remReq, 10))
		h.Set("X-Ratelimit-Reset-Requests", d.resetReq.String())
	}
	if d.tokLimited {
		h.Set("X-Ratelimit-Limit-Tokens", strconv.FormatInt(p.cfg.TPM, 10))
		h.Set("X-Ratelimit-Remaining-Tokens", strconv.FormatInt(d.remTok, 10))
		h.Set("X-Ratelimit-Reset-Tokens", d.resetTok.String())
	}
}
