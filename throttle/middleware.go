package throttle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/internal/slarules"
)

// SLA is one limit a provider publishes and [Middleware] enforces: calls
// matching Methods and Path, counted per tenant, must pass every tier.
// Package github.com/headway-go/headway/throttle/sla loads SLAs from YAML.
type SLA struct {
	// ID names the SLA in bucket keys and headers: 1 to 128 letters,
	// digits, '.', '_' or '-'. IDs must be unique.
	ID string
	// Methods are the HTTP methods the SLA covers, upper case ("GET").
	// Empty: every method. HEAD does not match GET implicitly.
	Methods []string
	// Path is a pattern in the syntax of [path.Match] matched against the
	// request's URL path: '*' matches one path segment, so "/product/*"
	// matches "/product/1" but not "/product/1/reviews". Empty: every path.
	Path string
	// Tenant returns the tenant a request is counted for, such as
	// [TenantHeader] or [TenantPathSegment]. Each tenant has its own
	// budget: one tenant's excess never refuses another tenant's calls.
	// Requests without a tenant ("") share one budget. A tenant longer
	// than 128 bytes is counted under its SHA-256, so that keys stay
	// short. Nil: the header X-Tenant-Id.
	Tenant func(*http.Request) string
	// Sliding counts calls in a window of Period sliding with time (seed
	// 003) instead of fixed windows aligned to multiples of Period since
	// the Unix epoch (seed 000, the default). The [BucketFactory] reads it.
	Sliding bool
	// Tiers must all pass for a call to be served; a refused call
	// consumes nothing in any tier. At least one.
	Tiers []Tier
}

// Tier is one limit of an [SLA]: at most Limit calls per Period (the
// "threshold" of a seed-000 YAML tier).
type Tier struct {
	// Limit is how many calls a tenant may make per Period; at least 1.
	Limit int64
	// Period is the window's length; positive.
	Period time.Duration
}

// maxTenantLen is the longest tenant used in a key as it is; longer ones
// are replaced by their SHA-256.
const maxTenantLen = 128

// DefaultTenantHeader is the header an [SLA] with a nil Tenant reads the
// tenant from.
const DefaultTenantHeader = "X-Tenant-Id"

// TenantHeader returns a tenant function for [SLA.Tenant] that reads the
// tenant from the request header name.
func TenantHeader(name string) func(*http.Request) string {
	return func(r *http.Request) string { return r.Header.Get(name) }
}

// TenantPathSegment returns a tenant function for [SLA.Tenant] that reads
// the tenant from the i-th segment of the request's URL path, counting
// from 0 after the leading slash: in "/v1/organizations/acme/product/7",
// segment 2 is "acme". A path too short (or a negative i) gives "".
func TenantPathSegment(i int) func(*http.Request) string {
	return func(r *http.Request) string {
		if i < 0 {
			return ""
		}
		p := strings.TrimPrefix(r.URL.Path, "/")
		for j := 0; j < i; j++ {
			_, rest, ok := strings.Cut(p, "/")
			if !ok {
				return ""
			}
			p = rest
		}
		seg, _, _ := strings.Cut(p, "/")
		return seg
	}
}

// BucketFactory builds the bucket that enforces one SLA: every tier of
// it, all-or-nothing, per key. [NewMiddleware] calls it once per SLA and
// takes one permit per matching request under the key "<ID>:<tenant>".
//
// [LocalWindows] is the in-memory factory. For a fleet, wire a Redis
// bucket from package github.com/headway-go/headway/bucket (its Tiers
// bucket over fixed windows, or its sliding log when s.Sliding is true).
type BucketFactory func(s SLA) (Bucket, error)

