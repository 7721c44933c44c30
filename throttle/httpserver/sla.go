package httpserver

// Reading SLAs from YAML.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/headway-go/headway/internal/slarules"
	"github.com/headway-go/headway/throttle"
)

// MaxSLAPeriod is the longest tier period a limits file may set, in
// seconds (366 days).
const MaxSLAPeriod = 366 * 24 * 60 * 60

// MaxSLAFileSize is the largest limits file [ParseSLAs] reads, in bytes.
const MaxSLAFileSize = 1 << 20

// SLAError reports what is wrong in a limits file and where. It matches
// [throttle.ErrInvalid] with errors.Is.
type SLAError struct {
	// File is the file's name, when [LoadSLAs] read it.
	File string
	// Line is the 1-based line of the offending field; 0 if unknown. For
	// a YAML syntax error it is the line the parser reports, for some
	// errors the start of the enclosing block: look there or just after.
	Line int
	// Field is the path to the offending field, such as
	// "slas[1].tiers[0].period"; "" for a YAML syntax error.
	Field string
	// Msg says what is wrong and what is expected.
	Msg string
}

// Error implements error.
func (e *SLAError) Error() string {
	var b strings.Builder
	b.WriteString("httpserver: limits")
	if e.File != "" {
		b.WriteString(" " + e.File)
	}
	b.WriteString(": ")
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns [throttle.ErrInvalid].
func (e *SLAError) Unwrap() error { return throttle.ErrInvalid }

// LoadSLAs reads and parses the limits file at name; see [ParseSLAs].
func LoadSLAs(name string) ([]SLA, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("httpserver: reading limits: %w", err)
	}
	defer f.Close()
	// Read at most one byte past the limit, so that ParseSLAs reports an
	// oversized file (or /dev/zero) instead of reading it all.
	data, err := io.ReadAll(io.LimitReader(f, MaxSLAFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("httpserver: reading limits: %w", err)
	}
	slas, err := ParseSLAs(data)
	if e, ok := err.(*SLAError); ok {
		e.File = name
	}
	return slas, err // slas is nil with an error
}

// ParseSLAs reads a limits file (its format is in the package
// documentation) and returns its enabled SLAs, in file order,
// ready for [NewMiddleware]. Disabled SLAs are checked too, but
// left out. A malformed file gives an [*SLAError] naming the line and field;
// so does a file larger than [MaxSLAFileSize].
func ParseSLAs(data []byte) ([]SLA, error) {
	if len(data) > MaxSLAFileSize {
		return nil, &SLAError{Msg: fmt.Sprintf("the file has %d bytes, more than the %d a limits file may have", len(data), MaxSLAFileSize)}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, syntaxError(err)
	}
	if len(doc.Content) == 0 { // io.EOF: no document at all
		return nil, &SLAError{Line: 1, Field: "slas", Msg: "the file is empty: want a top-level slas: list"}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, &SLAError{Line: extra.Line, Msg: "a second YAML document: want one"}
	} else if !errors.Is(err, io.EOF) {
		return nil, syntaxError(err)
	}
	return parseFile(doc.Content[0])
}

var yamlLine = regexp.MustCompile(`line (\d+): `)

// syntaxError turns a yaml.v3 error into an *SLAError with its line.
func syntaxError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	e := &SLAError{Msg: "malformed YAML: " + msg}
	if m := yamlLine.FindStringSubmatchIndex(msg); m != nil {
		e.Line, _ = strconv.Atoi(msg[m[2]:m[3]])
		e.Msg = "malformed YAML: " + msg[:m[0]] + msg[m[1]:]
	}
	return e
}

func fail(n *yaml.Node, field, format string, args ...any) error {
	return &SLAError{Line: n.Line, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// mapping checks that n is a mapping whose keys are all known and unique,
// and returns the value node of each key present.
func mapping(n *yaml.Node, field string, known ...string) (map[string]*yaml.Node, error) {
	if err := plain(n, field); err != nil {
		return nil, err
	}
	if n.Kind != yaml.MappingNode {
		return nil, fail(n, field, "must be a mapping with the fields %s", strings.Join(known, ", "))
	}
	out := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if err := plain(k, field); err != nil {
			return nil, err
		}
		name := k.Value
		sub := join(field, name)
		if k.Kind != yaml.ScalarNode {
			return nil, fail(k, field, "keys must be plain names")
		}
		if !slices.Contains(known, name) {
			return nil, fail(k, sub, "unknown field (want %s)", strings.Join(known, ", "))
		}
		if _, dup := out[name]; dup {
			return nil, fail(k, sub, "repeated field")
		}
		if err := plain(v, sub); err != nil {
			return nil, err
		}
		out[name] = v
	}
	return out, nil
}

// plain refuses anchors, aliases and merge keys.
func plain(n *yaml.Node, field string) error {
	if n.Kind == yaml.AliasNode || n.Anchor != "" || n.Tag == "!!merge" {
		return fail(n, field, "YAML anchors and aliases are not supported in a limits file")
	}
	return nil
}

func join(field, name string) string {
	if field == "" {
		return name
	}
	return field + "." + name
}

// scalar returns n's value, refusing a non-scalar or null.
func scalar(n *yaml.Node, field, want string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return "", fail(n, field, "must be %s", want)
	}
	return n.Value, nil
}

