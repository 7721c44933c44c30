package httpserver_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpserver"
)

// tenantKey is the context key of the tests' tenant: any bytes, as an
// authentication layer might put there.
type tenantKey struct{}

func tenantFromContext(r *http.Request) string {
	s, _ := r.Context().Value(tenantKey{}).(string)
	return s
}

// callAs serves one request for tenant through h.
func callAs(h http.Handler, tenant string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/product/1", nil)
	r = r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// forged is the name a tenant would choose to land on the key a long
// tenant was once counted under: "sha256:" and the hex digest of its
// name.
func forged(tenant string) string {
	sum := sha256.Sum256([]byte(tenant))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// TestMiddlewareKeepsTenantsApartWhenANameLooksLikeADigest: a tenant
// longer than 128 bytes is counted under a digest; a short tenant whose
// name is that digest's text must not share its budget. With a limit of
// 1 a minute, each one's first call is served, whichever comes first.
func TestMiddlewareKeepsTenantsApartWhenANameLooksLikeADigest(t *testing.T) {
	long := strings.Repeat("tenant-", 29) + "x" // 204 bytes
	short := forged(long)                       // 71 bytes
	for _, order := range [][2]string{{long, short}, {short, long}} {
		clk := clockwork.NewFakeClockAt(windowStart)
		m, err := httpserver.NewMiddleware([]httpserver.SLA{{ID: "get-product", Tiers: []throttle.Tier{{Period: time.Minute, Limit: 1}}}},
			httpserver.LocalWindows(clk), tenantFromContext)
		if err != nil {
			t.Fatal(err)
		}
		h := m.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		for _, tenant := range order {
			if w := callAs(h, tenant); w.Code != http.StatusOK {
				t.Errorf("the first call of the %d-byte tenant (after the %d-byte one's): status %d, want 200: the two share a budget",
					len(tenant), len(order[0])+len(order[1])-len(tenant), w.Code)
			}
		}
		for _, tenant := range order {
			if w := callAs(h, tenant); w.Code != http.StatusTooManyRequests {
				t.Errorf("the second call of the %d-byte tenant: status %d, want 429", len(tenant), w.Code)
			}
		}
	}
}

// FuzzTenantKeyKeepsTenantsApart sends calls of two tenants, and of the
// names that would forge their digests, through a Middleware whose
// bucket records the keys it is asked for: distinct tenants never share
// a key, a key is at most the SLA's ID, ':' and 128 bytes of UTF-8
// without control characters, '{' or '}', and a short name without them
// is its own key.
// The seeds are names that could be taken for another form: long ones,
// digests and their prefix, empty, invalid UTF-8, control and format
// characters, hash-tag braces, escapes.
func FuzzTenantKeyKeepsTenantsApart(f *testing.F) {
	long := strings.Repeat("tenant-", 29) + "x"
	for _, s := range [][2]string{
		{long, forged(long)},
		{"acme", "ACME"},
		{"", " "},
		{"sha256:", "sha256"},
		{forged("acme"), "acme"},
		{"sha256:" + strings.Repeat("0", 64), strings.Repeat("0", 64)},
		{strings.Repeat("a", 128), strings.Repeat("a", 129)},
		{"\xff", "\ufffd"},
		{"a\x00b", "a b"},
		{"a\u200bb", "ab"},
		{"a\u0085b", "team \U0001FAE9"},
		{"{acme}", "%7Bacme%7D"},
		{"}{", "a{b}c"},
		{"acme:1", "acme%3A1"},
		{"é", "e\u0301"},
		{string(make([]byte, 300)), string(make([]byte, 301))},
	} {
		f.Add(s[0], s[1])
	}
	const id = "get-product"
	f.Fuzz(func(t *testing.T, a, b string) {
		rec := &keyRecorder{}
		m, err := httpserver.NewMiddleware([]httpserver.SLA{{ID: id, Tiers: []throttle.Tier{{Period: time.Minute, Limit: 1}}}},
			func(httpserver.SLA) (throttle.Bucket, error) { return rec, nil }, tenantFromContext)
		if err != nil {
			t.Fatal(err)
		}
		h := m.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		tenants := []string{a, b, forged(a), forged(b), "sha256:" + a, a + b}
		for _, tenant := range tenants {
			callAs(h, tenant)
		}
		if len(rec.keys) != len(tenants) {
			t.Fatalf("%d keys taken for %d calls", len(rec.keys), len(tenants))
		}
		owner := make(map[string]string, len(tenants))
		for i, key := range rec.keys {
			tenant := tenants[i]
			if other, ok := owner[key]; ok && other != tenant {
				t.Fatalf("tenants %q and %q share the key %q", other, tenant, key)
			}
			owner[key] = tenant
			name, ok := strings.CutPrefix(key, id+":")
			if !ok {
				t.Fatalf("key %q for tenant %q does not begin with the SLA's ID", key, tenant)
			}
			if len(name) > 128 || !utf8.ValidString(name) || strings.ContainsAny(name, "{}") || strings.IndexFunc(name, unicode.IsControl) >= 0 {
				t.Fatalf("tenant %q has the key %q: want at most 128 bytes of UTF-8 without control characters or braces", tenant, key)
			}
			plain := len(tenant) <= 128 && utf8.ValidString(tenant) && !strings.ContainsAny(tenant, "{}") &&
				strings.IndexFunc(tenant, unicode.IsControl) < 0 && !strings.HasPrefix(tenant, "sha256:")
			if plain && name != tenant {
				t.Fatalf("the plain tenant %q has the key %q, want %q", tenant, key, id+":"+tenant)
			}
		}
	})
}

// TestTenantPathSegmentIsTheSegmentTheHandlerServes: the tenant read
// from a path segment is the wildcard net/http's ServeMux gives the
// handler, escaped slashes included: "/v1/organizations/acme%2Fx/..." is
// served for the organization "acme/x", and must be counted for it, not
// for "acme", whose budget it spent.
func TestTenantPathSegmentIsTheSegmentTheHandlerServes(t *testing.T) {
	tenantOf := httpserver.TenantPathSegment(2)
	var served, counted string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/organizations/{org}/product/{id}", func(w http.ResponseWriter, r *http.Request) {
		served, counted = r.PathValue("org"), tenantOf(r)
	})
	for _, p := range []string{
		"/v1/organizations/acme/product/7",
		"/v1/organizations/acme%2Fx/product/7",
		"/v1/organizations/acme%2fx%2F..%2F/product/7",
		"/v1/organizations/%61cme/product/7",
		"/v1/organizations/a%20b/product/7",
		"/v1/organizations/acme%252Fx/product/7",
		"/v1/organizations/%7Bacme%7D/product/7",
	} {
		served, counted = "", ""
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest("GET", p, nil))
		if w.Code != http.StatusOK {
			t.Errorf("GET %s: status %d", p, w.Code)
			continue
		}
		if counted != served {
			t.Errorf("GET %s: served for the organization %q, counted for %q", p, served, counted)
		}
	}
}

