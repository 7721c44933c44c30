package throttle

import "time"

// Observer is told what a Limiter does, for metrics and tracing. Package
// github.com/headway-go/headway/throttle/otelmetrics implements it with
// OpenTelemetry; a nil Observer (the default) costs nothing.
//
// Calls come from the goroutine that called Acquire, on the hot path: an
// Observer must be safe for concurrent use, quick, and must never block
// or call back into the Limiter.
type Observer interface {
	// Acquired reports the outcome of one Acquire or AcquireN call: err
	// is nil when the permits were granted, and waited is the time from
	// the call to its return on the Limiter's clock. A call served by
	// permits its context held (Keyed.ContextWithPermit) is not
	// reported: those permits were, when they were granted.
	Acquired(key string, n int64, waited time.Duration, err error)
	// BucketCall reports one call to the bucket's Take: its decision (or
	// error) and how long it took on the Limiter's clock.
	BucketCall(key string, d Decision, took time.Duration, err error)
	// Degraded reports a decision made without the bucket because its
	// store failed, under the Limiter's failure policy: policy names the
	// policy ("open", "closed", "local"), granted what it decided, and
	// err the store's error.
	Degraded(key string, policy string, granted bool, err error)
}

// WithObserver sets the Observer a Limiter reports to. Default: none.
func WithObserver(o Observer) LimiterOption {
	return limiterOnly(func(c *config) { c.observer = o })
}
