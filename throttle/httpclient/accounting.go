package httpclient

import (
	"net/http"
	"slices"
	"strings"
	"time"
)

// The accounting headers of LLM providers: several dimensions (requests,
// tokens, input and output tokens), each with its limit, what remains of
// it and when it resets.

// dimension names the headers of one dimension a provider accounts for.
type dimension struct {
	// name is the dimension's name in a throttle.Exhausted.
	name                    string
	limit, remaining, reset string
	// requests: the limit counts calls, per minute, and is advertised to
	// the adaptive rate; the others count tokens.
	requests bool
	// parse reads the reset.
	parse func(v string, now time.Time) (time.Duration, bool)
}

// accountingDimensions are OpenAI's x-ratelimit-* headers (resets are Go
// durations, "6m0s") and Anthropic's anthropic-ratelimit-* headers
// (resets are RFC 3339 times). Both count per minute.
var accountingDimensions = []dimension{
	{"requests", "X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests", true, parseGoDuration},
	{"tokens", "X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens", false, parseGoDuration},
	{"requests", "Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset", true, parseRFC3339},
	{"tokens", "Anthropic-Ratelimit-Tokens-Limit", "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset", false, parseRFC3339},
	{"input-tokens", "Anthropic-Ratelimit-Input-Tokens-Limit", "Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset", false, parseRFC3339},
	{"output-tokens", "Anthropic-Ratelimit-Output-Tokens-Limit", "Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset", false, parseRFC3339},
}

// accountingWindow is the window of the requests limits the accounting
// headers advertise, which the headers do not name: OpenAI and Anthropic
// both count per minute. Another provider's window is the caller's to
// set (see ReadAnswer).
const accountingWindow = time.Minute

// exhaustion is one dimension an answer's accounting headers name as
// exhausted: nothing remaining, with a reset that parses.
type exhaustion struct {
	dim string
	// reset is the provider's reset, capped at maxPause: OpenAI's is the
	// time until the dimension is fully restored, Anthropic's the time
	// at which it is.
	reset time.Duration
	// hold is how long the dimension is held back: the reset, except on
	// a success for a requests dimension that names its limit, where it
	// is the reset's share of one request, reset / limit rounded up (see
	// RetryAfter, step 5; for aligned windows, Transport.holds). A tokens
	// dimension is held for its reset: the next call's tokens, not one
	// token, must come back, and the headers do not say how many that is.
	hold time.Duration
}

// accountingExhausted lists the dimensions of h with nothing remaining
// and a reset that parses, in the order of accountingDimensions; a
// dimension both providers' headers name is listed once, with the later
// reset and hold. success says the answer was a success (2xx).
func accountingExhausted(h http.Header, now time.Time, success bool) []exhaustion {
	var out []exhaustion
	for _, d := range accountingDimensions {
		v := h.Get(d.reset)
		if v == "" || !noneLeft(h, d.remaining) {
			continue
		}
		reset, ok := d.parse(v, now)
		if !ok {
			continue
		}
		reset = min(reset, maxPause)
		hold := reset
		if limit, _, ok := parseDecimal(h.Get(d.limit), false); success && d.requests && ok && limit > 1 {
			hold = (reset + time.Duration(limit) - 1) / time.Duration(limit)
		}
		i := slices.IndexFunc(out, func(e exhaustion) bool { return e.dim == d.name })
		if i < 0 {
			out = append(out, exhaustion{dim: d.name, reset: reset, hold: hold})
		} else {
			out[i].reset, out[i].hold = max(out[i].reset, reset), max(out[i].hold, hold)
		}
	}
	return out
}

// accountingReset is RetryAfter's step 5: when some dimension of h has
// nothing remaining, the latest of those dimensions' holds (every
// exhausted dimension must recover before a call can pass). Others say
// nothing, even on a 429: the provider may have refused for a limit it
// does not report (concurrency, a long request), and a pause until a
// window's end would idle the fleet for nothing.
func accountingReset(h http.Header, now time.Time, success bool) (time.Duration, bool) {
	ex := accountingExhausted(h, now, success)
	var latest time.Duration
	for _, e := range ex {
		latest = max(latest, e.hold)
	}
	return latest, len(ex) > 0
}

// accountingLimit is the smallest requests limit the accounting headers
// advertise, per accountingWindow (0: none).
func accountingLimit(h http.Header) int64 {
	var best int64
	for _, d := range accountingDimensions {
		if !d.requests {
			continue
		}
		if q, _, ok := parseDecimal(h.Get(d.limit), false); ok && q > 0 && (best == 0 || q < best) {
			best = q
		}
	}
	return best
}

// parseGoDuration reads a reset written as a Go duration ("1s", "6m0s",
// "20ms", "1m30.5s"), or as a plain number of seconds. A sign, an
// overflow or any other text is refused; the result is capped at
// maxHeaderSeconds.
func parseGoDuration(v string, _ time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" || v[0] < '0' || v[0] > '9' {
		return 0, false // no sign (so ParseDuration gives no negative)
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return parseSeconds(v, true)
	}
	return min(d, maxHeaderSeconds*time.Second), true
}

// parseRFC3339 reads a reset written as an RFC 3339 time: the time left
// until it from now, 0 when it is past, capped at maxHeaderSeconds.
func parseRFC3339(v string, now time.Time) (time.Duration, bool) {
	t, err := time.Parse(time.RFC3339, strings.TrimSpace(v))
	if err != nil {
		return 0, false
	}
	return until(t, now), true
}
