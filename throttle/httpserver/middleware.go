package httpserver

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/internal/slarules"
	"github.com/headway-go/headway/throttle"
)

// SLA is one limit a provider publishes and [Middleware] enforces: calls
// matching Methods and Path, counted per tenant, must pass every tier.
// [ParseSLAs] and [LoadSLAs] read SLAs from YAML.
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
	// Tenant, when set, replaces the Middleware's tenant function (see
	// [NewMiddleware]) for this SLA, with the same rules. Nil: the
	// Middleware's.
	Tenant func(*http.Request) string
	// Sliding counts calls in a window of Period sliding with time
	// instead of fixed windows aligned to multiples of Period since the
	// Unix epoch (the default). The [BucketFactory] reads it.
	Sliding bool
	// Tiers must all pass for a call to be served; a refused call
	// consumes nothing in any tier. At least one.
	Tiers []throttle.Tier
}

// TenantHeader returns a tenant function that reads the tenant from the
// request header name. Use it only for a header your own infrastructure
// sets after authenticating the caller (an API gateway's, which replaces
// any value the client sent), never for one the client may set: see
// [NewMiddleware].
func TenantHeader(name string) func(*http.Request) string {
	return func(r *http.Request) string { return r.Header.Get(name) }
}

// TenantPathSegment returns a tenant function that reads the tenant from
// the i-th segment of the request's cleaned URL path, counting from 0
// after the leading slash: in "/v1/organizations/acme/product/7", segment
// 2 is "acme". Segments are cut as net/http's ServeMux cuts them for a
// wildcard such as {org}: at the slashes of the escaped path, each then
// unescaped, so that "/v1/organizations/acme%2Fx/product/7" counts for
// "acme/x", the organization the handler serves, not for "acme". A path
// too short (or a negative i) gives "".
//
// Anyone can name any tenant in a path: use it only behind a layer that
// checks, before the Middleware counts the request, that the caller
// belongs to that tenant (a check in the handler comes too late: the
// request has spent the tenant's budget by then). See [NewMiddleware].
func TenantPathSegment(i int) func(*http.Request) string {
	return func(r *http.Request) string {
		if i < 0 {
			return ""
		}
		p := strings.TrimPrefix(cleanPath(r.URL.EscapedPath()), "/")
		for j := 0; j < i; j++ {
			_, rest, ok := strings.Cut(p, "/")
			if !ok {
				return ""
			}
			p = rest
		}
		seg, _, _ := strings.Cut(p, "/")
		if v, err := url.PathUnescape(seg); err == nil {
			return v
		}
		return seg
	}
}

// BucketFactory builds the bucket that enforces one SLA: every tier of
// it, all-or-nothing, per key. [NewMiddleware] calls it once per SLA and
// takes one permit per matching request under the key "<ID>:<tenant>",
// where <tenant> is the tenant as it is, or "sha256:" and the hex SHA-256
// of its bytes (see [NewMiddleware]): at most 128 bytes of UTF-8 without
// control characters, '{' or '}', whatever the tenant.
//
// [LocalWindows] is the in-memory factory. For a fleet, wire a Redis
// bucket from package github.com/headway-go/headway/bucket (its Tiers
// bucket over fixed windows, or its sliding log when s.Sliding is true).
type BucketFactory func(s SLA) (throttle.Bucket, error)

// Middleware enforces SLAs on an http.Handler: per SLA and per tenant, in
// front of the handler. Build it with [NewMiddleware] and wrap handlers
// with [Middleware.Wrap]. It is safe for concurrent use.
//
// A request is counted under the first SLA (in the order given) whose
// methods and path match it; a request matching none is served unlimited
// and without headers. Paths are matched cleaned ([path.Clean]: no "..",
// "." or repeated or trailing slashes) and without regard to case, so
// that "/Product/1/" and "/product/2/../1" count as "/product/1" does; a
// path with an escaped slash ("/product/1%2Fx") matches a pattern if
// either its decoded form or its segments as net/http's ServeMux cuts
// them (where "1%2Fx" is one segment) match it. A counted request gets:
//
//   - X-RateLimit-Limit: the threshold of the tier the bucket reports
//     (for several tiers, the one nearest its limit);
//   - X-RateLimit-Remaining: the calls left in that tier's window after
//     this one;
//   - X-RateLimit-Reset: whole seconds, rounded up, until that window
//     ends;
//
// and, with [WithDraftHeaders], the IETF draft RateLimit-Policy and
// RateLimit fields. A refused request gets Retry-After (whole seconds, at
// least 1), is answered 429 Too Many Requests (or by the handler of
// [WithRefusedHandler]) and never reaches the handler. When the bucket's
// store fails, the request is served without headers, unless
// [WithFailurePolicy] asks for 503; the failure is logged at most once
// every [StoreErrorLogInterval], with the number of requests it affected.
type Middleware struct {
	rules   []rule
	cfg     middlewareConfig
	limiter logLimiter
}