// Middleware enforces SLAs on an http.Handler: per SLA and per tenant, in
// front of the handler. Build it with [NewMiddleware] and wrap handlers
// with [Middleware.Wrap]. It is safe for concurrent use.
//
// A request is counted under the first SLA (in the order given) whose
// methods and path match it; a request matching none is served unlimited
// and without headers. A counted request gets:
//
//   - X-RateLimit-Limit: the threshold of the tier the bucket reports
//     (for several tiers, the one nearest its limit);
//   - X-RateLimit-Remaining: the calls left in that tier's window after
//     this one;
//   - X-RateLimit-Reset: whole seconds, rounded up, until that window
//     ends;
//
// and, with [WithDraftHeaders], the IETF draft RateLimit-Policy and
// RateLimit fields. A refused request is answered 429 Too Many Requests
// with Retry-After (whole seconds, at least 1) and never reaches the
// handler. When the bucket's store fails, the request is served without
// headers and the failure logged, unless [WithFailClosed] asks for 503.
type Middleware struct {
	rules []rule
	cfg   middlewareConfig
	log   *slog.Logger
	// storeTimeout bounds each bucket call ([WithStoreTimeout]).
	storeTimeout time.Duration
}

type rule struct {
	sla     SLA
	methods map[string]bool // nil: any
	tenant  func(*http.Request) string
	bucket  Bucket
	policy  string // RateLimit-Policy value
}

// MiddlewareOption is an [Option] for [NewMiddleware] only; other
// constructors ignore it.
type MiddlewareOption interface {
	Option
	middleware(*middlewareConfig)
}

type middlewareConfig struct {
	draft      bool // WithDraftHeaders
	failClosed bool // WithFailClosed
}

type middlewareOption func(*middlewareConfig)

func (middlewareOption) apply(*config)                    {}
func (f middlewareOption) middleware(c *middlewareConfig) { f(c) }

// WithDraftHeaders makes [Middleware] also send the fields of the IETF
// draft "RateLimit header fields for HTTP" (draft-ietf-httpapi-ratelimit-
// headers, versions -07 on): RateLimit-Policy lists every tier of the SLA
// as `"<ID>/<period>";q=<threshold>;w=<seconds>`, and RateLimit gives the
// reported tier's `"<ID>/<period>";r=<remaining>;t=<seconds>`. Default: off.
func WithDraftHeaders() MiddlewareOption {
	return middlewareOption(func(c *middlewareConfig) { c.draft = true })
}

// WithFailClosed makes [Middleware] answer 503 Service Unavailable when a
// bucket's store fails, instead of serving the request unlimited (the
// default, so that a Redis outage does not become an outage of the API).
func WithFailClosed() MiddlewareOption {
	return middlewareOption(func(c *middlewareConfig) { c.failClosed = true })
}

// NewMiddleware checks slas, builds one bucket per SLA with newBucket, and
// returns the Middleware enforcing them. Options: [WithDraftHeaders],
// [WithFailClosed], [WithLogger], [WithStoreTimeout] (each bucket call is
// bounded by it, so a hung store delays a request by at most that).
//
// It refuses, with an error matching [ErrInvalid] that names the SLA and
// the field: an empty or malformed or repeated ID, no tiers, a period
// that is not positive or repeats within an SLA, a threshold below 1, a
// method that is not an upper-case token, a malformed path pattern, a nil
// newBucket. An error from newBucket is returned wrapped.
func NewMiddleware(slas []SLA, newBucket BucketFactory, opts ...Option) (*Middleware, error) {
	if newBucket == nil {
		return nil, Invalid("throttle: NewMiddleware", "newBucket", nil, "must be a BucketFactory such as throttle.LocalWindows()")
	}
	base := newConfig(opts)
	m := &Middleware{log: base.logger, storeTimeout: base.storeTimeout}
	for _, o := range opts {
		if mo, ok := o.(MiddlewareOption); ok {
			mo.middleware(&m.cfg)
		}
	}
	seen := make(map[string]bool, len(slas))
	for i, s := range slas {
		if err := validateSLA(s); err != nil {
			return nil, fmt.Errorf("throttle: NewMiddleware: slas[%d]: %w", i, err)
		}
		if seen[s.ID] {
			return nil, fmt.Errorf("throttle: NewMiddleware: slas[%d]: %w", i, Invalid("SLA", "ID", strconv.Quote(s.ID), "must be unique; an earlier SLA has it"))
		}
		seen[s.ID] = true
		s.Methods = append([]string(nil), s.Methods...)
		s.Tiers = append([]Tier(nil), s.Tiers...)
		r := rule{sla: s, tenant: s.Tenant}
		if r.tenant == nil {
			r.tenant = TenantHeader(DefaultTenantHeader)
		}
		if len(s.Methods) > 0 {
			r.methods = make(map[string]bool, len(s.Methods))
			for _, meth := range s.Methods {
				r.methods[meth] = true
			}
		}
		var policy []string
		for _, t := range s.Tiers {
			policy = append(policy, fmt.Sprintf("%q;q=%d;w=%d", policyName(s.ID, t), t.Limit, max(1, ceilSeconds(t.Period))))
		}
		r.policy = strings.Join(policy, ", ")
		b, err := newBucket(s)
		if err != nil {
			return nil, fmt.Errorf("throttle: NewMiddleware: bucket for SLA %q: %w", s.ID, err)
		}
		if b == nil {
			return nil, fmt.Errorf("throttle: NewMiddleware: bucket for SLA %q: %w: the BucketFactory returned a nil Bucket", s.ID, ErrInvalid)
		}
		r.bucket = b
		m.rules = append(m.rules, r)
	}
	return m, nil
}

