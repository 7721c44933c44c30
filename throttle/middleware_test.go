package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/throttle"
)

// windowStart is a time aligned to every period the tests use.
var windowStart = time.Unix(1_800_000_000, 0)

func getProduct(tiers ...throttle.Tier) throttle.SLA {
	return throttle.SLA{ID: "get-product", Methods: []string{"GET"}, Path: "/product/*", Tenant: throttle.TenantHeader("X-Org-Id"), Tiers: tiers}
}

// newTestMiddleware wraps a handler that counts calls in m over
// in-memory windows on clk.
func newTestMiddleware(t *testing.T, clk clockwork.Clock, slas []throttle.SLA, opts ...throttle.Option) (http.Handler, *int) {
	t.Helper()
	m, err := throttle.NewMiddleware(slas, throttle.LocalWindows(throttle.WithClock(clk)), opts...)
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
			h, served := newTestMiddleware(t, clk, []throttle.SLA{s})

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
			h, served := newTestMiddleware(t, clk, []throttle.SLA{s})

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
	h, _ := newTestMiddleware(t, clk, []throttle.SLA{getProduct(throttle.Tier{Period: 10 * time.Second, Limit: 2})})
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
	slas := []throttle.SLA{
		{ID: "put-product", Methods: []string{"PUT"}, Path: "/v1/organizations/*/product/*", Tenant: throttle.TenantPathSegment(2), Tiers: []throttle.Tier{{Period: 10 * time.Second, Limit: 1}}},
		{ID: "get-product", Methods: []string{"GET"}, Path: "/v1/organizations/*/product/*", Tenant: throttle.TenantPathSegment(2), Tiers: []throttle.Tier{{Period: 10 * time.Second, Limit: 5}}},
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
		{"//x", 1, "x"},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("GET", tt.path, nil)
		if got := throttle.TenantPathSegment(tt.i)(r); got != tt.want {
			t.Errorf("TenantPathSegment(%d)(%q) = %q, want %q", tt.i, tt.path, got, tt.want)
		}
	}
}

func TestMiddlewareDraftHeaders(t *testing.T) {
	clk := clockwork.NewFakeClockAt(windowStart)
	h, _ := newTestMiddleware(t, clk, []throttle.SLA{getProduct(
		throttle.Tier{Period: time.Second, Limit: 10},
		throttle.Tier{Period: time.Minute, Limit: 12},
		throttle.Tier{Period: 1500 * time.Millisecond, Limit: 11},
	)}, throttle.WithDraftHeaders())
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
	if d, ok := throttle.RetryAfter(w.Header(), clk.Now()); !ok || d != time.Second {
		t.Errorf("RetryAfter of the draft headers = %v, %v; want 1s, true", d, ok)
	}
}

// failingBucket fails every Take.
type failingBucket struct{}

func (failingBucket) Take(context.Context, string, int64, time.Duration) (throttle.Decision, error) {
	return throttle.Decision{}, &throttle.BackendError{Op: "take", Err: errors.New("connection refused")}
}

func TestMiddlewareStoreFailure(t *testing.T) {
	factory := func(throttle.SLA) (throttle.Bucket, error) { return failingBucket{}, nil }
	slas := []throttle.SLA{getProduct(throttle.Tier{Period: time.Second, Limit: 1})}
	for _, tt := range []struct {
		name   string
		opts   []throttle.Option
		status int
		served int
	}{
		{"fails open by default", nil, 200, 1},
		{"WithFailClosed", []throttle.Option{throttle.WithFailClosed()}, 503, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, err := throttle.NewMiddleware(slas, factory, tt.opts...)
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
// replaced by its digest, and two long tenants stay apart.
func TestMiddlewareKeys(t *testing.T) {
	rec := &keyRecorder{}
	m, err := throttle.NewMiddleware([]throttle.SLA{getProduct(throttle.Tier{Period: time.Second, Limit: 1})},
		func(throttle.SLA) (throttle.Bucket, error) { return rec, nil })
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
		slas  []throttle.SLA
		field string
	}{
		{"empty ID", []throttle.SLA{{Tiers: []throttle.Tier{ok}}}, "ID"},
		{"ID with a space", []throttle.SLA{{ID: "get product", Tiers: []throttle.Tier{ok}}}, "ID"},
		{"ID with a brace", []throttle.SLA{{ID: "{x}", Tiers: []throttle.Tier{ok}}}, "ID"},
		{"repeated ID", []throttle.SLA{{ID: "a", Tiers: []throttle.Tier{ok}}, {ID: "a", Tiers: []throttle.Tier{ok}}}, "slas[1]: SLA: ID"},
		{"lower-case method", []throttle.SLA{{ID: "a", Methods: []string{"get"}, Tiers: []throttle.Tier{ok}}}, "Methods[0]"},
		{"bad pattern", []throttle.SLA{{ID: "a", Path: "/product/[", Tiers: []throttle.Tier{ok}}}, "Path"},
		{"no tiers", []throttle.SLA{{ID: "a"}}, "Tiers"},
		{"zero period", []throttle.SLA{{ID: "a", Tiers: []throttle.Tier{{Limit: 1}}}}, "Tiers[0].Period"},
		{"repeated period", []throttle.SLA{{ID: "a", Tiers: []throttle.Tier{ok, ok}}}, "Tiers[1].Period"},
		{"zero threshold", []throttle.SLA{{ID: "a", Tiers: []throttle.Tier{{Period: time.Second}}}}, "Tiers[0].Limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := throttle.NewMiddleware(tt.slas, throttle.LocalWindows())
			if !errors.Is(err, throttle.ErrInvalid) || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("NewMiddleware: %v; want ErrInvalid naming %s", err, tt.field)
			}
		})
	}
	if _, err := throttle.NewMiddleware(nil, nil); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("NewMiddleware with a nil factory: %v; want ErrInvalid", err)
	}
	boom := errors.New("boom")
	_, err := throttle.NewMiddleware([]throttle.SLA{{ID: "a", Tiers: []throttle.Tier{ok}}}, func(throttle.SLA) (throttle.Bucket, error) { return nil, boom })
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), `"a"`) {
		t.Errorf("NewMiddleware with a failing factory: %v; want the factory's error, naming the SLA", err)
	}
}

