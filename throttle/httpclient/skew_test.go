package httpclient_test

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

// An absolute reset is a time on the provider's clock: it is read against
// the response's Date, not against the instance's clock: a reset 2 s
// ahead is a 2 s pause to an instance 5 s behind the provider, not a 7 s
// pause for the whole fleet, and to one 5 s ahead, not none at all.
func TestAbsoluteResetsAreReadAgainstTheResponsesDate(t *testing.T) {
	server := headerNow // the provider's clock when it answered
	reset := server.Add(2 * time.Second)
	unix := strconv.FormatInt(reset.Unix(), 10)
	headers := map[string]map[string]string{
		"Retry-After HTTP date":      {"Retry-After": reset.Format(http.TimeFormat)},
		"RateLimit-Reset Unix time":  {"RateLimit-Reset": unix, "RateLimit-Remaining": "0"},
		"RateLimit dictionary":       {"RateLimit": "limit=10, remaining=0, reset=" + unix},
		"X-RateLimit-Reset Unix s":   {"X-RateLimit-Reset": unix, "X-RateLimit-Remaining": "0"},
		"X-RateLimit-Reset Unix ms":  {"X-RateLimit-Reset": unix + "000", "X-RateLimit-Remaining": "0"},
		"X-RateLimit-Reset fraction": {"X-RateLimit-Reset": unix + ".0", "X-RateLimit-Remaining": "0"},
		"Anthropic RFC 3339":         {"anthropic-ratelimit-tokens-remaining": "0", "anthropic-ratelimit-tokens-reset": reset.Format(time.RFC3339)},
	}
	for _, skew := range []time.Duration{-time.Hour, -5 * time.Second, -time.Millisecond, 0, 300 * time.Millisecond, 999 * time.Millisecond, time.Second, 5 * time.Second, time.Hour} {
		// An instance whose clock agrees with the Date, to its second,
		// reads on its own, finer clock; any other trusts the Date.
		want := 2 * time.Second
		if skew >= 0 && skew < time.Second {
			want -= skew
		}
		for name, h := range headers {
			t.Run(fmt.Sprintf("%s, instance %v off", name, skew), func(t *testing.T) {
				resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{}}
				resp.Header.Set("Date", server.Format(http.TimeFormat))
				for k, v := range h {
					resp.Header.Set(k, v)
				}
				now := server.Add(skew)
				if got, ok := httpclient.RetryAfter(resp, now); got != want || !ok {
					t.Errorf("RetryAfter = %v, %v; want %v, true", got, ok, want)
				}
				if name == "Retry-After HTTP date" {
					return // no limit on a 200
				}
				if got := httpclient.ReadAnswer(resp, now); got != (throttle.Answer{Retry: true, RetryAfter: want}) {
					t.Errorf("ReadAnswer = %+v; want a retry in %v", got, want)
				}
			})
		}
	}
}

// Without a Date (or with one that does not parse), absolute resets are
// read against the instance's clock, as before.
func TestAbsoluteResetsWithoutADateAreReadAgainstTheLocalClock(t *testing.T) {
	for _, date := range []string{"", "yesterday"} {
		resp := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{}}
		if date != "" {
			resp.Header.Set("Date", date)
		}
		resp.Header.Set("X-RateLimit-Reset", strconv.FormatInt(headerNow.Unix()+2, 10))
		if got, ok := httpclient.RetryAfter(resp, headerNow.Add(500*time.Millisecond)); got != 1500*time.Millisecond || !ok {
			t.Errorf("Date %q: RetryAfter = %v, %v; want 1.5s, true", date, got, ok)
		}
	}
}
