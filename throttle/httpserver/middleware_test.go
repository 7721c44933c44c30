package httpserver_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
	"github.com/headway-go/headway/throttle/httpserver"
)

// windowStart is a time aligned to every period the tests use.
var windowStart = time.Unix(1_800_000_000, 0)

func getProduct(tiers ...throttle.Tier) httpserver.SLA {
	return httpserver.SLA{ID: "get-product", Methods: []string{"GET"}, Path: "/product/*", Tenant: httpserver.TenantHeader("X-Org-Id"), Tiers: tiers}
}

// newTestMiddleware wraps a handler that counts calls in m over
// in-memory windows on clk.
func newTestMiddleware(t *testing.T, clk clockwork.Clock, slas []httpserver.SLA, opts ...httpserver.Option) (http.Handler, *int) {
	t.Helper()
	m, err := httpserver.NewMiddleware(slas, httpserver.LocalWindows(clk), httpserver.TenantHeader("X-Org-Id"), opts...)
	if err != nil {
		t.Fatalf("NewMiddleware: %v", err)
	}
	served := new(int)
	return m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*served++
		w.Write([]byte("product"))
	})), served
}

// call serves one request and returns the recorder.
func call(h http.Handler, method, path, org string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, nil)
	if org != "" {
		r.Header.Set("X-Org-Id", org)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// want is the status and headers a response must carry ("" = absent).
type want struct {
	status                            int
	limit, remaining, reset, retryAft string
}

func check(t *testing.T, step string, w *httptest.ResponseRecorder, x want) {
	t.Helper()
	got := want{
		status:    w.Code,
		limit:     w.Header().Get("X-RateLimit-Limit"),
		remaining: w.Header().Get("X-RateLimit-Remaining"),
		reset:     w.Header().Get("X-RateLimit-Reset"),
		retryAft:  w.Header().Get("Retry-After"),
	}
	if got != x {
		t.Errorf("%s: got status %d, limit %q, remaining %q, reset %q, Retry-After %q; want %d, %q, %q, %q, %q",
			step, got.status, got.limit, got.remaining, got.reset, got.retryAft, x.status, x.limit, x.remaining, x.reset, x.retryAft)
	}
}

// TestMiddlewareHeadersThroughAWindow checks the headers of the first,
// the last and the refused request of a window, and of the next window.
func TestMiddlewareHeadersThroughAWindow(t *testing.T) {
	for _, sliding := range []bool{false, true} {
		name := map[bool]string{false: "fixed", true: "sliding"}[sliding]
		t.Run(name, func(t *testing.T) {
			clk := clockwork.NewFakeClockAt(windowStart)
			s := getProduct(throttle.Tier{Period: 10 * time.Second, Limit: 3})
			s.Sliding = sliding
			h, served := newTestMiddleware(t, clk, []httpserver.SLA{s})

			check(t, "first", call(h, "GET", "/product/1", "acme"), want{200, "3", "2", "10", ""})
			clk.Advance(4 * time.Second)
			check(t, "second", call(h, "GET", "/product/2", "acme"), want{200, "3", "1", map[bool]string{false: "6", true: "10"}[sliding], ""})
			clk.Advance(500 * time.Millisecond)
			check(t, "last", call(h, "GET", "/product/3", "acme"), want{200, "3", "0", map[bool]string{false: "6", true: "10"}[sliding], ""})
			refused := call(h, "GET", "/product/4", "acme")
			// Fixed: the window ends in 5.5 s. Sliding: the first call
			// leaves the window in 5.5 s.
			check(t, "refused", refused, want{429, "3", "0", map[bool]string{false: "6", true: "10"}[sliding], "6"})
			if *served != 3 {
				t.Errorf("the handler served %d requests, want 3: a refused request must not reach it", *served)
			}
			if body := refused.Body.String(); !strings.Contains(body, "get-product") {
				t.Errorf("the 429's body %q does not name the SLA", body)
			}
			clk.Advance(5500 * time.Millisecond)
			if sliding {
				// One call left the window: one free.
				check(t, "after the oldest left", call(h, "GET", "/product/5", "acme"), want{200, "3", "0", "10", ""})
			} else {
				check(t, "next window", call(h, "GET", "/product/5", "acme"), want{200, "3", "2", "10", ""})
			}
		})
	}
}

// TestMiddlewareTiersAllOrNothing: two tiers must both pass; a call one
// tier refuses counts in neither.
func TestMiddlewareTiersAllOrNothing(t *testing.T) {
	for _, sliding := range []bool{false, true} {
		name := map[bool]string{false: "fixed", true: "sliding"}[sliding]
		t.Run(name, func(t *testing.T) {
			clk := clockwork.NewFakeClockAt(windowStart)
			s := getProduct(throttle.Tier{Period: time.Second, Limit: 2}, throttle.Tier{Period: 10 * time.Second, Limit: 3})
			s.Sliding = sliding
			h, served := newTestMiddleware(t, clk, []httpserver.SLA{s})

			// The 10 s tier has 3 left and the 1 s tier 1: the 1 s tier is
			// reported.
			check(t, "1", call(h, "GET", "/product/1", "acme"), want{200, "2", "1", "1", ""})
			check(t, "2", call(h, "GET", "/product/1", "acme"), want{200, "2", "0", "1", ""})
			check(t, "3, refused by the 1 s tier", call(h, "GET", "/product/1", "acme"), want{429, "2", "0", "1", "1"})
			clk.Advance(time.Second)
			// Had the refused call counted in the 10 s tier, this one
			// would be refused.
			check(t, "4", call(h, "GET", "/product/1", "acme"), want{200, "3", "0", map[bool]string{false: "9", true: "10"}[sliding], ""})
			check(t, "5, refused by the 10 s tier", call(h, "GET", "/product/1", "acme"), want{429, "3", "0", map[bool]string{false: "9", true: "10"}[sliding], "9"})
			if *served != 3 {
				t.Errorf("served %d, want 3", *served)
			}
		})
	}
}

// TestMiddlewareTenantIsolation: tenant A at its limit, tenant B is
// unaffected; calls without a tenant share one budget.
func TestMiddlewareTenantIsolation(t *testing.T) {
	clk := clockwork.NewFakeClockAt(windowStart)
	h, _ := newTestMiddleware(t, clk, []httpserver.SLA{getProduct(throttle.Tier{Period: 10 * time.Second, Limit: 2})})
	call(h, "GET", "/product/1", "A")
	call(h, "GET", "/product/1", "A")
	check(t, "A over", call(h, "GET", "/product/1", "A"), want{429, "2", "0", "10", "10"})
	check(t, "B", call(h, "GET", "/product/1", "B"), want{200, "2", "1", "10", ""})
	check(t, "no tenant", call(h, "GET", "/product/1", ""), want{200, "2", "1", "10", ""})
	check(t, "no tenant again", call(h, "GET", "/product/1", ""), want{200, "2", "0", "10", ""})
	check(t, "A still over", call(h, "GET", "/product/1", "A"), want{429, "2", "0", "10", "10"})
}

// TestMiddlewareMatching: the first matching SLA counts a request; method,
// path pattern and path-segment tenants; unmatched requests pass bare.
func TestMiddlewareMatching(t *testing.T) {
	clk := clockwork.NewFakeClockAt(windowStart)
	slas := []httpserver.SLA{
		{ID: "put-product", Methods: []string{"PUT"}, Path: "/v1/organizations/*/product/*", Tenant: httpserver.TenantPathSegment(2), Tiers: []throttle.Tier{{Period: 10 * time.Second, Limit: 1}}},
		{ID: "get-product", Methods: []string{"GET"}, Path: "/v1/organizations/*/product/*", Tenant: httpserver.TenantPathSegment(2), Tiers: []throttle.Tier{{Period: 10 * time.Second, Limit: 5}}},
		{ID: "anything", Path: "/health", Tiers: []throttle.Tier{{Period: 10 * time.Second, Limit: 100}}},
	}
	h, _ := newTestMiddleware(t, clk, slas)
	check(t, "PUT acme", call(h, "PUT", "/v1/organizations/acme/product/7", ""), want{200, "1", "0", "10", ""})
	check(t, "PUT acme again", call(h, "PUT", "/v1/organizations/acme/product/8", ""), want{429, "1", "0", "10", "10"})
	check(t, "PUT initech", call(h, "PUT", "/v1/organizations/initech/product/7", ""), want{200, "1", "0", "10", ""})
	check(t, "GET acme", call(h, "GET", "/v1/organizations/acme/product/7", ""), want{200, "5", "4", "10", ""})
	check(t, "any method", call(h, "DELETE", "/health", ""), want{200, "100", "99", "10", ""})
	check(t, "unmatched path", call(h, "GET", "/v1/organizations/acme/product/7/reviews", ""), want{200, "", "", "", ""})
	check(t, "unmatched method", call(h, "POST", "/v1/organizations/acme/product/7", ""), want{200, "", "", "", ""})
}

func TestTenantPathSegment(t *testing.T) {
	tests := []struct {
		path string
		i    int
		want string
	}{
		{"/v1/organizations/acme/product/7", 2, "acme"},
		{"/v1/organizations/acme/product/7", 0, "v1"},
		{"/v1/organizations/acme/product/7", 4, "7"},
		{"/v1/organizations/acme/product/7", 5, ""},
		{"/v1", -1, ""},
		{"/", 0, ""},
		{"//x", 0, "x"},
		{"/v1/../v1/organizations//acme/", 2, "acme"},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("GET", tt.path, nil)
		if got := httpserver.TenantPathSegment(tt.i)(r); got != tt.want {
			t.Errorf("TenantPathSegment(%d)(%q) = %q, want %q", tt.i, tt.path, got, tt.want)
		}
	}
}

func TestMiddlewareDraftHeaders(t *testing.T) {
	clk := clockwork.NewFakeClockAt(windowStart)
	h, _ := newTestMiddleware(t, clk, []httpserver.SLA{getProduct(
		throttle.Tier{Period: time.Second, Limit: 10},
		throttle.Tier{Period: time.Minute, Limit: 12},
		throttle.Tier{Period: 1500 * time.Millisecond, Limit: 11},
	)}, httpserver.WithDraftHeaders())
	w := call(h, "GET", "/product/1", "acme")
	if got, want := w.Header().Get("RateLimit-Policy"), `"get-product/1s";q=10;w=1, "get-product/60s";q=12;w=60, "get-product/1500ms";q=11;w=2`; got != want {
		t.Errorf("RateLimit-Policy %s, want %s", got, want)
	}
	if got, want := w.Header().Get("RateLimit"), `"get-product/1s";r=9;t=1`; got != want {
		t.Errorf("RateLimit %s, want %s", got, want)
	}
	for range 9 {
		call(h, "GET", "/product/1", "acme")
	}
	w = call(h, "GET", "/product/1", "acme")
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", w.Code)
	}
	// A client reads the refusal with RetryAfter.
	w.Header().Del("Retry-After")
	if d, ok := httpclient.RetryAfter(&http.Response{StatusCode: w.Code, Header: w.Header()}, clk.Now()); !ok || d != time.Second {
		t.Errorf("RetryAfter of the draft headers = %v, %v; want 1s, true", d, ok)
	}
}

