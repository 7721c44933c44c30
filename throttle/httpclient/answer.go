package httpclient

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/headway-go/headway/throttle"
)

// ReadAnswer reads what an HTTP response says about the provider's limit,
// at time now, as the header conventions mean it, for
// [throttle.Limiter.Report] (the Transport reports every answer itself; a
// consumer handler that calls the provider can return it in a
// [throttle.AnswerError]):
//
//   - 429 Too Many Requests is a refusal. With a retry time ([RetryAfter]),
//     or 503 Service Unavailable with one, Retry is set: the caller should
//     pause (a 429 still counts as a refusal for the adaptive rate). A 503
//     says nothing about the rate.
//   - Any other status with nothing remaining (X-RateLimit-Remaining or
//     RateLimit-Remaining 0, or a draft RateLimit item with r=0) and a
//     reset time sets Retry: calls before the reset would be refused.
//     Remaining above 0 asks for nothing; a Retry-After on such a status
//     is ignored.
//   - The advertised limit, from X-RateLimit-Limit (per the bucket's own
//     interval, as the header names no window), RateLimit-Limit (draft
//     ≤ 06, with an optional `;w=` window) or RateLimit-Policy (`q=`
//     and `w=` of draft 07 on, or `limit;w=` before), OpenAI's
//     x-ratelimit-limit-requests or Anthropic's
//     anthropic-ratelimit-requests-limit: the smallest rate among the
//     policies given.
//   - The accounting headers name no window: x-ratelimit-limit-requests
//     and anthropic-ratelimit-requests-limit are read as per minute
//     (Window one minute), as OpenAI and Anthropic count requests. A
//     provider that sends the same headers for another window (Groq's
//     x-ratelimit-limit-requests counts per day) is misread by that
//     factor: a longer window reads as a faster rate, which lowers the
//     fleet's ceiling less than it should, never more; a shorter one
//     would lower it wrongly. Say otherwise by setting the Answer's
//     Window (in a [WithAnswer] hook for the Transport; see the
//     example of ReadAnswer).
//   - The accounting headers of LLM providers (OpenAI's x-ratelimit-*,
//     Anthropic's anthropic-ratelimit-*) count each dimension apart: any
//     dimension with nothing remaining, requests or tokens, and a reset
//     time sets Retry until the latest such reset, or, for requests after
//     a success, for the reset's share of one request (see [RetryAfter]).
//     A tokens limit is not a limit on calls: it sets no Limit. (The
//     Transport does better: [WithCost] over a bucket.Budget holds back
//     each exhausted dimension alone; and it learns, per key and
//     dimension, a provider that restores requests only at its window's
//     end, from a refusal (429) of a request sent after a success's hold
//     ended and before the reset it named: for 10 minutes from then a
//     success with nothing remaining holds that dimension until its reset.)
//
// Absolute times (HTTP dates, Unix times, RFC 3339) are read against
// the response's Date header, as [RetryAfter] says, and RetryAfter is
// capped at one hour: one answer never pauses the fleet for longer (see
// [throttle.Answer]).
//
// Values that do not parse (signs, exponents, overflowing durations,
// garbage) are ignored, header by header.
func ReadAnswer(resp *http.Response, now time.Time) throttle.Answer {
	var a throttle.Answer
	if resp == nil {
		return a
	}
	read := resp
	switch resp.StatusCode {
	case http.StatusTooManyRequests:
		a.Refused = true
	case http.StatusServiceUnavailable:
	default:
		// Only a reset with nothing remaining counts here: RetryAfter
		// applies that rule to resets; a bare Retry-After (or
		// Retry-After-Ms) on a success is not a limit.
		h := resp.Header.Clone()
		h.Del("Retry-After")
		h.Del("Retry-After-Ms")
		read = &http.Response{StatusCode: resp.StatusCode, Header: h}
	}
	a.RetryAfter, a.Retry = RetryAfter(read, now)
	a.RetryAfter = min(a.RetryAfter, maxPause)
	a.Limit, a.Window = advertisedLimit(resp.Header)
	return a
}

// report tells k's Limiter what the provider answered (see the Transport
// doc, "Adapting"). The retry time of an answer on a limit status is left
// to RoundTrip, which pauses the bucket itself (and this Transport); the
// refusal is still reported, for the adaptive rate. A retry time of zero
// (Retry-After: 0, a reset already past) pauses nothing.
func (t *Transport) report(ctx context.Context, k throttle.Keyed, resp *http.Response, sent, now time.Time) {
	a := ReadAnswer(resp, now)
	read := a
	if t.answer != nil {
		t.answer(resp, &a)
	}
	if a.Retry && a.RetryAfter > 0 && t.limit[resp.StatusCode] && read.Retry && a.RetryAfter <= read.RetryAfter {
		a.Retry = false // RoundTrip pauses
	}
	if a.Retry && a.RetryAfter == read.RetryAfter {
		// A retry time the accounting headers alone name (the hook left
		// it): each exhausted dimension for its own hold, when the
		// bucket can; else the whole bucket for the longest.
		if ex := t.exhaustedOnly(k, resp, sent, now); len(ex) > 0 {
			if t.pauseDimensions(ctx, k, ex) {
				a.Retry = false
			} else {
				a.RetryAfter = 0
				for _, e := range ex {
					a.RetryAfter = max(a.RetryAfter, e.RetryAfter)
				}
			}
		}
	}
	if !a.Refused && !a.Retry && a.Limit == 0 {
		return
	}
	if err := k.Report(ctx, a); err != nil {
		t.log.Warn("httpclient: reporting the provider's answer failed", "key", k.Key(), "err", err)
	}
}

// advertisedLimit is the tightest limit the headers advertise, and its
// window (0: unknown).
func advertisedLimit(h http.Header) (int64, time.Duration) {
	var best int64
	var window time.Duration
	// consider keeps the smaller rate; a limit without a window is
	// compared as if its window were one second.
	consider := func(q int64, w time.Duration) {
		if q < 1 {
			return
		}
		if best == 0 || float64(q)/seconds(w) < float64(best)/seconds(window) {
			best, window = q, w
		}
	}
	if q, _, ok := parseDecimal(h.Get("X-RateLimit-Limit"), false); ok {
		consider(q, 0)
	}
	consider(accountingLimit(h), accountingWindow)
	for _, name := range []string{"RateLimit-Limit", "RateLimit-Policy"} {
		v := h.Values(name)
		if len(v) == 0 {
			continue
		}
		for _, item := range splitOutsideQuotes(strings.Join(v, ","), ',') {
			params := splitOutsideQuotes(item, ';')
			var q int64
			var w time.Duration
			if n, _, ok := parseDecimal(params[0], false); ok {
				q = n // draft ≤ 06: `100;w=60`
			}
			for _, p := range params[1:] {
				k, val, _ := strings.Cut(strings.TrimSpace(p), "=")
				switch k {
				case "q":
					if n, _, ok := parseDecimal(val, false); ok {
						q = n
					}
				case "w":
					if d, ok := parseSeconds(val, false); ok && d > 0 {
						w = d
					}
				}
			}
			consider(q, w)
		}
	}
	return best, window
}

// seconds is w in seconds, a window of 0 (unknown) counting as one.
func seconds(w time.Duration) float64 {
	if w <= 0 {
		return 1
	}
	return w.Seconds()
}
