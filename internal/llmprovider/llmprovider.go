// Package llmprovider is an LLM-like API that limits requests per window
// (RPM), tokens per window (TPM) and calls in flight (a concurrency cap),
// and counts: the stand-in for OpenAI in headway's tests and examples. It
// is for headway's own tests and demos, not for users.
//
// A Provider listens on a loopback port. On each request's arrival it
// draws the call's token cost at random (seedable) between two bounds, and
// admits the call only if, counting it, no limit is exceeded: RPM calls
// and TPM tokens per Window, counted as [Config.Counting] says (a sliding
// window, by arrival, or buckets refilled continuously), and at most
// Concurrency calls in flight. An admitted call is answered 200 after
// Latency with OpenAI's usage (`{"usage":{"prompt_tokens":P,
// "completion_tokens":C,"total_tokens":N}}`), so the caller learns its
// cost only after the call; a refused one 429 at once, with Retry-After
// when a window must move. Both carry the rate-limit headers of
// [Config.Headers] (OpenAI's by default). A
// call whose caller goes away before its answer still runs, and counts
// in flight, until its Latency is over, as at a real provider. The
// provider keeps its own record: most calls in flight at once, most calls
// and tokens in any window, refusals per limit, calls cut by their
// caller, and records seen more than once (by the [RecordHeader]).
package llmprovider

import (
	"errors"
	"fmt"
	"io"
	"math"
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

// Counting says how a Provider counts RPM and TPM.
type Counting int

const (
	// Sliding admits at most RPM calls and TPM tokens in any span of one
	// Window, by arrival: a call's share comes back one Window after it
	// arrived.
	Sliding Counting = iota
	// Continuous keeps a bucket per limit, of RPM calls and TPM tokens,
	// full at the start and refilled continuously at RPM (TPM) per Window,
	// as Anthropic documents its limits: a call passes when the bucket
	// holds its share. Any span of one Window admits at most twice the
	// limit (a full bucket, then a Window's refill).
	Continuous
	// Fixed admits at most RPM calls and TPM tokens in each window of one
	// Window, the windows following each other from the provider's
	// start: what a window admitted counts no more at its end.
	Fixed
)

// String names the counting, as examples/llm's -provider flag does.
func (c Counting) String() string {
	switch c {
	case Sliding:
		return "sliding"
	case Fixed:
		return "fixed"
	case Continuous:
		return "continuous"
	}
	return fmt.Sprintf("Counting(%d)", int(c))
}

// Config sets a Provider's limits. A limit of 0 is no limit.
type Config struct {
	// RPM is the most calls admitted per Window, counted as Counting says.
	RPM int64
	// TPM is the most tokens admitted per Window, each call counted at
	// its arrival with its drawn cost.
	TPM int64
	// Counting says how RPM and TPM are counted. Default: Sliding.
	Counting Counting
	// Concurrency is the most calls in flight at once, from arrival until
	// the answer is written (a caller holding the answer never finds its
	// call still counted), or, for a call its caller abandoned, until its
	// Latency is over.
	Concurrency int
	// Window is the span RPM and TPM count over. Default: one minute
	// (tests use a second).
	Window time.Duration
	// MinTokens and MaxTokens bound each call's cost, drawn uniformly
	// (both included). Default: 1 each. Seed seeds the draws.
	MinTokens, MaxTokens int64
	Seed                 uint64
	// Latency is how long an admitted call takes to answer, give or take
	// Jitter: each call's is drawn uniformly from Latency-Jitter to
	// Latency+Jitter (Jitter at most Latency).
	Latency, Jitter time.Duration
	// Clock is the provider's clock: arrivals, windows and latency.
	// Default: the real clock.
	Clock clockwork.Clock
	// Headers says whose rate-limit headers every answer carries:
	// OpenAI's (x-ratelimit-{limit,remaining,reset}-{requests,tokens},
	// the reset a Go duration until the limit is fully restored) or
	// Anthropic's (anthropic-ratelimit-{requests,tokens}-{limit,
	// remaining,reset}, the reset an RFC 3339 time at which it is).
	// Default: OpenAI.
	Headers Headers
}

// Headers names a provider's rate-limit headers.
type Headers int

const (
	// OpenAI's x-ratelimit-* headers.
	OpenAI Headers = iota
	// Anthropic's anthropic-ratelimit-* headers.
	Anthropic
)

// String names the headers' provider: "OpenAI" or "Anthropic".
func (h Headers) String() string {
	if h == Anthropic {
		return "Anthropic"
	}
	return "OpenAI"
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
	running  []time.Time // when the abandoned calls still counted in flight end
	seen     map[string]int
	// Continuous counting: what the buckets hold, as of filled.
	reqLevel, tokLevel float64
	filled             time.Time
	// Fixed counting: the running window's start and what it admitted.
	started            time.Time
	fixedStart         time.Time
	fixedReq, fixedTok int64
	stats              Stats
	all                []arrival // every admitted call, for Tallies
}

// arrival is an admitted call: when it arrived, what it cost, and how
// long it ran.
type arrival struct {
	at     time.Time
	tokens int64
	busy   time.Duration
}

// Tally is what a Provider admitted in one window: calls, tokens, and
// the time they ran (the sum of their latencies: divided by the window
// and the concurrency limit, the share of the limit they used).
type Tally struct {
	Requests, Tokens int64
	Busy             time.Duration
}

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
		t.Busy += a.busy
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
	// Cut is how many admitted calls their caller abandoned before the
	// answer (its deadline, say): the provider ran them all the same.
	Cut int64
	// Records is how many distinct records (RecordHeader) were admitted;
	// Duplicates how many admitted calls named a record already seen.
	Records, Duplicates int64
}