// failingBucket fails every Take.
type failingBucket struct{}

func (failingBucket) Take(context.Context, string, int64, time.Duration) (throttle.Decision, error) {
	return throttle.Decision{}, &throttle.BackendError{Op: "take", Err: errors.New("connection refused")}
}

func TestMiddlewareStoreFailure(t *testing.T) {
	factory := func(httpserver.SLA) (throttle.Bucket, error) { return failingBucket{}, nil }
	slas := []httpserver.SLA{getProduct(throttle.Tier{Period: time.Second, Limit: 1})}
	for _, tt := range []struct {
		name   string
		opts   []httpserver.Option
		status int
		served int
	}{
		{"fails open by default", nil, 200, 1},
		{"WithFailClosed", []httpserver.Option{httpserver.WithFailurePolicy(throttle.FailClosed)}, 503, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, err := httpserver.NewMiddleware(slas, factory, httpserver.TenantHeader("X-Org-Id"), tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			served := 0
			h := m.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ }))
			w := call(h, "GET", "/product/1", "acme")
			if w.Code != tt.status || served != tt.served {
				t.Errorf("status %d, served %d; want %d, %d", w.Code, served, tt.status, tt.served)
			}
		})
	}
}

// keyRecorder records the keys it is asked for.
type keyRecorder struct {
	mu   sync.Mutex
	keys []string
}