// validateSLA checks one SLA and returns an error matching [ErrInvalid]
// that names the bad field, or nil.
func validateSLA(s SLA) error {
	if !slarules.ValidID(s.ID) {
		return Invalid("SLA", "ID", strconv.Quote(s.ID), "must be 1 to 128 letters, digits, '.', '_' or '-'")
	}
	for j, meth := range s.Methods {
		if !slarules.ValidMethod(meth) {
			return Invalid("SLA "+s.ID, fmt.Sprintf("Methods[%d]", j), strconv.Quote(meth), "must be an upper-case HTTP method such as GET")
		}
	}
	if s.Path != "" {
		if _, err := path.Match(s.Path, ""); err != nil {
			return Invalid("SLA "+s.ID, "Path", strconv.Quote(s.Path), "must be a path.Match pattern such as /product/*")
		}
	}
	if len(s.Tiers) == 0 {
		return Invalid("SLA "+s.ID, "Tiers", "[]", "must have at least one tier")
	}
	periods := make(map[time.Duration]bool, len(s.Tiers))
	for j, t := range s.Tiers {
		if t.Period <= 0 {
			return Invalid("SLA "+s.ID, fmt.Sprintf("Tiers[%d].Period", j), t.Period, "must be positive")
		}
		if periods[t.Period] {
			return Invalid("SLA "+s.ID, fmt.Sprintf("Tiers[%d].Period", j), t.Period, "must differ from the other tiers' periods")
		}
		periods[t.Period] = true
		if t.Limit < 1 {
			return Invalid("SLA "+s.ID, fmt.Sprintf("Tiers[%d].Limit", j), t.Limit, "must be at least 1")
		}
	}
	return nil
}

// policyName names a tier in the draft headers: "<ID>/<period>", the
// period in whole seconds, milliseconds or nanoseconds (ASCII only, as
// structured-field strings require).
func policyName(id string, t Tier) string {
	switch p := t.Period; {
	case p%time.Second == 0:
		return id + "/" + strconv.FormatInt(int64(p/time.Second), 10) + "s"
	case p%time.Millisecond == 0:
		return id + "/" + strconv.FormatInt(int64(p/time.Millisecond), 10) + "ms"
	default:
		return id + "/" + strconv.FormatInt(int64(p), 10) + "ns"
	}
}

