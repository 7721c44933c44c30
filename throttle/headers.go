package throttle

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header parsing: how long a provider asks its callers to stay away.

// epochThreshold is the smallest X-RateLimit-Reset value read as a Unix
// time rather than a number of seconds from now: 10⁹ seconds is about 31.7
// years as a delay, and 2001-09-09 as a date. No window is 31 years long and
// no provider sends a reset time before 2001, so the two readings never
// overlap in practice.
const epochThreshold = 1_000_000_000

// maxHeaderSeconds caps every number of seconds read from a header, so that
// converting it to a time.Duration cannot overflow (2³³ s ≈ 272 years).
const maxHeaderSeconds = 1 << 33

// RetryAfter reports how long a response's headers ask the caller to wait
// before trying again, at time now, and whether they say so at all. The
// first of these headers that parses wins:
//
//  1. Retry-After (RFC 9110): a whole number of seconds, or an HTTP date
//     (IMF-fixdate, RFC 850 or asctime).
//  2. RateLimit-Reset (IETF draft, versions up to -06): seconds from now.
//  3. RateLimit (IETF draft, versions -07 on), a structured list such as
//     `"default";r=0;t=30`: the largest t of the items whose r is 0.
//  4. X-RateLimit-Reset (GitHub, Twitter, Salesforce and others): seconds
//     from now, or, when the value is 1 000 000 000 or more, a Unix time in
//     seconds (10⁹ s is 31.7 years as a delay but 2001-09-09 as a date, so
//     the two readings cannot be confused). A fraction is accepted
//     ("1.5", "1470173023.123").
//
// Numbers must be plain decimal digits (no sign, exponent or hex); a value
// that does not parse is skipped and the next header is tried. A time in
// the past gives 0 with ok true: the caller may go again now. Values are
// capped at 2³³ seconds so that nothing overflows.
func RetryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	if v := h.Get("Retry-After"); v != "" {
		if d, ok := parseSeconds(v, false); ok {
			return d, true
		}
		if t, err := http.ParseTime(strings.TrimSpace(v)); err == nil {
			return min(max(t.Sub(now), 0), maxHeaderSeconds*time.Second), true
		}
	}
	if v := h.Get("RateLimit-Reset"); v != "" {
		if d, ok := parseSeconds(v, false); ok {
			return d, true
		}
	}
	if v := h.Values("RateLimit"); len(v) > 0 {
		if d, ok := parseRateLimitField(strings.Join(v, ",")); ok {
			return d, true
		}
	}
	if v := h.Get("X-RateLimit-Reset"); v != "" {
		if secs, nanos, ok := parseDecimal(v, true); ok {
			if secs >= epochThreshold {
				return min(max(time.Unix(secs, nanos).Sub(now), 0), maxHeaderSeconds*time.Second), true
			}
			return time.Duration(secs)*time.Second + time.Duration(nanos), true
		}
	}
	return 0, false
}

// parseSeconds reads a number of seconds: digits, and a fraction when
// fraction is true.
func parseSeconds(s string, fraction bool) (time.Duration, bool) {
	secs, nanos, ok := parseDecimal(s, fraction)
	if !ok {
		return 0, false
	}
	return time.Duration(secs)*time.Second + time.Duration(nanos), true
}

// parseDecimal reads `digits[.digits]` (the fraction only when fraction is
// true) after trimming spaces, and returns the whole seconds, capped at
// maxHeaderSeconds, and the fraction in nanoseconds (digits beyond the
// ninth are dropped).
func parseDecimal(s string, fraction bool) (secs, nanos int64, ok bool) {
	s = strings.TrimSpace(s)
	whole, frac, hasFrac := strings.Cut(s, ".")
	if whole == "" || !allDigits(whole) {
		return 0, 0, false
	}
	if hasFrac && (!fraction || frac == "" || !allDigits(frac)) {
		return 0, 0, false
	}
	whole = strings.TrimLeft(whole, "0")
	if len(whole) > 11 { // more than 10¹¹ s: cap
		secs = maxHeaderSeconds
	} else if whole != "" {
		v, err := strconv.ParseInt(whole, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		secs = min(v, maxHeaderSeconds)
	}
	if hasFrac {
		if len(frac) > 9 {
			frac = frac[:9]
		}
		f, err := strconv.ParseInt(frac+strings.Repeat("0", 9-len(frac)), 10, 64)
		if err != nil {
			return 0, 0, false
		}
		nanos = f
	}
	return secs, nanos, true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// parseRateLimitField reads the draft RateLimit field (a structured-field
// list of `"policy";r=remaining;t=reset` items) and returns the largest t
// among the items whose r is 0: the time until every exhausted policy
// allows calls again. It is lenient about spaces and ignores parameters it
// does not know; it does not unescape quoted strings, which it never needs.
func parseRateLimitField(v string) (time.Duration, bool) {
	var best time.Duration
	found := false
	for _, item := range splitOutsideQuotes(v, ',') {
		params := splitOutsideQuotes(item, ';')
		var r, t string
		hasR, hasT := false, false
		for _, p := range params[1:] {
			k, val, _ := strings.Cut(strings.TrimSpace(p), "=")
			switch k {
			case "r":
				r, hasR = val, true
			case "t":
				t, hasT = val, true
			}
		}
		if !hasR || !hasT {
			continue
		}
		if rem, _, ok := parseDecimal(r, false); !ok || rem != 0 {
			continue
		}
		d, ok := parseSeconds(t, false)
		if !ok {
			continue
		}
		if !found || d > best {
			best, found = d, true
		}
	}
	return best, found
}

// splitOutsideQuotes splits s at sep, except inside double-quoted strings
// (where a backslash escapes the next byte).
func splitOutsideQuotes(s string, sep byte) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// Header writing, for the provider side.

// ceilSeconds rounds d up to whole seconds, never below 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// setLimitHeaders writes the X-RateLimit-* headers for a decision: Limit
// when known, Remaining when known, Reset in whole seconds rounded up.
// A bucket that does not know its limit (Limit 0) gets no headers.
func setLimitHeaders(h http.Header, d Decision) {
	if d.Limit <= 0 {
		return
	}
	h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
	if d.Remaining >= 0 {
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(min(d.Remaining, d.Limit), 10))
	}
	h.Set("X-RateLimit-Reset", strconv.FormatInt(ceilSeconds(d.Reset), 10))
}
