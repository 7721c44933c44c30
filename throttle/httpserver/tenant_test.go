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
