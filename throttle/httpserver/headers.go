package httpserver

import (
	"net/http"
	"strconv"
	"time"

	"github.com/headway-go/headway/throttle"
)

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
func setLimitHeaders(h http.Header, d throttle.Decision) {
	if d.Limit <= 0 {
		return
	}
	h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
	if d.Remaining >= 0 {
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(min(d.Remaining, d.Limit), 10))
	}
	h.Set("X-RateLimit-Reset", strconv.FormatInt(ceilSeconds(d.Reset), 10))
}
