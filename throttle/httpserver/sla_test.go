package httpserver_test

import (
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const full = `# Seed 000's limits, with tenants and a sliding window.
slas:
  - id: get-product
    enabled: true
    match:
      methods: [ 'GET', head ]
      pathPattern: /v1/organizations/*/product/*
    tenant: { pathSegment: 2 }
    tiers:
      - period: 1
        threshold: 10
      - period: 10
        threshold: 50
  - id: put-product
    match:
      methods: [PUT]
      pathPattern: /product/*
    tenant:
      header: X-Org-Id
    bucket: sliding
    tiers:
      - period: 10
        threshold: 100
  - id: old
    enabled: false
    tiers: [{period: 60, threshold: 1}]
  - id: catch-all
    tiers: [{period: 60, threshold: 1_000}]
`

func TestParse(t *testing.T) {
	slas, err := httpserver.ParseSLAs([]byte(full))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(slas) != 3 {
		t.Fatalf("got %d SLAs, want 3 (the disabled one left out)", len(slas))
	}
	g, p, c := slas[0], slas[1], slas[2]
	if g.ID != "get-product" || strings.Join(g.Methods, ",") != "GET,HEAD" || g.Path != "/v1/organizations/*/product/*" || g.Sliding ||
		len(g.Tiers) != 2 || g.Tiers[0] != (throttle.Tier{Period: time.Second, Limit: 10}) || g.Tiers[1] != (throttle.Tier{Period: 10 * time.Second, Limit: 50}) {
		t.Errorf("get-product = %+v", g)
	}
	if tenant := g.Tenant(httptest.NewRequest("GET", "/v1/organizations/acme/product/1", nil)); tenant != "acme" {
		t.Errorf("get-product's tenant = %q, want acme (path segment 2)", tenant)
	}
	if p.ID != "put-product" || !p.Sliding || p.Tiers[0] != (throttle.Tier{Period: 10 * time.Second, Limit: 100}) {
		t.Errorf("put-product = %+v", p)
	}
	r := httptest.NewRequest("PUT", "/product/1", nil)
	r.Header.Set("X-Org-Id", "initech")
	if tenant := p.Tenant(r); tenant != "initech" {
		t.Errorf("put-product's tenant = %q, want initech (header X-Org-Id)", tenant)
	}
	if c.ID != "catch-all" || c.Tenant != nil || c.Methods != nil || c.Path != "" || c.Tiers[0] != (throttle.Tier{Period: time.Minute, Limit: 1000}) {
		t.Errorf("catch-all = %+v", c)
	}
	if _, err := httpserver.NewMiddleware(slas, httpserver.LocalWindows(nil), httpserver.TenantHeader("X-Org-Id")); err != nil {
		t.Errorf("NewMiddleware refuses what Parse accepted: %v", err)
	}
}

// TestParseErrors: each malformed file is refused with the line and field
// at fault.
func TestParseErrors(t *testing.T) {
	// head is 8 lines; the field under test is on line 9 unless said.
	const head = `slas:
  - id: a
    tiers: [{period: 1, threshold: 1}]
  - id: b
    match:
      methods: [GET]
      pathPattern: /p/*
    tiers:
`
	tests := []struct {
		name  string
		yaml  string
		line  int
		field string
		msg   string
	}{
		{"empty file", ``, 1, "slas", "empty"},
		{"only a comment", "# nothing\n", 1, "slas", "empty"},
		// yaml.v3 places some syntax errors at the start of the enclosing
		// block (here the list, 0-based line 1) rather than at line 3.
		{"syntax error", "slas:\n  - id: a\n   tiers: x\n", 1, "", "malformed YAML"},
		{"tab indentation", "slas:\n\t- id: a\n", 2, "", "malformed YAML"},
		{"top level is a list", "- id: a\n", 1, "", "mapping"},
		{"unknown top-level field", "slas: []\nlimits: []\n", 2, "limits", "unknown field"},
		{"no slas", "{}\n", 1, "slas", "missing"},
		{"slas not a list", "slas: {id: a}\n", 1, "slas", "list"},
		{"slas empty", "slas: []\n", 1, "slas", "at least one"},
		{"two documents", "slas: [{id: a, tiers: [{period: 1, threshold: 1}]}]\n---\nslas: []\n", 2, "", "second YAML document"},
		{"unknown SLA field", head + "      - {period: 1, threshold: 1}\n    burst: 5\n", 10, "slas[1].burst", "unknown field"},
		{"repeated field", "slas:\n  - id: a\n    id: b\n", 3, "slas[0].id", "repeated"},
		{"missing id", "slas:\n  - tiers: [{period: 1, threshold: 1}]\n", 2, "slas[0].id", "missing"},
		{"null id", "slas:\n  - id:\n    tiers: [{period: 1, threshold: 1}]\n", 2, "slas[0].id", "must be"},
		{"bad id", "slas:\n  - id: 'get {product}'\n    tiers: [{period: 1, threshold: 1}]\n", 2, "slas[0].id", "letters"},
		{"repeated id", "slas:\n  - id: a\n    tiers: [{period: 1, threshold: 1}]\n  - id: a\n    tiers: [{period: 1, threshold: 1}]\n", 4, "slas[1].id", "line 2"},
		{"enabled not a bool", "slas:\n  - id: a\n    enabled: maybe\n", 3, "slas[0].enabled", "true or false"},
		{"match not a mapping", "slas:\n  - id: a\n    match: GET\n", 3, "slas[0].match", "mapping"},
		{"unknown match field", "slas:\n  - id: a\n    match:\n      path: /x\n", 4, "slas[0].match.path", "unknown field"},
		{"methods not a list", "slas:\n  - id: a\n    match:\n      methods: GET\n", 4, "slas[0].match.methods", "list"},
		{"methods empty", "slas:\n  - id: a\n    match:\n      methods: []\n", 4, "slas[0].match.methods", "at least one method"},
		{"period in hex", "slas:\n  - id: a\n    tiers: [{period: 0x3c, threshold: 1}]\n", 3, "slas[0].tiers[0].period", "whole number"},
		{"bad method", "slas:\n  - id: a\n    match:\n      methods:\n        - GET\n        - 'GET /x'\n", 6, "slas[0].match.methods[1]", "HTTP method"},
		{"bad pattern", "slas:\n  - id: a\n    match:\n      pathPattern: /product/[\n", 4, "slas[0].match.pathPattern", "path pattern"},
		{"relative pattern", "slas:\n  - id: a\n    match:\n      pathPattern: product/*\n", 4, "slas[0].match.pathPattern", "starting with /"},
		{"tenant empty", "slas:\n  - id: a\n    tenant: {}\n", 3, "slas[0].tenant", "header or pathSegment"},
		{"tenant both", "slas:\n  - id: a\n    tenant:\n      header: X-Org-Id\n      pathSegment: 2\n", 5, "slas[0].tenant.pathSegment", "not both"},
		{"tenant bad header", "slas:\n  - id: a\n    tenant:\n      header: 'X Org'\n", 4, "slas[0].tenant.header", "header name"},
		{"tenant negative segment", "slas:\n  - id: a\n    tenant:\n      pathSegment: -1\n", 4, "slas[0].tenant.pathSegment", "from 0 to 64"},
		{"tenant unknown field", "slas:\n  - id: a\n    tenant:\n      cookie: org\n", 4, "slas[0].tenant.cookie", "unknown field"},
		{"bad bucket", "slas:\n  - id: a\n    bucket: leaky\n", 3, "slas[0].bucket", "fixed or sliding"},
		{"no tiers", "slas:\n  - id: a\n", 2, "slas[0].tiers", "missing"},
		{"empty tiers", "slas:\n  - id: a\n    tiers: []\n", 3, "slas[0].tiers", "at least one"},
		{"tier not a mapping", head + "      - 10\n", 9, "slas[1].tiers[0]", "mapping"},
		{"tier without period", head + "      - threshold: 5\n", 9, "slas[1].tiers[0].period", "missing"},
		{"tier without threshold", head + "      - period: 5\n", 9, "slas[1].tiers[0].threshold", "missing"},
		{"negative period", head + "      - period: -3\n        threshold: 5\n", 9, "slas[1].tiers[0].period", `got "-3"`},
		{"zero period", head + "      - period: 0\n        threshold: 5\n", 9, "slas[1].tiers[0].period", "from 1 to"},
		{"fractional period", head + "      - period: 1.5\n        threshold: 5\n", 9, "slas[1].tiers[0].period", "whole number"},
		{"period as text", head + "      - period: 10s\n        threshold: 5\n", 9, "slas[1].tiers[0].period", "whole number"},
		{"period too long", head + "      - period: 99999999999\n        threshold: 5\n", 9, "slas[1].tiers[0].period", "to 31622400"},
		{"zero threshold", head + "      - period: 10\n        threshold: 0\n", 10, "slas[1].tiers[0].threshold", "at least"[:0] + "from 1"},
		{"huge threshold", head + "      - period: 10\n        threshold: 99999999999999999999\n", 10, "slas[1].tiers[0].threshold", "whole number"},
		{"repeated period", head + "      - {period: 10, threshold: 5}\n      - {period: 10, threshold: 9}\n", 10, "slas[1].tiers[1].period", "tiers[0]"},
		{"unknown tier field", head + "      - {period: 10, threshold: 5, burst: 2}\n", 9, "slas[1].tiers[0].burst", "unknown field"},
		{"alias", "slas:\n  - id: a\n    tiers: &t [{period: 1, threshold: 1}]\n  - id: b\n    tiers: *t\n", 3, "slas[0].tiers", "aliases"},
		{"merge key", "slas:\n  - id: a\n    <<: {enabled: true}\n", 3, "slas[0]", "aliases"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := httpserver.ParseSLAs([]byte(tt.yaml))
			var e *httpserver.SLAError
			if !errors.As(err, &e) {
				t.Fatalf("Parse: %v; want an *httpserver.SLAError", err)
			}
			if e.Line != tt.line || e.Field != tt.field || !strings.Contains(e.Msg, tt.msg) {
				t.Errorf("Parse: line %d, field %q, msg %q; want line %d, field %q, a message with %q", e.Line, e.Field, e.Msg, tt.line, tt.field, tt.msg)
			}
			if !errors.Is(err, throttle.ErrInvalid) {
				t.Errorf("Parse: %v does not match throttle.ErrInvalid", err)
			}
			if want := "line "; e.Line > 0 && !strings.Contains(err.Error(), want) {
				t.Errorf("the message %q does not name the line", err)
			}
		})
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(good, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	if slas, err := httpserver.LoadSLAs(good); err != nil || len(slas) != 3 {
		t.Errorf("LoadFile: %d SLAs, %v; want 3", len(slas), err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("slas:\n  - id: a\n    tiers: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := httpserver.LoadSLAs(bad)
	if err == nil || !strings.Contains(err.Error(), "bad.yaml: line 3: slas[0].tiers:") {
		t.Errorf("LoadFile: %v; want the file's name, line and field", err)
	}
	if _, err := httpserver.LoadSLAs(filepath.Join(dir, "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadFile of a missing file: %v; want os.ErrNotExist", err)
	}
}

// FuzzParse checks that no input makes Parse panic, that every refusal is
// an *httpserver.SLAError, and that whatever it accepts NewMiddleware accepts too.
func FuzzParse(f *testing.F) {
	f.Add([]byte(full))
	f.Add([]byte(""))
	f.Add([]byte("slas: []"))
	f.Add([]byte("slas:\n  - id: a\n    tiers: [{period: 1, threshold: 1}]\n"))
	f.Add([]byte("slas:\n  - id: a\n    tiers: &t [{period: 1, threshold: 1}]\n  - id: b\n    tiers: *t\n"))
	f.Add([]byte("slas:\n  - id: a\n    match: {methods: [get], pathPattern: '/x/[a-'}\n    tiers: [{period: 1, threshold: 1}]\n"))
	f.Add([]byte("slas:\n  - id: a\n    tenant: {pathSegment: 99999999999999999999}\n"))
	f.Add([]byte("a: &a [*a]"))
	f.Add([]byte("slas: [{id: x, tiers: [{period: 0b11, threshold: 0o17}]}]"))
	f.Add([]byte("\xff\xfe"))
	f.Fuzz(func(t *testing.T, data []byte) {
		slas, err := httpserver.ParseSLAs(data)
		if err != nil {
			var e *httpserver.SLAError
			if !errors.As(err, &e) {
				t.Fatalf("Parse: %v is not an *httpserver.SLAError", err)
			}
			return
		}
		if _, err := httpserver.NewMiddleware(slas, httpserver.LocalWindows(nil), httpserver.TenantHeader("X-Org-Id")); err != nil && len(slas) > 0 {
			t.Fatalf("NewMiddleware refuses what Parse accepted: %v", err)
		}
	})
}