func (k *keyRecorder) Take(_ context.Context, key string, _ int64, _ time.Duration) (throttle.Decision, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys = append(k.keys, key)
	return throttle.Decision{Granted: true, Limit: 1, Remaining: 0}, nil
}

// TestMiddlewareKeys: the key is "<ID>:<tenant>"; a long tenant is
// replaced by its digest, and two long tenants stay apart. (The names
// that could be taken for a digest: FuzzTenantKeyKeepsTenantsApart.)
func TestMiddlewareKeys(t *testing.T) {
	rec := &keyRecorder{}
	m, err := httpserver.NewMiddleware([]httpserver.SLA{getProduct(throttle.Tier{Period: time.Second, Limit: 1})},
		func(httpserver.SLA) (throttle.Bucket, error) { return rec, nil }, httpserver.TenantHeader("X-Org-Id"))
	if err != nil {
		t.Fatal(err)
	}
	h := m.Wrap(http.NotFoundHandler())
	call(h, "GET", "/product/1", "acme")
	call(h, "GET", "/product/1", strings.Repeat("a", 5000))
	call(h, "GET", "/product/1", strings.Repeat("a", 4999)+"b")
	if rec.keys[0] != "get-product:acme" {
		t.Errorf("key %q, want %q", rec.keys[0], "get-product:acme")
	}
	for _, k := range rec.keys[1:] {
		if len(k) > 200 || !strings.HasPrefix(k, "get-product:sha256:") {
			t.Errorf("key for a long tenant is %.40q… (%d bytes); want a short digest", k, len(k))
		}
	}
	if rec.keys[1] == rec.keys[2] {
		t.Errorf("two long tenants share the key %q", rec.keys[1])
	}
}