// Wrap returns next behind the middleware.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rl := m.match(r)
		if rl == nil {
			next.ServeHTTP(w, r)
			return
		}
		tenant := rl.tenant(r)
		if len(tenant) > maxTenantLen {
			// Keep keys short for every store; a digest keeps tenants apart.
			sum := sha256.Sum256([]byte(tenant))
			tenant = "sha256:" + hex.EncodeToString(sum[:])
		}
		// Bounded like a Limiter's call that may not wait, so that a hung
		// store delays a request by at most the store timeout.
		tctx, cancel, _, _ := boundStoreCall(r.Context(), 0, true, m.storeTimeout)
		d, err := rl.bucket.Take(tctx, rl.sla.ID+":"+tenant, 1, 0)
		cancel()
		if err != nil {
			if m.cfg.failClosed {
				http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
				return
			}
			if r.Context().Err() == nil { // not merely a client gone
				m.log.Warn("throttle: Middleware serves a request unlimited: its bucket failed", "sla", rl.sla.ID, "err", err)
			}
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		setLimitHeaders(h, d)
		if m.cfg.draft {
			m.setDraftHeaders(h, rl, d)
		}
		if !d.Granted {
			wait := d.Delay
			if wait <= 0 {
				wait = d.Reset
			}
			h.Set("Retry-After", strconv.FormatInt(max(1, ceilSeconds(wait)), 10))
			http.Error(w, fmt.Sprintf("429 too many requests: SLA %s: retry in %s", rl.sla.ID, h.Get("Retry-After")+"s"), http.StatusTooManyRequests)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (m *Middleware) match(r *http.Request) *rule {
	for i := range m.rules {
		rl := &m.rules[i]
		if rl.methods != nil && !rl.methods[r.Method] {
			continue
		}
		if rl.sla.Path != "" {
			if ok, _ := path.Match(rl.sla.Path, r.URL.Path); !ok {
				continue
			}
		}
		return rl
	}
	return nil
}

// setDraftHeaders writes RateLimit-Policy and RateLimit. The tier reported
// is the one whose threshold is the decision's limit.
func (m *Middleware) setDraftHeaders(h http.Header, rl *rule, d Decision) {
	h.Set("RateLimit-Policy", rl.policy)
	if d.Limit <= 0 {
		return
	}
	t := rl.sla.Tiers[0]
	for _, tt := range rl.sla.Tiers {
		if tt.Limit == d.Limit {
			t = tt
			break
		}
	}
	h.Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%d", policyName(rl.sla.ID, t), max(d.Remaining, 0), ceilSeconds(d.Reset)))
}

// LocalWindows returns a [BucketFactory] of in-memory buckets, for tests
// and single-process providers: each SLA gets a bucket that keeps, per
// key, one counter per tier (a fixed window aligned to a multiple of the
// period since the Unix epoch, as in seed 000) or, for a Sliding SLA, the
// times of the calls granted within the last period (a sliding log, as in
// seed 003). Options: [WithClock].
//
// Guarantee, per key: at most Limit grants in every aligned window of
// each tier (fixed), or in every span of Period (sliding). A call is
// granted only when every tier has room, and then counts in every tier;
// a refused call counts nowhere. Such a bucket cannot reserve: it ignores
// maxWait and, refusing, names in Decision.Delay when every tier that
// refused has room again. A bucket's keys share one lock; keys whose
// windows are all over are forgotten.
func LocalWindows(opts ...Option) BucketFactory {
	clock := newConfig(opts).clock
	return func(s SLA) (Bucket, error) {
		if len(s.Tiers) == 0 {
			return nil, Invalid("throttle: LocalWindows", "Tiers", "[]", "must have at least one tier")
		}
		for j, t := range s.Tiers {
			if t.Period <= 0 || t.Limit < 1 {
				return nil, Invalid("throttle: LocalWindows", fmt.Sprintf("Tiers[%d]", j), fmt.Sprintf("%+v", t), "must have a positive Period and a Limit of at least 1")
			}
		}
		w := &localWindow{
			tiers:     append([]Tier(nil), s.Tiers...),
			sliding:   s.Sliding,
			clock:     clock,
			keys:      make(map[string]*windowState),
			sweepSize: 64,
			maxN:      s.Tiers[0].Limit,
		}
		for _, t := range s.Tiers {
			w.maxN = min(w.maxN, t.Limit)
		}
		return w, nil
	}
}

// localWindow is the bucket LocalWindows builds.
type localWindow struct {
	tiers   []Tier
	sliding bool
	clock   clockwork.Clock
	maxN    int64 // the smallest threshold

	mu        sync.Mutex
	keys      map[string]*windowState
	sweepSize int
}

// windowState is one key's use of every tier, indexed like tiers.
type windowState struct {
	start []int64   // fixed: the window's start, ns since the epoch
	count []int64   // fixed: calls granted in that window
	log   [][]int64 // sliding: grant times, ns since the epoch, oldest first
}

// Take implements [Bucket].
func (w *localWindow) Take(_ context.Context, key string, n int64, _ time.Duration) (Decision, error) {
	if n < 1 {
		return Decision{}, Invalid("throttle: LocalWindows", "n", n, "must be at least 1")
	}
	if n > w.maxN {
		return Decision{}, fmt.Errorf("throttle: LocalWindows: %d permits asked at once, at most %d can ever be granted: %w", n, w.maxN, ErrExceedsLimit)
	}
	now := w.clock.Now().UnixNano()
	w.mu.Lock()
	defer w.mu.Unlock()
	st, ok := w.keys[key]
	if !ok {
		w.sweep(now)
		st = &windowState{start: make([]int64, len(w.tiers)), count: make([]int64, len(w.tiers))}
		if w.sliding {
			st.log = make([][]int64, len(w.tiers))
		}
		w.keys[key] = st
	}

	// For each tier: used, the calls it counts now; wait, the time until it
	// has room for n more (0 if it has). The decision reports the refusing
	// tier that frees last or, when all pass, the tier with the fewest
	// calls left (the longer period on a tie).
	var refused bool
	var delay time.Duration
	report, reportLeft := -1, int64(0)
	for i, t := range w.tiers {
		p := int64(t.Period)
		var used int64
		var wait int64
		if w.sliding {
			l := st.log[i]
			k := 0
			for k < len(l) && l[k]+p <= now {
				k++
			}
			l = l[k:]
			st.log[i] = l
			used = int64(len(l))
			if used+n > t.Limit {
				wait = l[used+n-t.Limit-1] + p - now
			}
		} else {
			start := now - ((now%p)+p)%p // floor, also before 1970
			if st.start[i] != start {
				st.start[i], st.count[i] = start, 0
			}
			used = st.count[i]
			if used+n > t.Limit {
				wait = start + p - now
			}
		}
		if wait > 0 {
			if !refused || time.Duration(wait) > delay {
				report, reportLeft = i, t.Limit-used
			}
			refused = true
			delay = max(delay, time.Duration(wait))
			continue
		}
		if !refused {
			left := t.Limit - used - n
			if report < 0 || left < reportLeft || left == reportLeft && t.Period > w.tiers[report].Period {
				report, reportLeft = i, left
			}
		}
	}
	if !refused {
		for i := range w.tiers {
			if w.sliding {
				for j := int64(0); j < n; j++ {
					st.log[i] = append(st.log[i], now)
				}
			} else {
				st.count[i] += n
			}
		}
	}
	t := w.tiers[report]
	d := Decision{Granted: !refused, Limit: t.Limit, Remaining: max(reportLeft, 0), Reset: w.reset(st, report, now)}
	if refused {
		d.Delay = delay
	}
	return d, nil
}

// reset is the time until tier i's window is over for st: the end of the
// fixed window, or when the newest call leaves the sliding one.
func (w *localWindow) reset(st *windowState, i int, now int64) time.Duration {
	p := int64(w.tiers[i].Period)
	if w.sliding {
		l := st.log[i]
		if len(l) == 0 {
			return 0
		}
		return time.Duration(l[len(l)-1] + p - now)
	}
	return time.Duration(st.start[i] + p - now)
}

// sweep forgets keys whose windows are all over, once the map has grown.
// The caller holds w.mu.
func (w *localWindow) sweep(now int64) {
	if len(w.keys) < w.sweepSize {
		return
	}
	for k, st := range w.keys {
		over := true
		for i, t := range w.tiers {
			p := int64(t.Period)
			if w.sliding {
				if l := st.log[i]; len(l) > 0 && l[len(l)-1]+p > now {
					over = false
				}
			} else if st.start[i]+p > now && st.count[i] > 0 {
				over = false
			}
		}
		if over {
			delete(w.keys, k)
		}
	}
	w.sweepSize = max(64, 2*len(w.keys))
}