// String is a one-line summary.
func (s Stats) String() string {
	return fmt.Sprintf("%d calls accepted (%d tokens), %d refused (requests %d, tokens %d, concurrency %d), %d cut by their caller; at most %d in flight, %d calls and %d tokens in one window; %d records, %d duplicates",
		s.Accepted, s.Tokens, s.Refused, s.RefusedRequests, s.RefusedTokens, s.RefusedConcurrency, s.Cut,
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
	case cfg.Jitter < 0 || cfg.Jitter > cfg.Latency:
		return nil, errs.Invalid(pkg, "Jitter", cfg.Jitter, "must be between 0 and Latency")
	case cfg.Headers != OpenAI && cfg.Headers != Anthropic:
		return nil, errs.Invalid(pkg, "Headers", int(cfg.Headers), "must be OpenAI or Anthropic")
	case cfg.Counting != Sliding && cfg.Counting != Continuous && cfg.Counting != Fixed:
		return nil, errs.Invalid(pkg, "Counting", int(cfg.Counting), "must be Sliding, Continuous or Fixed")
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
	p.reqLevel, p.tokLevel, p.filled = float64(cfg.RPM), float64(cfg.TPM), cfg.Clock.Now()
	p.started = p.filled
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
	at         time.Time     // the call's arrival
	retry      time.Duration // on a refusal by a window: until the call would pass
	tokens     int64         // the call's cost
	end        time.Time     // when an admitted call's latency is over
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
	// The request arrives whole: read, the server then sees its caller
	// go away (r.Context ends), as a provider's streaming answer would.
	_, _ = io.Copy(io.Discard, r.Body)
	d := p.arrive(r.Header.Get(RecordHeader))
	p.headers(w.Header(), d, d.at)
	// The answer's Date, on the provider's clock: the time Anthropic's
	// absolute resets are read against.
	date := func() { w.Header().Set("Date", p.clock.Now().UTC().Format(http.TimeFormat)) }
	if d.refusedBy != "" {
		date()
		w.Header().Set(RefusedHeader, d.refusedBy)
		if d.retry > 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(int64((d.retry+time.Second-1)/time.Second), 10))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintf(w, `{"error":{"type":"rate_limit_exceeded","message":"%s limit reached"}}`, d.refusedBy)
		return
	}
	if lat := d.end.Sub(d.at); lat > 0 {
		t := p.clock.NewTimer(lat)
		select {
		case <-t.Chan():
		case <-r.Context().Done():
			// The caller went away; the call runs on, in flight, until
			// its latency is over (counted out at a later arrival).
			t.Stop()
			p.abandon(d.end)
			return
		}
	}
	// The call leaves before its answer is written: a caller that
	// starts another once it has the answer never finds this one still
	// counted.
	p.leave()
	date()
	w.Header().Set("Content-Type", "application/json")
	prompt := d.tokens / 2
	fmt.Fprintf(w, `{"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`, prompt, d.tokens-prompt, d.tokens)
}