func TestNewMiddlewareRefusesBadSLAs(t *testing.T) {
	ok := throttle.Tier{Period: time.Second, Limit: 1}
	tests := []struct {
		name  string
		slas  []httpserver.SLA
		field string
	}{
		{"empty ID", []httpserver.SLA{{Tiers: []throttle.Tier{ok}}}, "ID"},
		{"ID with a space", []httpserver.SLA{{ID: "get product", Tiers: []throttle.Tier{ok}}}, "ID"},
		{"ID with a brace", []httpserver.SLA{{ID: "{x}", Tiers: []throttle.Tier{ok}}}, "ID"},
		{"repeated ID", []httpserver.SLA{{ID: "a", Tiers: []throttle.Tier{ok}}, {ID: "a", Tiers: []throttle.Tier{ok}}}, "slas[1]: SLA: ID"},
		{"lower-case method", []httpserver.SLA{{ID: "a", Methods: []string{"get"}, Tiers: []throttle.Tier{ok}}}, "Methods[0]"},
		{"bad pattern", []httpserver.SLA{{ID: "a", Path: "/product/[", Tiers: []throttle.Tier{ok}}}, "Path"},
		{"no tiers", []httpserver.SLA{{ID: "a"}}, "Tiers"},
		{"zero period", []httpserver.SLA{{ID: "a", Tiers: []throttle.Tier{{Limit: 1}}}}, "Tiers[0].Period"},
		{"repeated period", []httpserver.SLA{{ID: "a", Tiers: []throttle.Tier{ok, ok}}}, "Tiers[1].Period"},
		{"zero threshold", []httpserver.SLA{{ID: "a", Tiers: []throttle.Tier{{Period: time.Second}}}}, "Tiers[0].Limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := httpserver.NewMiddleware(tt.slas, httpserver.LocalWindows(nil), httpserver.TenantHeader("X-Org-Id"))
			if !errors.Is(err, throttle.ErrInvalid) || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("NewMiddleware: %v; want ErrInvalid naming %s", err, tt.field)
			}
		})
	}
	if _, err := httpserver.NewMiddleware(nil, nil, httpserver.TenantHeader("X-Org-Id")); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("NewMiddleware with a nil factory: %v; want ErrInvalid", err)
	}
	boom := errors.New("boom")
	_, err := httpserver.NewMiddleware([]httpserver.SLA{{ID: "a", Tiers: []throttle.Tier{ok}}}, func(httpserver.SLA) (throttle.Bucket, error) { return nil, boom }, httpserver.TenantHeader("X-Org-Id"))
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), `"a"`) {
		t.Errorf("NewMiddleware with a failing factory: %v; want the factory's error, naming the SLA", err)
	}
}