// TestLocalWindowsExceedsLimit: asking for more than the smallest
// threshold at once can never succeed.
func TestLocalWindowsExceedsLimit(t *testing.T) {
	b, err := throttle.LocalWindows()(throttle.SLA{ID: "a", Tiers: []throttle.Tier{{Period: time.Second, Limit: 5}, {Period: time.Minute, Limit: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Take(context.Background(), "k", 4, 0); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Errorf("Take(4): %v; want ErrExceedsLimit", err)
	}
	if d, err := b.Take(context.Background(), "k", 3, 0); err != nil || !d.Granted {
		t.Errorf("Take(3): %+v, %v; want granted", d, err)
	}
	if _, err := throttle.LocalWindows()(throttle.SLA{ID: "a"}); !errors.Is(err, throttle.ErrInvalid) {
		t.Errorf("LocalWindows with no tiers: %v; want ErrInvalid", err)
	}
}

// TestLocalWindowsManyKeys: many short-lived keys, swept as they go idle,
// each start with a full budget.
func TestLocalWindowsManyKeys(t *testing.T) {
	clk := clockwork.NewFakeClockAt(windowStart)
	for _, sliding := range []bool{false, true} {
		b, err := throttle.LocalWindows(throttle.WithClock(clk))(throttle.SLA{ID: "a", Sliding: sliding, Tiers: []throttle.Tier{{Period: time.Second, Limit: 1}}})
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

// A provider limits GET /product/* per organisation to 2 calls per 10 s.
// (A fake clock keeps the example's output stable; a real provider leaves
// WithClock out.)
func ExampleMiddleware() {
	clock := clockwork.NewFakeClockAt(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	m, err := throttle.NewMiddleware([]throttle.SLA{{
		ID:      "get-product",
		Methods: []string{"GET"},
		Path:    "/product/*",
		Tenant:  throttle.TenantHeader("X-Org-Id"),
		Tiers:   []throttle.Tier{{Period: 10 * time.Second, Limit: 2}},
	}}, throttle.LocalWindows(throttle.WithClock(clock)))
	if err != nil {
		fmt.Println(err)
		return
	}
	h := m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "product", path.Base(r.URL.Path))
	}))
	for _, org := range []string{"acme", "acme", "acme", "initech"} {
		r := httptest.NewRequest("GET", "/product/7", nil)
		r.Header.Set("X-Org-Id", org)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%s: %d limit=%s remaining=%s reset=%s retry-after=%q\n", org, w.Code,
			w.Header().Get("X-RateLimit-Limit"), w.Header().Get("X-RateLimit-Remaining"),
			w.Header().Get("X-RateLimit-Reset"), w.Header().Get("Retry-After"))
	}
	// Output:
	// acme: 200 limit=2 remaining=1 reset=10 retry-after=""
	// acme: 200 limit=2 remaining=0 reset=10 retry-after=""
	// acme: 429 limit=2 remaining=0 reset=10 retry-after="10"
	// initech: 200 limit=2 remaining=1 reset=10 retry-after=""
}