// integer reads a whole number within [lo, hi].
func integer(n *yaml.Node, field, what string, lo, hi int64) (int64, error) {
	want := fmt.Sprintf("%s from %d to %d", what, lo, hi)
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		return 0, fail(n, field, "must be %s, got %q", want, n.Value)
	}
	// Base 10 only: "010" is ten seconds, not eight; 0x and 0b refused.
	v, err := strconv.ParseInt(strings.TrimPrefix(strings.ReplaceAll(n.Value, "_", ""), "+"), 10, 64)
	if err != nil || v < lo || v > hi {
		return 0, fail(n, field, "must be %s, got %q", want, n.Value)
	}
	return v, nil
}

func parseFile(root *yaml.Node) ([]SLA, error) {
	top, err := mapping(root, "", "slas")
	if err != nil {
		return nil, err
	}
	list, ok := top["slas"]
	if !ok {
		return nil, fail(root, "slas", "missing: want a top-level slas: list")
	}
	if list.Kind != yaml.SequenceNode {
		return nil, fail(list, "slas", "must be a list of SLAs")
	}
	if len(list.Content) == 0 {
		return nil, fail(list, "slas", "must hold at least one SLA")
	}
	var out []SLA
	ids := map[string]int{} // id → line
	for i, n := range list.Content {
		s, enabled, err := parseSLA(n, fmt.Sprintf("slas[%d]", i))
		if err != nil {
			return nil, err
		}
		if line, dup := ids[s.ID]; dup {
			return nil, fail(n, fmt.Sprintf("slas[%d].id", i), "%q is already the id of the SLA at line %d", s.ID, line)
		}
		ids[s.ID] = n.Line
		if enabled {
			out = append(out, s)
		}
	}
	return out, nil
}

// parseSLA parses one SLA, and whether it is enabled; the field paths
// start with at.
func parseSLA(n *yaml.Node, at string) (SLA, bool, error) {
	var s SLA
	f, err := mapping(n, at, "id", "enabled", "match", "tenant", "bucket", "tiers")
	if err != nil {
		return s, false, err
	}
	idNode, ok := f["id"]
	if !ok {
		return s, false, fail(n, at+".id", "missing: every SLA needs an id")
	}
	if s.ID, err = scalar(idNode, at+".id", "a name"); err != nil {
		return s, false, err
	}
	if !slarules.ValidID(s.ID) {
		return s, false, fail(idNode, at+".id", "must be 1 to 128 letters, digits, '.', '_' or '-', got %q", s.ID)
	}

	enabled := true
	if v, ok := f["enabled"]; ok {
		if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" || v.Decode(&enabled) != nil {
			return s, false, fail(v, at+".enabled", "must be true or false, got %q", v.Value)
		}
	}

	if m, ok := f["match"]; ok {
		if s.Methods, s.Path, err = parseMatch(m, at+".match"); err != nil {
			return s, false, err
		}
	}
	if tn, ok := f["tenant"]; ok {
		if s.Tenant, err = parseTenant(tn, at+".tenant"); err != nil {
			return s, false, err
		}
	}
	if bn, ok := f["bucket"]; ok {
		if s.Sliding, err = parseBucket(bn, at+".bucket"); err != nil {
			return s, false, err
		}
	}
	tn, ok := f["tiers"]
	if !ok {
		return s, false, fail(n, at+".tiers", "missing: every SLA needs at least one tier")
	}
	if s.Tiers, err = parseTiers(tn, at+".tiers"); err != nil {
		return s, false, err
	}
	return s, enabled, nil
}

// parseMatch parses an SLA's match: its methods and its path pattern.
func parseMatch(m *yaml.Node, field string) (methods []string, pattern string, err error) {
	mf, err := mapping(m, field, "methods", "pathPattern")
	if err != nil {
		return nil, "", err
	}
	if ms, ok := mf["methods"]; ok {
		if methods, err = parseMethods(ms, field+".methods"); err != nil {
			return nil, "", err
		}
	}
	if pn, ok := mf["pathPattern"]; ok {
		field := field + ".pathPattern"
		v, err := scalar(pn, field, "a path pattern such as /product/*")
		if err != nil {
			return nil, "", err
		}
		if _, perr := path.Match(v, ""); perr != nil || !strings.HasPrefix(v, "/") {
			return nil, "", fail(pn, field, "must be a path pattern starting with / in path.Match syntax, such as /product/*, got %q", v)
		}
		pattern = v
	}
	return methods, pattern, nil
}