// TestLocalWindowsExceedsLimit: asking for more than the smallest
// threshold at once can never succeed.
func TestLocalWindowsExceedsLimit(t *testing.T) {
	b, err := httpserver.LocalWindows(nil)(httpserver.SLA{ID: "a", Tiers: []throttle.Tier{{Period: time.Second, Limit: 5}, {Period: time.Minute, Limit: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Take(context.Background(), "k", 4, 0); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Errorf("Take(4): %v; want ErrExceedsLimit", err)
	}
	if d, err := b.Take(context.Background(), "k", 3, 0); err != nil || !d.Granted {
		t.Errorf("Take(3): %+v, %v; want granted", d, err)
	}
	if _, err := httpserver.LocalWindows(nil)(httpserver.SLA{ID: "a"}); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("LocalWindows with no tiers: %v; want ErrInvalid", err)
	}
}

// TestLocalWindowsManyKeys: many short-lived keys, swept as they go idle,
// each start with a full budget.
func TestLocalWindowsManyKeys(t *testing.T) {
	clk := clockwork.NewFakeClockAt(windowStart)
	for _, sliding := range []bool{false, true} {
		b, err := httpserver.LocalWindows(clk)(httpserver.SLA{ID: "a", Sliding: sliding, Tiers: []throttle.Tier{{Period: time.Second, Limit: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 1000 {
			if d, _ := b.Take(context.Background(), strings.Repeat("k", i%50)+string(rune('a'+i%26)), 1, 0); !d.Granted && i < 50 {
				t.Fatalf("key %d refused", i)
			}
			clk.Advance(10 * time.Millisecond)
		}
		clk.Advance(2 * time.Second)
		if d, _ := b.Take(context.Background(), "k", 1, 0); !d.Granted || d.Remaining != 0 {
			t.Errorf("sliding=%v: a key idle for a period: %+v; want granted with 0 left", sliding, d)
		}
	}
}

// orgKey is the context key under which the example's authentication
// puts the caller's organisation.
type orgKey struct{}

// A provider limits GET /product/* per organisation to 2 calls per 10 s.
// The organisation comes from the caller's credentials, checked by an
// authentication layer in front of the limits (here a stand-in that trusts
// a token table). A fake clock keeps the output stable; a real provider
// passes nil to LocalWindows, or uses Redis buckets.
func ExampleNewMiddleware() {
	clock := clockwork.NewFakeClockAt(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	tenantOf := func(r *http.Request) string {
		org, _ := r.Context().Value(orgKey{}).(string)
		return org
	}
	m, err := httpserver.NewMiddleware([]httpserver.SLA{{
		ID:      "get-product",
		Methods: []string{"GET"},
		Path:    "/product/*",
		Tiers:   []throttle.Tier{{Period: 10 * time.Second, Limit: 2}},
	}}, httpserver.LocalWindows(clock), tenantOf)
	if err != nil {
		fmt.Println(err)
		return
	}
	api := m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "product", path.Base(r.URL.Path))
	}))
	tokens := map[string]string{"t-1": "acme", "t-2": "initech"}
	authenticated := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		org, ok := tokens[r.Header.Get("Authorization")]
		if !ok {
			http.Error(w, "unknown token", http.StatusUnauthorized)
			return
		}
		api.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), orgKey{}, org)))
	})
	for _, token := range []string{"t-1", "t-1", "t-1", "t-2"} {
		r := httptest.NewRequest("GET", "/product/7", nil)
		r.Header.Set("Authorization", token)
		w := httptest.NewRecorder()
		authenticated.ServeHTTP(w, r)
		fmt.Printf("%s: %d limit=%s remaining=%s reset=%s retry-after=%q\n", tokens[token], w.Code,
			w.Header().Get("X-RateLimit-Limit"), w.Header().Get("X-RateLimit-Remaining"),
			w.Header().Get("X-RateLimit-Reset"), w.Header().Get("Retry-After"))
	}
	// Output:
	// acme: 200 limit=2 remaining=1 reset=10 retry-after=""
	// acme: 200 limit=2 remaining=0 reset=10 retry-after=""
	// acme: 429 limit=2 remaining=0 reset=10 retry-after="10"
	// initech: 200 limit=2 remaining=1 reset=10 retry-after=""
}

