package throttle

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// maxPause caps the pause a provider's answer can impose: a provider that
// asks for more is asked again after an hour (one request), rather than a
// typo in its header stopping the fleet for days.
const maxPause = time.Hour

// Transport is an http.RoundTripper that takes a permit from a [Limiter]
// before each request, so that every client sharing the limiter's bucket
// stays under the provider's limit together, and that pauses the bucket
// for all of them when the provider says "too many" anyway. Build it with
// [NewTransport]; use it as an http.Client's Transport. It is safe for
// concurrent use.
//
// Waiting. Before sending, a request waits for a permit at most the
// client's maxWait ([WithClientMaxWait]; default [Forever]), or the
// request's own ([WithMaxWait] on its context), and never beyond its
// context's deadline (which includes http.Client.Timeout). When no permit
// can come in time, RoundTrip returns an error matching [ErrTimeout] at
// once, and nothing is sent. Several retries of one request share one
// maxWait.
//
// Reacting. When the provider answers 429 Too Many Requests or 503 Service
// Unavailable with a retry time (read by [RetryAfter]: Retry-After,
// RateLimit-Reset, RateLimit or X-RateLimit-Reset; capped at one hour),
// the Transport pauses the request's bucket key until then:
//
//   - If the bucket implements [Pauser] (the Redis buckets do), it calls
//     Pause, so that every instance sharing the bucket stops: requests
//     already waiting, and new ones, wait for the pause's end (or time out
//     at once when it is beyond their wait).
//   - Always, it also records the pause in the Transport itself, so that
//     this Transport's requests wait even when the bucket is not a Pauser
//     or Pause failed. For a bucket that is not a Pauser (a [Local]), that
//     local pause is the only one: other Transports and other processes
//     do not see it.
//
// The request is then sent again after the pause, at most n times
// ([WithRetries]; default 2), when the pause ends within the request's
// wait (maxWait and deadline) and the request is safe to repeat: its body
// can be sent again (none, or GetBody set, as http.NewRequest does for
// in-memory bodies) and it is idempotent (GET, HEAD, OPTIONS, TRACE, PUT,
// DELETE, or an Idempotency-Key or X-Idempotency-Key header) or has a
// replayable body (GetBody) — a 429 or 503 with a retry time means the
// provider turned the request away, not that it ran it. Otherwise the 429
// or 503 response itself is returned to the caller. The bodies of
// responses that are not returned are read (up to 64 KiB) and closed.
// A 429 or 503 without a retry time is returned as it is.
type Transport struct {
	lim     *Limiter
	base    http.RoundTripper
	key     func(*http.Request) Keyed
	maxWait time.Duration
	retries int
	log     *slog.Logger

	mu     sync.Mutex
	paused map[pauseKey]time.Time // local pauses: until when, on the limiter's clock
}

type pauseKey struct {
	l   *Limiter
	key string
}

// TransportOption is an [Option] for [NewTransport] only; other
// constructors ignore it.
type TransportOption interface {
	Option
	transport(*transportConfig)
}

type transportConfig struct {
	base    http.RoundTripper         // WithBase; default http.DefaultTransport
	key     func(*http.Request) Keyed // WithRequestKey; default nil
	maxWait time.Duration             // WithClientMaxWait; default Forever
	retries int                       // WithRetries; default 2
}

type transportOption func(*transportConfig)

func (transportOption) apply(*config)                  {}
func (f transportOption) transport(c *transportConfig) { f(c) }

// WithBase sets the RoundTripper a [Transport] sends requests through.
// Default (and nil): http.DefaultTransport.
func WithBase(rt http.RoundTripper) TransportOption {
	return transportOption(func(c *transportConfig) { c.base = rt })
}

// WithRequestKey makes a [Transport] choose, per request, the limiter and
// key it draws from: per host, endpoint or tenant, for example
//
//	throttle.WithRequestKey(func(r *http.Request) throttle.Keyed {
//		return lim.Key(r.URL.Host)
//	})
//
// f is called once per RoundTrip, concurrently; it must not block. A zero
// Keyed from f means the Transport's own limiter, unkeyed. Default: the
// Transport's limiter, unkeyed, for every request.
func WithRequestKey(f func(*http.Request) Keyed) TransportOption {
	return transportOption(func(c *transportConfig) { c.key = f })
}

