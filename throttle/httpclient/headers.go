package httpclient

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Header parsing: how long a provider asks its callers to stay away.

// epochSeconds and epochMillis are the smallest reset values read as a
// Unix time in seconds, rather than seconds from now, and in milliseconds
// (see RetryAfter): no window is 31 years long, no provider sends a reset
// before 2001, and 10¹² s, unlike 10¹² ms, is a date in the year 33658.
const (
	epochSeconds = 1_000_000_000
	epochMillis  = 1_000_000_000_000
)

// maxHeaderSeconds caps every number of seconds read from a header, so that
// converting it to a time.Duration cannot overflow (2³³ s ≈ 272 years).
const maxHeaderSeconds = 1 << 33

// RetryAfter reports how long resp asks its caller to wait before trying
// again, at time now, and whether it says so at all. The first of these
// that applies wins:
//
//  1. Retry-After-Ms (OpenAI), a number of milliseconds, with a
//     fraction or without; then Retry-After (RFC 9110): a whole number
//     of seconds, or an HTTP date (IMF-fixdate, RFC 850 or asctime).
//     They always apply.
//  2. RateLimit-Reset (IETF draft up to -06, GitLab and others), when
//     nothing remains: seconds from now, or a Unix time (see below).
//  3. RateLimit (IETF draft): in the dictionary form of draft -07,
//     `limit=100, remaining=0, reset=30`, the reset when remaining is 0;
//     in the list form of drafts -08 on, `"default";r=0;t=30`, the
//     largest t of the items whose r is 0.
//  4. X-RateLimit-Reset (GitHub, Twitter, Salesforce and others), when
//     nothing remains: seconds from now, or a Unix time in seconds or
//     milliseconds. A fraction is accepted ("1.5", "1470173023.123").
//  5. The accounting headers of LLM providers, per dimension (requests,
//     tokens, input and output tokens): OpenAI's
//     x-ratelimit-remaining-requests / -tokens with
//     x-ratelimit-reset-requests / -tokens (Go durations: "1s", "6m0s",
//     "20ms", or plain seconds), and Anthropic's
//     anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-remaining
//     with -reset (RFC 3339 times), when some dimension has nothing
//     remaining: the latest among those dimensions of its reset, or, for
//     requests on a success (2xx) that names the requests limit, the
//     reset's share of one request (reset / limit): both providers'
//     reset is when the window's last call is gone, and a provider that
//     restores requests as its calls age (a sliding window, a continuous
//     refill) has one back far sooner. Tokens, and any other status, hold
//     the whole reset. A dimension with some remaining says nothing, even
//     on a 429 (the provider may have refused for a limit it does not
//     report, such as concurrency).
//
// A reset header tells when a window ends, not that the caller must wait
// for it: it applies only when its remaining count (RateLimit-Remaining,
// X-RateLimit-Remaining) is 0, or when resp's status is 429 Too Many
// Requests. A 503 with "X-RateLimit-Remaining: 4999" is an outage, not a
// limit, and its reset is ignored.
//
// A reset value of 10⁹ or more is a Unix time in seconds (10⁹ s is 31.7
// years as a delay, but 2001-09-09 as a date, so the readings cannot be
// confused), and one of 10¹² or more a Unix time in milliseconds.
//
// now is when resp arrived, on the caller's clock, and the result a
// duration from then. A time (an HTTP date, a Unix time, an RFC 3339
// time) is on the provider's clock, so it is read against resp's Date
// header, the provider's time of the answer, when it has one that
// parses: an instance whose clock is seconds off waits what the provider
// meant, not those seconds more or less. Date names a whole second: when
// now falls within that second, the clocks agree and now, the finer, is
// used. Without a Date, times are read against now.
//
// Numbers must be plain decimal digits (no sign, exponent or hex); a value
// that does not parse is skipped and the next header is tried. A time in
// the past gives 0 with ok true: the caller may go again now. Values are
// capped at 2³³ seconds so that nothing overflows. A nil resp says
// nothing: 0, false.
func RetryAfter(resp *http.Response, now time.Time) (d time.Duration, ok bool) {
	if resp == nil {
		return 0, false
	}
	// Absolute times are on the provider's clock.
	now = providerNow(resp.Header, now)
	if d, ok := retryHeaders(resp, now); ok {
		return d, true
	}
	return accountingReset(resp.Header, now, success(resp.StatusCode))
}

// retryHeaders is RetryAfter's steps 1 to 4, before the accounting
// headers, now being on the provider's clock.
func retryHeaders(resp *http.Response, now time.Time) (time.Duration, bool) {
	h := resp.Header
	if v := h.Get("Retry-After-Ms"); v != "" {
		if ms, frac, ok := parseDecimal(v, true); ok {
			// Capped before the multiplication, so that it cannot overflow.
			return min(time.Duration(min(ms, maxHeaderSeconds*1000))*time.Millisecond+time.Duration(frac)/1000, maxHeaderSeconds*time.Second), true
		}
	}
	if v := h.Get("Retry-After"); v != "" {
		if d, ok := parseSeconds(v, false); ok {
			return d, true
		}
		if t, err := http.ParseTime(strings.TrimSpace(v)); err == nil {
			return until(t, now), true
		}
	}
	limited := resp.StatusCode == http.StatusTooManyRequests
	if v := h.Get("RateLimit-Reset"); v != "" && (limited || noneLeft(h, "RateLimit-Remaining")) {
		if d, ok := parseReset(v, now, false); ok {
			return d, true
		}
	}
	if v := h.Values("RateLimit"); len(v) > 0 {
		if d, ok := parseRateLimitField(strings.Join(v, ","), now); ok {
			return d, true
		}
	}
	if v := h.Get("X-RateLimit-Reset"); v != "" && (limited || noneLeft(h, "X-RateLimit-Remaining")) {
		if d, ok := parseReset(v, now, true); ok {
			return d, true
		}
	}
	return 0, false
}