// FuzzMiddlewareRequest sends any method, path and tenant header through a
// Middleware that reads the tenant from the header or from a path segment:
// no panic, the answer is 200 or 429, and the rate-limit headers it sets
// are numbers.
func FuzzMiddlewareRequest(f *testing.F) {
	for _, s := range [][3]string{
		{"GET", "/v1/orgs/acme/product/7", "acme"}, {"POST", "/", ""}, {"", "", ""},
		{"get", "//", "\x00"}, {"GET", "/v1/orgs/%zz/product", "a/b{c}"}, {"DELETE", "/product/*", string(make([]byte, 300))},
		{"GET", "/v1/orgs/" + string(make([]byte, 200)) + "/x", "é"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	slas := []httpserver.SLA{
		{ID: "by-header", Methods: []string{"GET"}, Path: "/product/*", Tiers: []throttle.Tier{{Limit: 2, Period: time.Second}}},
		{ID: "by-path", Path: "/v1/orgs/*/product/*", Tenant: httpserver.TenantPathSegment(2),
			Tiers: []throttle.Tier{{Limit: 1, Period: time.Second}, {Limit: 5, Period: time.Minute}}},
		{ID: "rest", Sliding: true, Tenant: httpserver.TenantHeader("X-Org"), Tiers: []throttle.Tier{{Limit: 3, Period: time.Second}}},
	}
	mw, err := httpserver.NewMiddleware(slas, httpserver.LocalWindows(nil), httpserver.TenantHeader("X-Org-Id"))
	if err != nil {
		f.Fatal(err)
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	f.Fuzz(func(t *testing.T, method, path, tenant string) {
		r := &http.Request{Method: method, URL: &url.URL{Path: path}, Header: http.Header{}, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
		r.Header.Set("X-Org-Id", tenant)
		r.Header.Set("X-Org", tenant)
		r = r.WithContext(context.Background())
		for range 3 {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusOK && w.Code != http.StatusTooManyRequests {
				t.Fatalf("%s %q tenant %q: status %d", method, path, tenant, w.Code)
			}
			for _, name := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"} {
				if v := w.Header().Get(name); v != "" {
					if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 0 {
						t.Fatalf("%s %q: header %s: %q is not a non-negative number", method, path, name, v)
					}
				}
			}
		}
	})
}

// TestMiddlewareMatchesCleanedPaths: variants of a limited path that reach
// the same handler (a trailing slash, "..", other case) count against the
// same limit: none of them passes unlimited.
func TestMiddlewareMatchesCleanedPaths(t *testing.T) {
	clk := clockwork.NewFakeClockAt(windowStart)
	h, served := newTestMiddleware(t, clk, []httpserver.SLA{getProduct(throttle.Tier{Period: time.Minute, Limit: 1})})
	check(t, "first", call(h, "GET", "/product/1", "acme"), want{200, "1", "0", "60", ""})
	for _, p := range []string{"/product/1/", "/Product/1", "/product/1/../1", "//product/./1", "/PRODUCT/2"} {
		w := call(h, "GET", p, "acme")
		if w.Code != http.StatusTooManyRequests {
			t.Errorf("GET %s: status %d, want 429: the limit of /product/* applies", p, w.Code)
		}
	}
	if *served != 1 {
		t.Errorf("the handler served %d requests, want 1", *served)
	}
}

// TestNewMiddlewareNeedsATenant: there is no default tenant (such as the
// client-set header X-Tenant-Id, which would let a client rotate its way
// to unlimited budgets): a nil tenant function is refused.
func TestNewMiddlewareNeedsATenant(t *testing.T) {
	_, err := httpserver.NewMiddleware([]httpserver.SLA{getProduct(throttle.Tier{Period: time.Second, Limit: 1})}, httpserver.LocalWindows(nil), nil)
	if !errors.Is(err, throttle.ErrInvalid) || !strings.Contains(err.Error(), "tenant") {
		t.Errorf("NewMiddleware with a nil tenant: %v; want ErrInvalid naming tenant", err)
	}
}

// TestMiddlewareRefusedHandler: a refused request is answered by the
// handler of WithRefusedHandler, with the rate-limit headers already set
// and the refusing SLA at hand.
func TestMiddlewareRefusedHandler(t *testing.T) {
	clk := clockwork.NewFakeClockAt(windowStart)
	refused := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := httpserver.RefusedSLA(r)
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintf(w, `{"title":"slow down","sla":%q,"refused":%v}`, id, ok)
	})
	h, _ := newTestMiddleware(t, clk, []httpserver.SLA{getProduct(throttle.Tier{Period: time.Minute, Limit: 1})}, httpserver.WithRefusedHandler(refused))
	call(h, "GET", "/product/1", "acme")
	w := call(h, "GET", "/product/1", "acme")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Content-Type") != "application/problem+json" ||
		w.Body.String() != `{"title":"slow down","sla":"get-product","refused":true}` {
		t.Errorf("refused: %d %q %q; want the custom 429", w.Code, w.Header().Get("Content-Type"), w.Body.String())
	}
	if w.Header().Get("Retry-After") != "60" || w.Header().Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("refused: headers %v; want Retry-After and X-RateLimit-* set before the handler", w.Header())
	}
}

