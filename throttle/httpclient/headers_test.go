package httpclient_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/headway-go/headway/throttle/httpclient"
)

// headerNow is the "now" of the header tests: 2026-03-01 12:00:00 UTC,
// Unix time 1772366400.
var headerNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func TestRetryAfter(t *testing.T) {
	const epoch = "1772366400" // headerNow as a Unix time
	tests := []struct {
		name   string
		header map[string]string
		want   time.Duration
		ok     bool
		status int // 0: 429
	}{
		{"nothing", nil, 0, false, 0},
		{"Retry-After seconds", map[string]string{"Retry-After": "2"}, 2 * time.Second, true, 0},
		{"Retry-After zero", map[string]string{"Retry-After": "0"}, 0, true, 0},
		{"Retry-After spaces", map[string]string{"Retry-After": "  7 "}, 7 * time.Second, true, 0},
		{"Retry-After IMF date", map[string]string{"Retry-After": "Sun, 01 Mar 2026 12:00:30 GMT"}, 30 * time.Second, true, 0},
		{"Retry-After RFC 850 date", map[string]string{"Retry-After": "Sunday, 01-Mar-26 12:01:00 GMT"}, time.Minute, true, 0},
		{"Retry-After asctime date", map[string]string{"Retry-After": "Sun Mar  1 12:00:05 2026"}, 5 * time.Second, true, 0},
		{"Retry-After date in the past", map[string]string{"Retry-After": "Sun, 01 Mar 2026 11:00:00 GMT"}, 0, true, 0},
		{"Retry-After negative is not a number", map[string]string{"Retry-After": "-3"}, 0, false, 0},
		{"Retry-After fraction refused", map[string]string{"Retry-After": "1.5"}, 0, false, 0},
		{"Retry-After garbage falls through", map[string]string{"Retry-After": "soon", "X-RateLimit-Reset": "4"}, 4 * time.Second, true, 0},
		{"Retry-After huge is capped", map[string]string{"Retry-After": "99999999999999999999999"}, (1 << 33) * time.Second, true, 0},
		{"Retry-After wins over the others", map[string]string{"Retry-After": "3", "RateLimit-Reset": "9", "X-RateLimit-Reset": "9"}, 3 * time.Second, true, 0},
		{"RateLimit-Reset", map[string]string{"RateLimit-Reset": "12"}, 12 * time.Second, true, 0},
		{"RateLimit-Reset wins over X-", map[string]string{"RateLimit-Reset": "12", "X-RateLimit-Reset": "1"}, 12 * time.Second, true, 0},
		{"RateLimit exhausted item", map[string]string{"RateLimit": `"default";r=0;t=30`}, 30 * time.Second, true, 0},
		{"RateLimit largest exhausted item", map[string]string{"RateLimit": `"a";r=0;t=3, "b";r=5;t=60, "c";r=0;t=9`}, 9 * time.Second, true, 0},
		{"RateLimit nothing exhausted", map[string]string{"RateLimit": `"a";r=5;t=3`}, 0, false, 0},
		{"RateLimit quoted separators", map[string]string{"RateLimit": `"a,b;c\"";r=0;t=4`}, 4 * time.Second, true, 0},
		{"RateLimit malformed t", map[string]string{"RateLimit": `"a";r=0;t=x`}, 0, false, 0},
		{"X-RateLimit-Reset seconds", map[string]string{"X-RateLimit-Reset": "45"}, 45 * time.Second, true, 0},
		{"X-RateLimit-Reset fraction", map[string]string{"X-RateLimit-Reset": "1.25"}, 1250 * time.Millisecond, true, 0},
		{"X-RateLimit-Reset epoch", map[string]string{"X-RateLimit-Reset": "1772366460"}, time.Minute, true, 0},
		{"X-RateLimit-Reset epoch with fraction", map[string]string{"X-RateLimit-Reset": epoch + ".5"}, 500 * time.Millisecond, true, 0},
		{"X-RateLimit-Reset epoch in the past", map[string]string{"X-RateLimit-Reset": "1700000000"}, 0, true, 0},
		{"X-RateLimit-Reset just below the epoch rule", map[string]string{"X-RateLimit-Reset": "999999999"}, 999999999 * time.Second, true, 0},
		{"X-RateLimit-Reset hex refused", map[string]string{"X-RateLimit-Reset": "0x10"}, 0, false, 0},
		{"X-RateLimit-Reset exponent refused", map[string]string{"X-RateLimit-Reset": "1e3"}, 0, false, 0},
		{"X-RateLimit-Reset empty fraction refused", map[string]string{"X-RateLimit-Reset": "3."}, 0, false, 0},

		// Regressions: Unix times in RateLimit-Reset (GitLab) and in
		// milliseconds; resets that apply only when nothing remains or the
		// status is 429; the dictionary form of draft -07.
		{"RateLimit-Reset Unix time", map[string]string{"RateLimit-Reset": "1772366460"}, time.Minute, true, 0},
		{"X-RateLimit-Reset Unix time in ms", map[string]string{"X-RateLimit-Reset": "1772366460000"}, time.Minute, true, 0},
		{"RateLimit-Reset Unix time in ms", map[string]string{"RateLimit-Reset": "1772366430000"}, 30 * time.Second, true, 0},
		{"503 reset with calls remaining", map[string]string{"X-RateLimit-Reset": "1772369400", "X-RateLimit-Remaining": "4999"}, 0, false, 503},
		{"503 reset without a remaining count", map[string]string{"RateLimit-Reset": "30"}, 0, false, 503},
		{"503 reset with nothing remaining", map[string]string{"X-RateLimit-Reset": "45", "X-RateLimit-Remaining": "0"}, 45 * time.Second, true, 503},
		{"403 reset with nothing remaining", map[string]string{"RateLimit-Reset": "20", "RateLimit-Remaining": "0"}, 20 * time.Second, true, 403},
		{"403 Retry-After", map[string]string{"Retry-After": "60", "X-RateLimit-Remaining": "12"}, time.Minute, true, 403},
		{"429 reset with calls remaining", map[string]string{"X-RateLimit-Reset": "8", "X-RateLimit-Remaining": "3"}, 8 * time.Second, true, 0},
		{"RateLimit draft -07 dictionary", map[string]string{"RateLimit": "limit=100, remaining=0, reset=30"}, 30 * time.Second, true, 503},
		{"RateLimit draft -07 dictionary, calls remaining", map[string]string{"RateLimit": "limit=100, remaining=5, reset=30"}, 0, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.header {
				h.Set(k, v)
			}
			status := tt.status
			if status == 0 {
				status = http.StatusTooManyRequests
			}
			got, ok := httpclient.RetryAfter(&http.Response{StatusCode: status, Header: h}, headerNow)
			if got != tt.want || ok != tt.ok {
				t.Errorf("RetryAfter(%d %v) = %v, %v; want %v, %v", status, tt.header, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// FuzzRetryAfter checks that no header value makes RetryAfter panic, or
// return a negative or overflowing wait; and that with a Date header, the
// instance's clock moves the answer by less than Date's one second, however
// far off it is.
func FuzzRetryAfter(f *testing.F) {
	dates := []string{"", "Sun, 01 Mar 2026 12:00:00 GMT", "Sun, 01 Mar 2026 11:59:55 GMT", "Sunday, 01-Mar-26 12:00:05 GMT", "Sun Mar  1 12:00:05 2026",
		"Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 01 Jan 0001 00:00:00 GMT", "Thu, 01 Jan 1970 00:00:00 GMT", "yesterday", " Sun, 01 Mar 2026 12:00:00 GMT "}
	for i, s := range []string{
		"", "0", "2", "1.5", "-1", "+1", "1e9", "0x1f", "NaN", "Inf", " 7 ",
		"Sun, 01 Mar 2026 12:00:30 GMT", "Sunday, 01-Mar-26 12:01:00 GMT", "Sun Mar  1 12:00:05 2026", "Fri, 31 Dec 9999 23:59:59 GMT",
		"1772366460", "1772366460.123456789123", "1772366460000", "limit=1, remaining=0, reset=1772366460000", "99999999999999999999999999", "9223372036854775807",
		`"default";r=0;t=30`, `"a";r=0;t=3, "b";r=0;t=9`, `"\"`, `;;;,,,`, `"a";r=0;t=`, `r=0;t=1`,
		"2026-03-01T12:00:12Z", "1m30.5s",
	} {
		f.Add(s, dates[i%len(dates)], int64(0))
		f.Add(s, dates[(i+1)%len(dates)], int64(-5*time.Second))
	}
	f.Fuzz(func(t *testing.T, v, date string, skew int64) {
		if _, ok := httpclient.RetryAfter(nil, headerNow); ok {
			t.Fatal("RetryAfter(nil) says something")
		}
		for _, name := range []string{"Retry-After-Ms", "Retry-After", "RateLimit-Reset", "RateLimit", "X-RateLimit-Reset",
			"Anthropic-Ratelimit-Tokens-Reset", "X-Ratelimit-Reset-Requests"} {
			h := http.Header{}
			h.Set(name, v)
			h.Set("Anthropic-Ratelimit-Tokens-Remaining", "0")
			h.Set("X-Ratelimit-Remaining-Requests", "0")
			if date != "" {
				h.Set("Date", date)
			}
			resp := &http.Response{StatusCode: http.StatusServiceUnavailable, Header: h}
			now := headerNow.Add(time.Duration(skew))
			d, ok := httpclient.RetryAfter(resp, now)
			if d < 0 {
				t.Fatalf("RetryAfter(%s: %q) = %v, negative", name, v, d)
			}
			if !ok && d != 0 {
				t.Fatalf("RetryAfter(%s: %q) = %v, false; want 0 when not ok", name, v, d)
			}
			if d > (1<<33)*time.Second+time.Second {
				t.Fatalf("RetryAfter(%s: %q) = %v, beyond the 2^33 s cap", name, v, d)
			}
			if _, err := http.ParseTime(strings.TrimSpace(date)); err != nil {
				continue
			}
			// The provider's clock, from Date, decides: an instance a
			// year behind or ahead reads (nearly) what one in step does.
			for _, other := range []time.Duration{-365 * 24 * time.Hour, -time.Second, 999 * time.Millisecond, 365 * 24 * time.Hour} {
				d2, ok2 := httpclient.RetryAfter(resp, now.Add(other))
				if ok2 != ok || d2-d >= time.Second || d-d2 >= time.Second {
					t.Fatalf("RetryAfter(%s: %q, Date %q) = %v, %v at %v; %v, %v at %v: the local clock moved it by a second or more",
						name, v, date, d, ok, now, d2, ok2, now.Add(other))
				}
			}
		}
	})
}