// abandon counts an admitted call whose caller went away: cut, and in
// flight until end.
func (p *Provider) abandon(end time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.Cut++
	p.running = append(p.running, end)
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
	// Abandoned calls whose latency is over leave.
	kept := p.running[:0]
	for _, end := range p.running {
		if end.After(now) {
			kept = append(kept, end)
		} else {
			p.inFlight--
		}
	}
	p.running = kept
	lat := c.Latency
	if c.Jitter > 0 {
		lat += time.Duration(p.rng.Int64N(int64(2*c.Jitter)+1)) - c.Jitter
	}
	d := decision{tokens: c.MinTokens + p.rng.Int64N(c.MaxTokens-c.MinTokens+1), at: now, end: now.Add(lat)}
	switch c.Counting {
	case Continuous:
		p.continuous(now, &d)
	case Fixed:
		p.fixed(now, &d)
	default:
		p.sliding(now, &d)
	}
	if d.refusedBy != "" {
		p.stats.Refused++
		return d
	}
	p.window = append(p.window, arrival{at: now, tokens: d.tokens})
	p.all = append(p.all, arrival{at: now, tokens: d.tokens, busy: d.end.Sub(now)})
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
	return d
}

// sliding decides d by the calls and tokens of the last Window, and sets
// the headers' state: what remains after the call, and when the oldest
// counted call leaves the window.
func (p *Provider) sliding(now time.Time, d *decision) {
	c := p.cfg
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
	// What remains, counting this call if admitted, and when the limits
	// are fully restored, as OpenAI's reset means it: when the newest
	// counted call leaves the window (this one, if admitted).
	n, tok := int64(len(p.window)), p.inWindow
	var reset time.Duration
	switch {
	case d.refusedBy == "":
		reset = c.Window
	case len(p.window) > 0:
		reset = p.window[len(p.window)-1].at.Add(c.Window).Sub(now)
	}
	if d.refusedBy == "" {
		n, tok = n+1, tok+d.tokens
	}
	d.reqLimited, d.tokLimited = c.RPM > 0, c.TPM > 0
	d.remReq, d.remTok = c.RPM-n, c.TPM-tok
	d.resetReq, d.resetTok = reset, reset
}

// fixed decides d by the calls and tokens of the running fixed window
// (from the provider's start), and sets the headers' state: what remains
// after the call, and when the window ends.
func (p *Provider) fixed(now time.Time, d *decision) {
	c := p.cfg
	start := p.started.Add(now.Sub(p.started) / c.Window * c.Window)
	if !p.fixedStart.Equal(start) {
		p.fixedStart, p.fixedReq, p.fixedTok = start, 0, 0
	}
	reset := start.Add(c.Window).Sub(now)
	switch {
	case c.Concurrency > 0 && p.inFlight >= c.Concurrency:
		d.refusedBy = "concurrency"
		p.stats.RefusedConcurrency++
	case c.RPM > 0 && p.fixedReq+1 > c.RPM:
		d.refusedBy, d.retry = "requests", reset
		p.stats.RefusedRequests++
	case c.TPM > 0 && p.fixedTok+d.tokens > c.TPM:
		d.refusedBy, d.retry = "tokens", reset
		p.stats.RefusedTokens++
	default:
		p.fixedReq++
		p.fixedTok += d.tokens
	}
	d.reqLimited, d.tokLimited = c.RPM > 0, c.TPM > 0
	d.remReq, d.remTok = c.RPM-p.fixedReq, c.TPM-p.fixedTok
	d.resetReq, d.resetTok = reset, reset
}

