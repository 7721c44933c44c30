package httpserver_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpserver"
)

// TestMiddlewareEncodedSlashKeepsTheLimit: "/product/1%2Fx" reaches the
// handler of "GET /product/{id}" (net/http's ServeMux matches escaped
// segments: id is "1/x"), so it must count against /product/*. Matched on
// the decoded path "/product/1/x" only, it passed unlimited.
func TestMiddlewareEncodedSlashKeepsTheLimit(t *testing.T) {
	clk := clockwork.NewFakeClockAt(windowStart)
	m, err := httpserver.NewMiddleware([]httpserver.SLA{getProduct(throttle.Tier{Period: time.Minute, Limit: 1})},
		httpserver.LocalWindows(clk), httpserver.TenantHeader("X-Org-Id"))
	if err != nil {
		t.Fatal(err)
	}
	served := 0
	mux := http.NewServeMux()
	mux.HandleFunc("GET /product/{id}", func(w http.ResponseWriter, r *http.Request) { served++ })
	h := m.Wrap(mux)
	check(t, "first", call(h, "GET", "/product/1", "acme"), want{200, "1", "0", "60", ""})
	for _, p := range []string{"/product/1%2Fx", "/product/%31", "/product/1%2f..%2f2"} {
		if w := call(h, "GET", p, "acme"); w.Code != http.StatusTooManyRequests {
			t.Errorf("GET %s: status %d, want 429: the limit of /product/* applies", p, w.Code)
		}
	}
	if served != 1 {
		t.Errorf("the product handler served %d requests, want 1", served)
	}
}