type rule struct {
	sla     SLA
	methods map[string]bool // nil: any
	tenant  func(*http.Request) string
	bucket  throttle.Bucket
	policy  string // RateLimit-Policy value
	pattern string // sla.Path in lower case
}

// Option configures [NewMiddleware].
type Option interface {
	apply(*middlewareConfig)
}

type middlewareConfig struct {
	draft        bool                   // WithDraftHeaders
	policy       throttle.FailurePolicy // WithFailurePolicy; default FailOpen
	logger       *slog.Logger           // WithLogger; default slog.Default()
	storeTimeout time.Duration          // WithStoreTimeout; default throttle.DefaultStoreTimeout
	refused      http.Handler           // WithRefusedHandler; default a plain-text 429
}

type middlewareOption func(*middlewareConfig)

func (f middlewareOption) apply(c *middlewareConfig) { f(c) }

// WithDraftHeaders makes [Middleware] also send the fields of the IETF
// draft "RateLimit header fields for HTTP" (draft-ietf-httpapi-ratelimit-
// headers, versions -07 on): RateLimit-Policy lists every tier of the SLA
// as `"<ID>/<period>";q=<threshold>;w=<seconds>`, and RateLimit gives the
// reported tier's `"<ID>/<period>";r=<remaining>;t=<seconds>`. Default: off.
func WithDraftHeaders() Option {
	return middlewareOption(func(c *middlewareConfig) { c.draft = true })
}

// WithFailurePolicy sets what [Middleware] does with a request when a
// bucket's store fails: [throttle.FailOpen] (the default) serves it
// unlimited, so that a Redis outage does not become an outage of the API;
// [throttle.FailClosed] answers 503 Service Unavailable. NewMiddleware
// refuses [throttle.FailLocal], which the Middleware does not implement.
func WithFailurePolicy(p throttle.FailurePolicy) Option {
	return middlewareOption(func(c *middlewareConfig) { c.policy = p })
}

// WithRefusedHandler sets the handler that answers a refused request,
// instead of the default plain-text 429 Too Many Requests. The Middleware
// has set Retry-After and the rate-limit headers before h runs; h writes
// the status and body (for example a JSON problem document with status
// 429). [RefusedSLA] tells h which SLA refused the request.
func WithRefusedHandler(h http.Handler) Option {
	return middlewareOption(func(c *middlewareConfig) { c.refused = h })
}

type refusedKey struct{}

// RefusedSLA returns the ID of the SLA that refused r, inside the handler
// of [WithRefusedHandler], and whether r was refused at all.
func RefusedSLA(r *http.Request) (id string, ok bool) {
	id, ok = r.Context().Value(refusedKey{}).(string)
	return id, ok
}