// continuous decides d by the buckets refilled continuously, takes the
// call's share when admitted, and sets the headers' state: what the
// buckets hold after the call, and when they are full again.
func (p *Provider) continuous(now time.Time, d *decision) {
	c := p.cfg
	if el := now.Sub(p.filled); el > 0 {
		frac := float64(el) / float64(c.Window)
		p.reqLevel = min(float64(c.RPM), p.reqLevel+frac*float64(c.RPM))
		p.tokLevel = min(float64(c.TPM), p.tokLevel+frac*float64(c.TPM))
		p.filled = now
	}
	// until is how long a bucket of limit takes to hold need from level.
	until := func(level, need float64, limit int64) time.Duration {
		if level >= need {
			return 0
		}
		return time.Duration(math.Ceil((need - level) / float64(limit) * float64(c.Window)))
	}
	switch {
	case c.Concurrency > 0 && p.inFlight >= c.Concurrency:
		d.refusedBy = "concurrency"
		p.stats.RefusedConcurrency++
	case c.RPM > 0 && p.reqLevel < 1:
		d.refusedBy = "requests"
		d.retry = until(p.reqLevel, 1, c.RPM)
		p.stats.RefusedRequests++
	case c.TPM > 0 && p.tokLevel < float64(d.tokens):
		d.refusedBy = "tokens"
		d.retry = until(p.tokLevel, float64(d.tokens), c.TPM)
		p.stats.RefusedTokens++
	default:
		p.reqLevel--
		p.tokLevel -= float64(d.tokens)
	}
	d.reqLimited, d.tokLimited = c.RPM > 0, c.TPM > 0
	d.remReq, d.remTok = int64(math.Floor(p.reqLevel)), int64(math.Floor(p.tokLevel))
	d.resetReq = until(p.reqLevel, float64(c.RPM), c.RPM)
	d.resetTok = until(p.tokLevel, float64(c.TPM), c.TPM)
}

// leave ends an admitted call.
func (p *Provider) leave() {
	p.mu.Lock()
	p.inFlight--
	p.mu.Unlock()
}

// headers writes the rate-limit headers of Config.Headers for the limits
// set: the limit, what remains of it in the window (after this call, when
// admitted), and when it is fully restored (OpenAI: as a Go duration
// from the call's arrival; Anthropic: as an RFC 3339 time, read against
// the answer's Date).
func (p *Provider) headers(h http.Header, d decision, now time.Time) {
	dims := []struct {
		limited    bool
		name       string
		limit, rem int64
		reset      time.Duration
	}{
		{d.reqLimited, "requests", p.cfg.RPM, d.remReq, d.resetReq},
		{d.tokLimited, "tokens", p.cfg.TPM, d.remTok, d.resetTok},
	}
	for _, dim := range dims {
		if !dim.limited {
			continue
		}
		if p.cfg.Headers == Anthropic {
			h.Set("Anthropic-Ratelimit-"+dim.name+"-Limit", strconv.FormatInt(dim.limit, 10))
			h.Set("Anthropic-Ratelimit-"+dim.name+"-Remaining", strconv.FormatInt(max(dim.rem, 0), 10))
			h.Set("Anthropic-Ratelimit-"+dim.name+"-Reset", now.Add(dim.reset).UTC().Format(time.RFC3339Nano))
			continue
		}
		h.Set("X-Ratelimit-Limit-"+dim.name, strconv.FormatInt(dim.limit, 10))
		h.Set("X-Ratelimit-Remaining-"+dim.name, strconv.FormatInt(max(dim.rem, 0), 10))
		h.Set("X-Ratelimit-Reset-"+dim.name, dim.reset.String())
	}
}