// WithClientMaxWait sets how long a request through a [Transport] may
// wait for a permit (0: only a permit free now; [Forever]: until the
// request's context ends). A request's context can override it with
// [WithMaxWait]. Default: Forever. Negative values are refused by
// NewTransport.
func WithClientMaxWait(d time.Duration) TransportOption {
	return transportOption(func(c *transportConfig) { c.maxWait = d })
}

// WithRetries sets how many times a [Transport] sends a request again
// after the provider paused it (see [Transport]). Default: 2. 0 never
// retries: the 429 or 503 is returned, after pausing the bucket. Negative
// values are refused by NewTransport.
func WithRetries(n int) TransportOption {
	return transportOption(func(c *transportConfig) { c.retries = n })
}

type maxWaitKey struct{}

// WithMaxWait returns a copy of ctx that makes a [Transport] wait at most
// d for a permit for requests made with it, instead of the client's
// maxWait ([WithClientMaxWait]). 0 takes only a permit free now;
// [Forever] waits until ctx ends. A negative d makes those requests fail
// with an error matching [ErrInvalid].
func WithMaxWait(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, maxWaitKey{}, d)
}

// NewTransport returns a [Transport] drawing permits from lim, or from
// the limiter [WithRequestKey] chooses per request. Options:
// [WithBase], [WithRequestKey], [WithClientMaxWait], [WithRetries],
// [WithLogger] (for a failed Pause). The Transport sleeps on the clock of
// the request's Limiter ([WithClock] given to [New]).
//
// It refuses, with an error matching [ErrInvalid]: a nil lim without
// WithRequestKey, a negative maxWait, a negative number of retries.
func NewTransport(lim *Limiter, opts ...Option) (*Transport, error) {
	c := transportConfig{base: http.DefaultTransport, maxWait: Forever, retries: 2}
	for _, o := range opts {
		if to, ok := o.(TransportOption); ok {
			to.transport(&c)
		}
	}
	if lim == nil && c.key == nil {
		return nil, Invalid("throttle: NewTransport", "lim", nil, "must be a Limiter unless WithRequestKey chooses one per request")
	}
	if c.maxWait < 0 {
		return nil, Invalid("throttle: NewTransport", "WithClientMaxWait", c.maxWait, "must be 0, positive or throttle.Forever")
	}
	if c.retries < 0 {
		return nil, Invalid("throttle: NewTransport", "WithRetries", c.retries, "must be 0 or more")
	}
	if c.base == nil {
		c.base = http.DefaultTransport
	}
	return &Transport{
		lim:     lim,
		base:    c.base,
		key:     c.key,
		maxWait: c.maxWait,
		retries: c.retries,
		log:     newConfig(opts).logger,
		paused:  make(map[pauseKey]time.Time),
	}, nil
}

// RoundTrip implements http.RoundTripper: it waits for a permit, sends
// req through the base RoundTripper, and reacts to 429 and 503 as the
// [Transport] doc says. When no permit comes within the wait it returns
// an error matching [ErrTimeout] (and context.DeadlineExceeded when the
// deadline was the bound) without sending anything; when the context ends
// it returns the context's error.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req
	fail := func(err error) (*http.Response, error) {
		if r.Body != nil {
			r.Body.Close() // a RoundTripper closes the body, even on errors
		}
		return nil, fmt.Errorf("throttle: Transport: %s %s: %w", req.Method, req.URL.Redacted(), err)
	}
	ctx := req.Context()
	k := Keyed{}
	if t.key != nil {
		k = t.key(req)
	}
	if k.l == nil {
		k = Keyed{l: t.lim}
	}
	if k.l == nil {
		return fail(Invalid("throttle: Transport", "WithRequestKey", "zero Keyed", "must return a Keyed from Limiter.Key when NewTransport has no Limiter"))
	}
	maxWait := t.maxWait
	if d, ok := ctx.Value(maxWaitKey{}).(time.Duration); ok {
		maxWait = d
	}
	if maxWait < 0 {
		return fail(Invalid("throttle: Transport", "WithMaxWait", maxWait, "must be 0, positive or throttle.Forever"))
	}
	clock := k.l.cfg.clock

	var waited time.Duration
	for attempt := 0; ; attempt++ {
		left := Forever
		if maxWait != Forever {
			left = max(maxWait-waited, 0)
		}
		start := clock.Now()
		err := t.acquire(ctx, k, left)
		waited += clock.Since(start)
		if err != nil {
			return fail(err)
		}
		resp, err := t.base.RoundTrip(r)
		if err != nil || (resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable) {
			return resp, err
		}
		pause, ok := RetryAfter(resp.Header, clock.Now())
		if !ok {
			return resp, nil
		}
		pause = min(pause, maxPause)
		t.pause(ctx, k, pause)
		if attempt >= t.retries || !replayable(req) || !fits(ctx, pause, maxWait, waited) {
			return resp, nil
		}
		next, err := rewind(req)
		if err != nil {
			return resp, nil // the body cannot be had again: give the answer
		}
		discard(resp)
		r = next
	}
}