// providerNow is the time against which the absolute times of a response
// with header h that came at now are read: its Date, or now when Date is
// missing, does not parse, or names the second now falls in (see
// RetryAfter).
func providerNow(h http.Header, now time.Time) time.Time {
	v := h.Get("Date")
	if v == "" {
		return now
	}
	date, err := http.ParseTime(strings.TrimSpace(v))
	if err != nil {
		return now
	}
	if !now.Before(date) && now.Before(date.Add(time.Second)) {
		return now
	}
	return date
}

// noneLeft reports whether header name of h is the number 0.
func noneLeft(h http.Header, name string) bool {
	n, _, ok := parseDecimal(h.Get(name), false)
	return ok && n == 0
}

// until is t - now, never negative and capped at maxHeaderSeconds.
func until(t, now time.Time) time.Duration {
	return min(max(t.Sub(now), 0), maxHeaderSeconds*time.Second)
}

// parseReset reads a reset: seconds from now, or a Unix time in seconds
// or milliseconds (see RetryAfter), with a fraction when fraction is true.
func parseReset(v string, now time.Time, fraction bool) (time.Duration, bool) {
	secs, nanos, ok := parseDecimal(v, fraction)
	switch {
	case !ok:
		return 0, false
	case secs >= epochMillis:
		return until(time.UnixMilli(secs), now), true
	case secs >= epochSeconds:
		return until(time.Unix(secs, nanos), now), true
	}
	return time.Duration(secs)*time.Second + time.Duration(nanos), true
}

// parseSeconds reads a number of seconds: digits, and a fraction when
// fraction is true.
func parseSeconds(s string, fraction bool) (time.Duration, bool) {
	secs, nanos, ok := parseDecimal(s, fraction)
	if !ok {
		return 0, false
	}
	return time.Duration(min(secs, maxHeaderSeconds))*time.Second + time.Duration(nanos), true
}

// parseDecimal reads `digits[.digits]` (the fraction only when fraction is
// true) after trimming spaces, and returns the whole number, capped at
// 10¹⁸ (so that it tells a Unix time in milliseconds from one in seconds),
// and the fraction in nanoseconds (digits beyond the ninth are dropped).
func parseDecimal(s string, fraction bool) (secs, nanos int64, ok bool) {
	s = strings.TrimSpace(s)
	whole, frac, hasFrac := strings.Cut(s, ".")
	if whole == "" || !allDigits(whole) {
		return 0, 0, false
	}
	if hasFrac && (!fraction || frac == "" || !allDigits(frac)) {
		return 0, 0, false
	}
	// ParseInt cannot fail below: digits only, at most 18, then 9.
	whole = strings.TrimLeft(whole, "0")
	if len(whole) > 18 { // beyond 10¹⁸: cap
		secs = 1_000_000_000_000_000_000
	} else if whole != "" {
		secs, _ = strconv.ParseInt(whole, 10, 64)
	}
	if hasFrac {
		nanos, _ = strconv.ParseInt((frac + "000000000")[:9], 10, 64)
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

// parseRateLimitField reads the draft RateLimit field. Draft -07 made it
// a dictionary, `limit=100, remaining=0, reset=30`: the reset applies when
// remaining is 0. Drafts -08 on made it a list of named policies,
// `"policy";r=remaining;t=reset`: the answer is the largest t among the
// items whose r is 0, the time until every exhausted policy allows calls
// again. It is lenient about spaces and ignores parameters it does not
// know; it does not unescape quoted strings, which it never needs.
func parseRateLimitField(v string, now time.Time) (time.Duration, bool) {
	var best time.Duration
	found := false
	var dictRemaining, dictReset string // "" (a member missing) does not parse
	for _, item := range splitOutsideQuotes(v, ',') {
		params := splitOutsideQuotes(item, ';')
		if k, val, isMember := strings.Cut(strings.TrimSpace(params[0]), "="); isMember {
			// A dictionary member (draft -07).
			switch strings.TrimSpace(k) {
			case "remaining":
				dictRemaining = val
			case "reset":
				dictReset = val
			}
			continue
		}
		var r, t string // "" (a parameter missing) does not parse
		for _, p := range params[1:] {
			k, val, _ := strings.Cut(strings.TrimSpace(p), "=")
			switch k {
			case "r":
				r = val
			case "t":
				t = val
			}
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
	if found {
		return best, true
	}
	if rem, _, ok := parseDecimal(dictRemaining, false); ok && rem == 0 {
		return parseReset(dictReset, now, false)
	}
	return 0, false
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