// WithLogger sets the logger for a store's failures. Default:
// slog.Default(). A nil logger keeps the default.
func WithLogger(l *slog.Logger) Option {
	return middlewareOption(func(c *middlewareConfig) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithStoreTimeout bounds each bucket call, so that a hung store delays a
// request by at most d. Default: [throttle.DefaultStoreTimeout]. d ≤ 0
// sets no bound but the request's context.
func WithStoreTimeout(d time.Duration) Option {
	return middlewareOption(func(c *middlewareConfig) { c.storeTimeout = d })
}

// NewMiddleware checks slas, builds one bucket per SLA with newBucket, and
// returns the Middleware enforcing them, counting each request for the
// tenant that tenant returns (an SLA's own Tenant function overrides it).
// Options: [WithDraftHeaders], [WithFailurePolicy], [WithRefusedHandler],
// [WithLogger], [WithStoreTimeout].
//
// The tenant must come from an identity the server has authenticated:
// the subject of a verified token, a customer looked up from an API key,
// a value your authentication middleware put in the request's context.
// Each tenant has its own budget and its own keys in the store, so a
// tenant the client chooses freely (an unchecked header) gives a client
// that changes it a fresh budget with every request, and the store an
// unbounded number of keys. Requests whose tenant is "" share one budget.
//
// Distinct tenants never share a budget, whatever their names. A tenant
// is counted under its name as it is when that is at most 128 bytes of
// UTF-8 without control characters (U+0000 to U+001F, U+007F to U+009F),
// '{' or '}' and does not begin with "sha256:"; any other tenant (a long
// one, one in another encoding, one that could be taken for a digest)
// under "sha256:" and the hex SHA-256 of its bytes. Keys stay short,
// free of control characters and of Redis Cluster hash-tag braces, a
// name never lands on another's digest, and every instance computes the
// same key for a tenant whatever Go built it (the rule is by code point,
// not by the Unicode tables of the build).
//
// It refuses, with an error matching [throttle.ErrInvalid] that names the SLA and
// the field: an empty or malformed or repeated ID, no tiers, a period
// that is not positive or repeats within an SLA, a threshold below 1, a
// method that is not an upper-case token, a malformed path pattern, a nil
// newBucket, a nil tenant. An error from newBucket is returned wrapped.
func NewMiddleware(slas []SLA, newBucket BucketFactory, tenant func(*http.Request) string, opts ...Option) (*Middleware, error) {
	if newBucket == nil {
		return nil, errs.Invalid("httpserver: NewMiddleware", "newBucket", nil, "must be a BucketFactory such as httpserver.LocalWindows(nil)")
	}
	m := &Middleware{cfg: middlewareConfig{policy: throttle.FailOpen, logger: slog.Default(), storeTimeout: throttle.DefaultStoreTimeout}}
	for _, o := range opts {
		if o != nil {
			o.apply(&m.cfg)
		}
	}
	if m.cfg.policy != throttle.FailOpen && m.cfg.policy != throttle.FailClosed {
		return nil, errs.Invalid("httpserver: NewMiddleware", "WithFailurePolicy", m.cfg.policy, "must be throttle.FailOpen or throttle.FailClosed")
	}
	if tenant == nil {
		return nil, errs.Invalid("httpserver: NewMiddleware", "tenant", nil, "must return the request's authenticated tenant (see NewMiddleware)")
	}
	seen := make(map[string]bool, len(slas))
	for i, s := range slas {
		if err := validateSLA(s); err != nil {
			return nil, fmt.Errorf("httpserver: NewMiddleware: slas[%d]: %w", i, err)
		}
		if seen[s.ID] {
			return nil, fmt.Errorf("httpserver: NewMiddleware: slas[%d]: %w", i, errs.Invalid("SLA", "ID", strconv.Quote(s.ID), "must be unique; an earlier SLA has it"))
		}
		seen[s.ID] = true
		s.Methods = append([]string(nil), s.Methods...)
		s.Tiers = append([]throttle.Tier(nil), s.Tiers...)
		r := rule{sla: s, tenant: s.Tenant, pattern: strings.ToLower(s.Path)}
		if r.tenant == nil {
			r.tenant = tenant
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
			return nil, fmt.Errorf("httpserver: NewMiddleware: bucket for SLA %q: %w", s.ID, err)
		}
		if b == nil {
			return nil, fmt.Errorf("httpserver: NewMiddleware: bucket for SLA %q: %w: the BucketFactory returned a nil Bucket", s.ID, throttle.ErrInvalid)
		}
		r.bucket = b
		m.rules = append(m.rules, r)
	}
	return m, nil
}

// validateSLA checks one SLA and returns an error matching [throttle.ErrInvalid]
// that names the bad field, or nil.
func validateSLA(s SLA) error {
	if !slarules.ValidID(s.ID) {
		return errs.Invalid("SLA", "ID", strconv.Quote(s.ID), "must be 1 to 128 letters, digits, '.', '_' or '-'")
	}
	for j, meth := range s.Methods {
		if !slarules.ValidMethod(meth) {
			return errs.Invalid("SLA "+s.ID, fmt.Sprintf("Methods[%d]", j), strconv.Quote(meth), "must be an upper-case HTTP method such as GET")
		}
	}
	if s.Path != "" {
		if _, err := path.Match(s.Path, ""); err != nil {
			return errs.Invalid("SLA "+s.ID, "Path", strconv.Quote(s.Path), "must be a path.Match pattern such as /product/*")
		}
	}
	if len(s.Tiers) == 0 {
		return errs.Invalid("SLA "+s.ID, "Tiers", "[]", "must have at least one tier")
	}
	periods := make(map[time.Duration]bool, len(s.Tiers))
	for j, t := range s.Tiers {
		if t.Period <= 0 {
			return errs.Invalid("SLA "+s.ID, fmt.Sprintf("Tiers[%d].Period", j), t.Period, "must be positive")
		}
		if periods[t.Period] {
			return errs.Invalid("SLA "+s.ID, fmt.Sprintf("Tiers[%d].Period", j), t.Period, "must differ from the other tiers' periods")
		}
		periods[t.Period] = true
		if t.Limit < 1 {
			return errs.Invalid("SLA "+s.ID, fmt.Sprintf("Tiers[%d].Limit", j), t.Limit, "must be at least 1")
		}
	}
	return nil
}

// policyName names a tier in the draft headers: "<ID>/<period>", the
// period in whole seconds, milliseconds or nanoseconds (ASCII only, as
// structured-field strings require).
func policyName(id string, t throttle.Tier) string {
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
		tenant := tenantKey(rl.tenant(r))
		// Bounded like a Limiter's call that may not wait: see WithStoreTimeout.
		tctx, cancel := r.Context(), context.CancelFunc(func() {})
		if m.cfg.storeTimeout > 0 {
			tctx, cancel = context.WithTimeout(tctx, m.cfg.storeTimeout)
		}
		d, err := rl.bucket.Take(tctx, rl.sla.ID+":"+tenant, 1, 0)
		cancel()
		if err != nil {
			if m.cfg.policy == throttle.FailClosed {
				http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
				return
			}
			if r.Context().Err() == nil { // not merely a client gone
				if n, ok := m.limiter.allow(time.Now()); ok {
					m.cfg.logger.Warn("httpserver: Middleware serves requests unlimited: a bucket's store failed", "sla", rl.sla.ID, "requests", n, "err", err)
				}
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
			if m.cfg.refused != nil {
				m.cfg.refused.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), refusedKey{}, rl.sla.ID)))
				return
			}
			http.Error(w, fmt.Sprintf("429 too many requests: SLA %s: retry in %s", rl.sla.ID, h.Get("Retry-After")+"s"), http.StatusTooManyRequests)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (m *Middleware) match(r *http.Request) *rule {
	p := strings.ToLower(cleanPath(r.URL.Path))
	sp := segmentPath(r.URL)
	for i := range m.rules {
		rl := &m.rules[i]
		if rl.methods != nil && !rl.methods[r.Method] {
			continue
		}
		if rl.pattern != "" {
			ok, _ := path.Match(rl.pattern, p)
			if !ok && sp != "" {
				ok, _ = path.Match(rl.pattern, sp)
			}
			if !ok {
				continue
			}
		}
		return rl
	}
	return nil
}

// segmentPath is u's path cut into segments as net/http's ServeMux cuts
// it, at the slashes of the escaped path, each segment then unescaped,
// with a slash inside a segment kept as "%2f" (so that '*' matches it
// within one segment); cleaned and in lower case. It is "" when the path
// has no escaped slash, and so no segments other than the decoded path's.
// "/product/1%2Fx" reaches the handler of "/product/{id}" with id "1/x":
// matched on "/product/1/x" alone, it escaped the limit of "/product/*".
func segmentPath(u *url.URL) string {
	ep := u.EscapedPath()
	if !strings.Contains(strings.ToLower(ep), "%2f") {
		return ""
	}
	segs := strings.Split(ep, "/")
	for i, seg := range segs {
		if v, err := url.PathUnescape(seg); err == nil {
			seg = v
		}
		segs[i] = strings.ReplaceAll(seg, "/", "%2f")
	}
	return strings.ToLower(cleanPath(strings.Join(segs, "/")))
}

// cleanPath is p as the Middleware matches it: rooted, without "..", "."
// or repeated or trailing slashes.
func cleanPath(p string) string {
	return path.Clean("/" + p)
}

// StoreErrorLogInterval is the least time between two log lines of a
// [Middleware] about its store failing: a store down for a minute under a
// thousand requests a second logs a few lines, each with the number of
// requests served unlimited since the one before, not sixty thousand.
const StoreErrorLogInterval = 10 * time.Second

// logLimiter lets one log line through per StoreErrorLogInterval and
// counts the events in between.
type logLimiter struct {
	mu      sync.Mutex
	last    time.Time
	skipped int64
}

// allow reports whether to log at now, and how many events the line
// stands for (this one and those skipped since the last line).
func (l *logLimiter) allow(now time.Time) (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.skipped++
	if !l.last.IsZero() && now.Sub(l.last) < StoreErrorLogInterval {
		return 0, false
	}
	n := l.skipped
	l.last, l.skipped = now, 0
	return n, true
}

// setDraftHeaders writes RateLimit-Policy and RateLimit. The tier reported
// is the one whose threshold is the decision's limit.
func (m *Middleware) setDraftHeaders(h http.Header, rl *rule, d throttle.Decision) {
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
// period since the Unix epoch) or, for a Sliding SLA, the times of the
// calls granted within the last period (a sliding log). The buckets read
// clock; nil is the real clock.
//
// Guarantee, per key: at most Limit grants in every aligned window of
// each tier (fixed), or in every span of Period (sliding). A call is
// granted only when every tier has room, and then counts in every tier;
// a refused call counts nowhere. Such a bucket cannot reserve: it ignores
// maxWait and, refusing, names in Decision.Delay when every tier that
// refused has room again. A bucket's keys share one lock; keys whose
// windows are all over are forgotten.
func LocalWindows(clock clockwork.Clock) BucketFactory {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	return func(s SLA) (throttle.Bucket, error) {
		if len(s.Tiers) == 0 {
			return nil, errs.Invalid("httpserver: LocalWindows", "Tiers", "[]", "must have at least one tier")
		}
		maxN := s.Tiers[0].Limit
		for j, t := range s.Tiers {
			if t.Period <= 0 || t.Limit < 1 {
				return nil, errs.Invalid("httpserver: LocalWindows", fmt.Sprintf("Tiers[%d]", j), fmt.Sprintf("%+v", t), "must have a positive Period and a Limit of at least 1")
			}
			maxN = min(maxN, t.Limit)
		}
		w := &localWindow{
			tiers:     append([]throttle.Tier(nil), s.Tiers...),
			sliding:   s.Sliding,
			clock:     clock,
			keys:      make(map[string]*windowState),
			sweepSize: 64,
			maxN:      maxN,
		}
		return w, nil
	}
}

// localWindow is the bucket LocalWindows builds.
type localWindow struct {
	tiers   []throttle.Tier
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

// Take implements [throttle.Bucket].
func (w *localWindow) Take(_ context.Context, key string, n int64, _ time.Duration) (throttle.Decision, error) {
	if n < 1 {
		return throttle.Decision{}, errs.Invalid("httpserver: LocalWindows", "n", n, "must be at least 1")
	}
	if n > w.maxN {
		return throttle.Decision{}, fmt.Errorf("httpserver: LocalWindows: %d permits asked at once, at most %d can ever be granted: %w", n, w.maxN, throttle.ErrExceedsLimit)
	}
	now := w.clock.Now().UnixNano()
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.state(key, now)

	// The decision reports the refusing tier that frees last or, when all
	// pass, the tier with the fewest calls left (the longer period on a
	// tie).
	var refused bool
	var delay time.Duration
	report, reportLeft := -1, int64(0)
	for i, t := range w.tiers {
		used, wait := w.use(st, i, n, now)
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
		w.grant(st, n, now)
	}
	// delay is 0 unless refused.
	return throttle.Decision{Granted: !refused, Limit: w.tiers[report].Limit, Remaining: max(reportLeft, 0), Reset: w.reset(st, report, now), Delay: delay}, nil
}

// state returns key's windowState, creating it. The caller holds w.mu.
func (w *localWindow) state(key string, now int64) *windowState {
	if st, ok := w.keys[key]; ok {
		return st
	}
	w.sweep(now)
	st := &windowState{start: make([]int64, len(w.tiers)), count: make([]int64, len(w.tiers))}
	if w.sliding {
		st.log = make([][]int64, len(w.tiers))
	}
	w.keys[key] = st
	return st
}

// use is tier i's use by st at now: used, the calls it counts now (a
// sliding log drops those that have left it); wait, the time until it has
// room for n more (0 if it has). The caller holds w.mu.
func (w *localWindow) use(st *windowState, i int, n, now int64) (used, wait int64) {
	t := w.tiers[i]
	p := int64(t.Period)
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
		return used, wait
	}
	start := now - ((now%p)+p)%p // floor, also before 1970
	if st.start[i] != start {
		st.start[i], st.count[i] = start, 0
	}
	used = st.count[i]
	if used+n > t.Limit {
		wait = start + p - now
	}
	return used, wait
}

// grant counts n calls granted at now in every tier of st. The caller
// holds w.mu.
func (w *localWindow) grant(st *windowState, n, now int64) {
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
		for i := range w.tiers {
			if w.reset(st, i, now) > 0 && (w.sliding || st.count[i] > 0) {
				over = false
			}
		}
		if over {
			delete(w.keys, k)
		}
	}
	w.sweepSize = max(64, 2*len(w.keys))
}