// CloseIdleConnections closes the idle connections of the base
// RoundTripper, if it has any (http.Client.CloseIdleConnections calls it).
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// acquire waits out any local pause of k, then takes a permit within left.
func (t *Transport) acquire(ctx context.Context, k Keyed, left time.Duration) error {
	clock := k.l.cfg.clock
	start := clock.Now()
	for {
		remaining := left
		if left != Forever {
			remaining = max(left-clock.Since(start), 0)
		}
		if wait := t.pauseLeft(k); wait > 0 {
			ctxBound := false
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
				ctxBound = true
			}
			if ctxBound || wait > remaining {
				return fmt.Errorf("provider paused the limit: %w", timeout(1, left, wait, ctxBound))
			}
			if err := k.l.sleep(ctx, wait); err != nil {
				return err
			}
			continue
		}
		if err := k.Acquire(ctx, remaining); err != nil {
			return err
		}
		// A pause that began while we waited for a reserved permit holds
		// too: give the permit back if we can, and wait again.
		if t.pauseLeft(k) > 0 {
			if r, ok := k.l.bucket.(Refunder); ok {
				_ = r.Refund(ctx, k.key, 1) // best effort
			}
			continue
		}
		return nil
	}
}

// pauseLeft is how long k stays paused locally.
func (t *Transport) pauseLeft(k Keyed) time.Duration {
	t.mu.Lock()
	until, ok := t.paused[pauseKey{k.l, k.key}]
	t.mu.Unlock()
	if !ok {
		return 0
	}
	return until.Sub(k.l.cfg.clock.Now())
}

// pause stops k for d: in the bucket when it is a Pauser, and locally.
func (t *Transport) pause(ctx context.Context, k Keyed, d time.Duration) {
	if d <= 0 {
		return
	}
	now := k.l.cfg.clock.Now()
	until := now.Add(d)
	pk := pauseKey{k.l, k.key}
	t.mu.Lock()
	if until.After(t.paused[pk]) {
		t.paused[pk] = until
	}
	for key, u := range t.paused { // few keys: one per paused limit
		if !u.After(now) {
			delete(t.paused, key)
		}
	}
	t.mu.Unlock()
	if p, ok := k.l.bucket.(Pauser); ok {
		// The pause matters beyond this request: do not let its
		// cancellation skip it, but do not hang on a sick store either.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if err := p.Pause(pctx, k.key, d); err != nil {
			t.log.Warn("throttle: Transport: pausing the bucket failed; paused this Transport only", "key", k.key, "pause", d, "err", err)
		}
	}
}

// fits reports whether a retry after pause stays within the request's wait:
// maxWait (of which waited is used) and its context's deadline.
func fits(ctx context.Context, pause, maxWait, waited time.Duration) bool {
	if maxWait != Forever && pause > maxWait-waited {
		return false
	}
	if dl, ok := ctx.Deadline(); ok && pause >= time.Until(dl) {
		return false
	}
	return ctx.Err() == nil
}

// replayable reports whether req may be sent again after a 429 or 503
// with a retry time: see the Transport doc.
func replayable(req *http.Request) bool {
	hasBody := req.Body != nil && req.Body != http.NoBody
	if hasBody && req.GetBody == nil {
		return false
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	if req.Header.Get("Idempotency-Key") != "" || req.Header.Get("X-Idempotency-Key") != "" {
		return true
	}
	return req.GetBody != nil
}

// rewind returns a copy of req with a fresh body, for a retry.
func rewind(req *http.Request) (*http.Request, error) {
	r := req.Clone(req.Context())
	if req.Body != nil && req.Body != http.NoBody {
		b, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		r.Body = b
	}
	return r, nil
}

// discard reads a little of a response's body, so that its connection can
// be reused, and closes it.
func discard(resp *http.Response) {
	if resp.Body == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
	_ = resp.Body.Close()
}