// parseMethods parses a match's list of HTTP methods, in upper case.
func parseMethods(ms *yaml.Node, field string) ([]string, error) {
	if ms.Kind != yaml.SequenceNode {
		return nil, fail(ms, field, "must be a list of HTTP methods, such as [GET, HEAD]")
	}
	if len(ms.Content) == 0 {
		// An empty list would match every method: most likely a
		// template that lost its values.
		return nil, fail(ms, field, "must list at least one method, or be left out to match every method")
	}
	var methods []string
	for j, mn := range ms.Content {
		mfield := fmt.Sprintf("%s[%d]", field, j)
		if err := plain(mn, mfield); err != nil {
			return nil, err
		}
		v, err := scalar(mn, mfield, "an HTTP method such as GET")
		if err != nil {
			return nil, err
		}
		v = strings.ToUpper(strings.TrimSpace(v))
		if !slarules.ValidMethod(v) {
			return nil, fail(mn, mfield, "must be an HTTP method such as GET, got %q", mn.Value)
		}
		methods = append(methods, v)
	}
	return methods, nil
}

// parseTenant parses an SLA's tenant: a header or a path segment, not
// both.
func parseTenant(tn *yaml.Node, field string) (func(*http.Request) string, error) {
	tf, err := mapping(tn, field, "header", "pathSegment")
	if err != nil {
		return nil, err
	}
	h, hasH := tf["header"]
	seg, hasSeg := tf["pathSegment"]
	switch {
	case hasH && hasSeg:
		return nil, fail(seg, field+".pathSegment", "set either header or pathSegment, not both")
	case hasH:
		v, err := scalar(h, field+".header", "a header name such as X-Org-Id")
		if err != nil {
			return nil, err
		}
		if !validHeader(v) {
			return nil, fail(h, field+".header", "must be a header name such as X-Org-Id, got %q", v)
		}
		return TenantHeader(v), nil
	case hasSeg:
		i, err := integer(seg, field+".pathSegment", "a path segment index (0 is the first)", 0, 64)
		if err != nil {
			return nil, err
		}
		return TenantPathSegment(int(i)), nil
	}
	return nil, fail(tn, field, "must set header or pathSegment")
}

// parseBucket parses an SLA's bucket, reporting whether it is sliding.
func parseBucket(bn *yaml.Node, field string) (sliding bool, err error) {
	v, err := scalar(bn, field, "fixed or sliding")
	if err == nil && v != "fixed" && v != "sliding" {
		err = fail(bn, field, "must be fixed or sliding, got %q", v)
	}
	return v == "sliding", err
}

// parseTiers parses an SLA's tiers: at least one, no two with the same
// period.
func parseTiers(tn *yaml.Node, field string) ([]throttle.Tier, error) {
	if tn.Kind != yaml.SequenceNode || len(tn.Content) == 0 {
		return nil, fail(tn, field, "must be a list of at least one tier of period and threshold")
	}
	var tiers []throttle.Tier
	periods := map[int64]int{} // period → tier index
	for j, t := range tn.Content {
		field := fmt.Sprintf("%s[%d]", field, j)
		tf, err := mapping(t, field, "period", "threshold")
		if err != nil {
			return nil, err
		}
		pn, ok := tf["period"]
		if !ok {
			return nil, fail(t, field+".period", "missing: every tier needs a period in seconds")
		}
		period, err := integer(pn, field+".period", "a whole number of seconds", 1, MaxSLAPeriod)
		if err != nil {
			return nil, err
		}
		if k, dup := periods[period]; dup {
			return nil, fail(pn, field+".period", "%d s is already the period of tiers[%d]", period, k)
		}
		periods[period] = j
		thn, ok := tf["threshold"]
		if !ok {
			return nil, fail(t, field+".threshold", "missing: every tier needs a threshold")
		}
		threshold, err := integer(thn, field+".threshold", "a whole number of calls", 1, 1<<53)
		if err != nil {
			return nil, err
		}
		tiers = append(tiers, throttle.Tier{Period: time.Duration(period) * time.Second, Limit: threshold})
	}
	return tiers, nil
}

// validHeader accepts an HTTP token (RFC 9110) as a header name.
func validHeader(h string) bool {
	if h == "" || len(h) > 128 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return http.CanonicalHeaderKey(h) != ""
}