// TestMiddlewareStoreErrorsLoggedOnce: while the store is down, a burst
// of requests logs one line (with their number), not one per request.
func TestMiddlewareStoreErrorsLoggedOnce(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, nil))
	m, err := httpserver.NewMiddleware([]httpserver.SLA{getProduct(throttle.Tier{Period: time.Second, Limit: 1})},
		func(httpserver.SLA) (throttle.Bucket, error) { return failingBucket{}, nil },
		httpserver.TenantHeader("X-Org-Id"), httpserver.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	h := m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	for range 100 {
		if w := call(h, "GET", "/product/1", "acme"); w.Code != http.StatusOK {
			t.Fatalf("status %d, want 200 (served unlimited)", w.Code)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(buf.String(), "\n"); n != 1 {
		t.Errorf("%d log lines for 100 requests while the store is down, want 1:\n%s", n, buf.String())
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// hungBucket's Take waits for its context to end (10 s at most, so that
// a missing bound fails the test rather than hanging it), and records
// the deadline it had.
type hungBucket struct {
	mu        sync.Mutex
	deadlines []time.Duration // from the call's start; -1: none
}

func (b *hungBucket) Take(ctx context.Context, _ string, _ int64, _ time.Duration) (throttle.Decision, error) {
	left := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	b.mu.Lock()
	b.deadlines = append(b.deadlines, left)
	b.mu.Unlock()
	select {
	case <-ctx.Done():
		return throttle.Decision{}, &throttle.BackendError{Op: "take", Err: ctx.Err()}
	case <-time.After(10 * time.Second):
		return throttle.Decision{Granted: true, Limit: 1}, nil
	}
}

// TestMiddlewareStoreTimeoutBoundsABucketCall: a hung store holds a
// request at most the store timeout (the bucket call's context ends
// then), and the request is then answered by the failure policy.
func TestMiddlewareStoreTimeoutBoundsABucketCall(t *testing.T) {
	b := &hungBucket{}
	slas := []httpserver.SLA{getProduct(throttle.Tier{Period: time.Second, Limit: 1})}
	m, err := httpserver.NewMiddleware(slas, func(httpserver.SLA) (throttle.Bucket, error) { return b, nil },
		httpserver.TenantHeader("X-Org-Id"), httpserver.WithStoreTimeout(20*time.Millisecond),
		httpserver.WithFailurePolicy(throttle.FailClosed))
	if err != nil {
		t.Fatal(err)
	}
	served := false
	w := call(m.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served = true })), "GET", "/product/1", "acme")
	if w.Code != http.StatusServiceUnavailable || served {
		t.Errorf("status %d, served %v; want 503 and not served (FailClosed)", w.Code, served)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.deadlines) != 1 || b.deadlines[0] < 0 || b.deadlines[0] > 20*time.Millisecond {
		t.Errorf("the bucket call's deadlines %v from its start; want one of at most 20ms", b.deadlines)
	}
}