// keyOf returns the key a Middleware asks its bucket for when tenant
// calls an SLA with the ID "get-product".
func keyOf(t *testing.T, tenant string) string {
	t.Helper()
	rec := &keyRecorder{}
	m, err := httpserver.NewMiddleware([]httpserver.SLA{{ID: "get-product", Tiers: []throttle.Tier{{Period: time.Minute, Limit: 1}}}},
		func(httpserver.SLA) (throttle.Bucket, error) { return rec, nil }, tenantFromContext)
	if err != nil {
		t.Fatal(err)
	}
	callAs(m.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})), tenant)
	if len(rec.keys) != 1 {
		t.Fatalf("%d keys taken for one call", len(rec.keys))
	}
	return rec.keys[0]
}

// TestMiddlewareKeyDoesNotDependOnGosUnicodeTables: instances that share
// a store count a tenant under one key whatever Go built them. Whether a
// name is kept as it is must not hang on the Unicode version of the
// build's tables (unicode.IsPrint): a character that a later Unicode
// assigns (U+1FAE9, an emoji of Unicode 16.0; U+0378, unassigned) would
// otherwise be digested by one build and kept by the next, and the
// tenant counted twice, with two budgets, by a fleet of both. A name is
// kept when its characters are not controls, whatever the tables say of
// them; a name with a control character is digested.
func TestMiddlewareKeyDoesNotDependOnGosUnicodeTables(t *testing.T) {
	for _, tenant := range []string{"team \U0001FAE9", "x\u0378y", "acme", "é", "東京", "a b"} {
		if got, want := keyOf(t, tenant), "get-product:"+tenant; got != want {
			t.Errorf("tenant %+q (Go's Unicode %s) has the key %+q, want %+q", tenant, unicode.Version, got, want)
		}
	}
	for _, tenant := range []string{"a\x00b", "a\nb", "a\x7fb", "a\u0085b", "a\u009fb"} {
		if got := keyOf(t, tenant); got != "get-product:"+forged(tenant) {
			t.Errorf("tenant %+q, with a control character, has the key %+q, want its digest", tenant, got)
		}
	}
}
