package httpclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/internal/admit"
	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/internal/nilcheck"
	"github.com/headway-go/headway/internal/waitstop"
	"github.com/headway-go/headway/throttle"
)

// maxPause caps the pause a provider's answer can impose, through the
// Transport or ReadAnswer: a provider that asks for more is asked again
// after an hour (one request), rather than a typo in its header, or a
// clock years off, stopping the fleet for days. throttle.Report caps the
// same.
const maxPause = time.Hour

// Transport is an http.RoundTripper that takes a permit from a
// [throttle.Limiter] before each request, so that every client sharing the
// limiter's bucket stays under the provider's limit together, and that
// pauses the bucket for all of them when the provider says "too many"
// anyway. Build it with [NewTransport]; use it as an http.Client's
// Transport. It is safe for concurrent use.
//
// Waiting. Before sending, a request waits for a permit at most the
// client's maxWait ([WithMaxWait]; default [throttle.Forever]), or the
// request's own ([ContextWithMaxWait]), and never beyond its context's
// deadline (which includes http.Client.Timeout). When no permit can come
// in time, RoundTrip returns an error matching [throttle.ErrTimeout] at
// once, and nothing is sent. Several retries of one request share one
// maxWait. A permit the request's context holds for the same budget
// ([throttle.Keyed.ContextWithPermit]: a consumer's, for the attempt)
// serves its first send at once, unless a pause must be waited out
// first: then it is given up and a new one taken (see the package doc,
// "With a Kafka consumer"). With [WithCost], a request takes its
// estimated cost instead of a permit, and settles it with the usage.
//
// Reacting. When the provider answers with a status that signals a limit
// (by default 429, 503 and 403; see [WithLimitStatuses]) and a retry time
// (read by [RetryAfter]; capped at one hour), the Transport pauses the
// request's bucket key until then, through its Limiter as
// [throttle.Limiter.Report] does for a retry time: the Limiter's callers
// of the key wait for the pause's end, and so does every instance sharing
// the bucket when it pauses (the Redis buckets; a bucket of your own with
// a Pause method, see [throttle.Pauser]). Requests that hold a permit
// taken before the pause (a consumer's) give it up and wait too. A 403 or
// 503 without a retry time, or whose reset headers show calls remaining,
// is an answer like any other.
//
// Retrying. The request is sent again after the pause, at most n times
// ([WithRetries]; default 2), when the pause ends within the request's wait
// (with [WithCallTime], the call's time before the deadline, counted
// after the sends so far) and the request is safe to repeat by net/http's rule (its body can be
// had again, and its method is idempotent or it carries an
// Idempotency-Key or X-Idempotency-Key); [WithRetryAnyMethod] also resends POST, PATCH, PUT and
// DELETE. Otherwise the limit response itself is returned. The bodies of
// responses not returned are read (up to 64 KiB) and closed.
//
// Adapting. Every answer is also read by [ReadAnswer] (then by the hook
// of [WithAnswer], if any) and reported to the request's Limiter
// ([throttle.Limiter.Report]): a 429, with a retry time or without,
// lowers the fleet's adaptive rate and paces its grants (so that the
// bucket's next burst does not meet the refusal again), an advertised
// limit below the configured one lowers its ceiling, and a success with
// nothing remaining (requests or tokens) pauses the bucket until the
// reset. When only the accounting headers name the time (OpenAI's
// x-ratelimit-remaining-tokens: 0 with its reset; a 429 without
// Retry-After too), a Transport [WithCost] over a bucket that pauses
// dimensions apart (bucket.Budget) holds back each exhausted dimension
// until its own reset, for the fleet, and pauses nothing of its own: a
// cost needing none of them goes on. Otherwise the whole key is paused
// (without WithCost, a call takes a permit of one dimension, maybe from
// a lease, and spends the others unseen).
//
// Errors. RoundTrip's errors do not repeat the request's method and URL:
// http.Client wraps them in a *url.Error that names both.
type Transport struct {
	lim     *throttle.Limiter
	base    http.RoundTripper
	key     func(*http.Request) throttle.Keyed
	maxWait time.Duration
	retries int
	log     *slog.Logger
	limit   map[int]bool                           // statuses that signal a limit
	anyVerb bool                                   // WithRetryAnyMethod
	slots   throttle.Slots                         // WithConcurrency; nil: no cap
	answer  func(*http.Response, *throttle.Answer) // WithAnswer; nil: none
	cost    *costModel                             // WithCost; nil: a permit per request
	call    time.Duration                          // WithCallTime; 0: none
	learned *callTimes                             // WithCallTimeLearned; nil: not learned

	mu     sync.Mutex
	paused map[throttle.Keyed]time.Time // local pauses: until when, on the limiter's clock
	edges  map[edgeID]edge              // how the provider restores each key's dimensions (holds)
	// edgesKept is how many edges were left after the last sweep.
	edgesKept int
}

// Option configures [NewTransport].
type Option interface {
	apply(*transportConfig)
}

type transportConfig struct {
	base    http.RoundTripper                      // WithBase; default defaultBase()
	key     func(*http.Request) throttle.Keyed     // WithRequestKey; default nil
	maxWait time.Duration                          // WithMaxWait; default Forever
	retries int                                    // WithRetries; default 2
	log     *slog.Logger                           // WithLogger; default slog.Default()
	limit   []int                                  // WithLimitStatuses; default 429, 503, 403
	anyVerb bool                                   // WithRetryAnyMethod; default false
	slots   throttle.Slots                         // WithConcurrency; default nil
	answer  func(*http.Response, *throttle.Answer) // WithAnswer; default nil
	cost    *costModel                             // WithCost; default nil
	call    time.Duration                          // WithCallTime; default 0
	learn   bool                                   // WithCallTimeLearned; default false
}

type transportOption func(*transportConfig)

func (f transportOption) apply(c *transportConfig) { f(c) }

// WithBase sets the RoundTripper a [Transport] sends requests through.
// Default (and nil): a clone of http.DefaultTransport of the Transport's
// own that keeps up to 256 idle connections per host and 1024 in all
// (http.DefaultTransport keeps 2 per host and 100 in all), or
// http.DefaultTransport itself when the program replaced it with another
// kind of RoundTripper. A fleet's
// calls come in bursts (a token bucket grants a period's permits at
// once): every call beyond the idle connections opens a new one and
// closes it after, a dial (and TLS handshake) per call that costs a
// share of the limit. 256 covers twice the records a consumer of package
// consumer keeps in flight by default. Give a base of your own to change
// it, and for proxies, TLS or timeouts.
func WithBase(rt http.RoundTripper) Option {
	return transportOption(func(c *transportConfig) { c.base = rt })
}

// WithRequestKey makes a [Transport] choose, per request, the limiter and
// key it draws from: per host, endpoint or tenant, for example
//
//	httpclient.WithRequestKey(func(r *http.Request) throttle.Keyed {
//		return lim.Key(r.URL.Host)
//	})
//
// f is called once per RoundTrip, concurrently; it must not block. A zero
// Keyed from f means the Transport's own limiter, unkeyed. Default: the
// Transport's limiter, unkeyed, for every request.
func WithRequestKey(f func(*http.Request) throttle.Keyed) Option {
	return transportOption(func(c *transportConfig) { c.key = f })
}

// WithMaxWait sets how long a request through a [Transport] may wait for
// a permit (0: only a permit free now; [throttle.Forever]: until the
// request's context ends). A request's context can override it with
// [ContextWithMaxWait]. Default: Forever. Negative values are refused by
// NewTransport.
func WithMaxWait(d time.Duration) Option {
	return transportOption(func(c *transportConfig) { c.maxWait = d })
}

// WithRetries sets how many times a [Transport] sends a request again
// after the provider paused it (see [Transport]). Default: 2. 0 never
// retries: the 429 or 503 is returned, after pausing the bucket. Negative
// values are refused by NewTransport.
func WithRetries(n int) Option {
	return transportOption(func(c *transportConfig) { c.retries = n })
}

type maxWaitKey struct{}

// WithLimitStatuses sets the response statuses that may signal a limit:
// a response with one of them and a retry time (see [RetryAfter]) pauses
// the bucket, and may be retried. Default: 429, 503 and 403 (GitHub and
// Salesforce answer 403 when a limit is reached). A 403 or 503 counts only
// with Retry-After or a reset whose remaining count is 0; a 429 with any
// reset. Each code must be from 400 to 599; none at all turns the
// reaction off.
func WithLimitStatuses(codes ...int) Option {
	return transportOption(func(c *transportConfig) { c.limit = append([]int{}, codes...) })
}

// WithRetryAnyMethod makes a [Transport] resend, after a provider's pause,
// requests of any method whose body can be had again, not only those safe
// to repeat by net/http's rule (GET, HEAD, OPTIONS, TRACE, or an
// Idempotency-Key or X-Idempotency-Key header). Use it only for a provider that refuses a
// limited request before acting on it. Default: off.
func WithRetryAnyMethod() Option {
	return transportOption(func(c *transportConfig) { c.anyVerb = true })
}

// WithAnswer makes a [Transport] call f with each response and the answer
// [ReadAnswer] read from it, before reporting the answer to the request's
// Limiter, so that f can fill in or change what the provider said in a
// way the headers do not: a GraphQL cost extension in the body
// (Shopify's throttleStatus: Retry with the time the points take to
// come back when too few are left), a provider's own headers. Setting
// Retry with a RetryAfter pauses the bucket for the fleet (through
// [throttle.Limiter.Report]); Refused and Limit adapt the rate. The
// Transport's own decision to retry a limit response follows the
// headers, not f. A provider whose requests limit header counts per
// another window than ReadAnswer assumes (a minute, for
// x-ratelimit-limit-requests) is told apart here:
//
//	httpclient.WithAnswer(func(resp *http.Response, a *throttle.Answer) {
//		if resp.Header.Get("x-ratelimit-limit-requests") != "" {
//			a.Window = 24 * time.Hour // Groq counts requests per day
//		}
//	})
//
// f is called once per response, concurrently, from RoundTrip; it must
// not block. It may read resp.Body if it then closes it and puts back a
// body that gives the same bytes (io.NopCloser over them): the caller
// reads it next. If f panics, the response's body (the provider's, and
// any f put in its place) is closed, and the panic goes on to the
// caller of RoundTrip (http.Client.Do), as any RoundTripper's does.
// Default: none.
func WithAnswer(f func(resp *http.Response, a *throttle.Answer)) Option {
	return transportOption(func(c *transportConfig) { c.answer = f })
}

// WithLogger sets the logger for what a [Transport] cannot do in the
// store (a pause, a report or a cost's settling that failed: logged at
// Warn) and for what it learns of a provider (Info). Default: slog.Default(). A nil logger keeps the default.
func WithLogger(l *slog.Logger) Option {
	return transportOption(func(c *transportConfig) {
		if l != nil {
			c.log = l
		}
	})
}

// WithConcurrency caps the requests in flight: each request holds a slot
// of s for its key (the key its permit is taken for, [throttle.Keyed.Key])
// from before its permit until its response body is closed, or until it
// fails. The slot comes first: a request never holds a permit while it
// waits for a slot, and goes out right after its permit, so the rate's
// pacing holds. The slot's wait and the permit's share the request's wait
// ([WithMaxWait]); a permit that does not come gives the slot back. A
// retry after the provider's pause gives its slot back and holds a new one.
// Default (and nil): no cap. A nil pointer (a constructor's error not
// checked) is refused. Close every response's body, as net/http asks:
// until then its slot stays held.
func WithConcurrency(s throttle.Slots) Option {
	return transportOption(func(c *transportConfig) { c.slots = s })
}

// WithCallTime tells a [Transport] how long a call takes at the provider
// (the most that matters: its p90, say), so that a permit leaves room for
// the call:
//
//   - A request whose context has a deadline waits for its slot
//     ([WithConcurrency]) and its permit (or cost, [WithCost]) at most
//     until d before that deadline: when less than d is left, it takes
//     neither and fails at once, nothing sent, with an error matching
//     [throttle.ErrTimeout] and context.DeadlineExceeded. A handler of
//     package consumer then gets a permit timeout, and is called again,
//     instead of sending a call its deadline would cut while the provider
//     runs it on. A request granted its slot and permit within that
//     wait, but run again with less than d left, by more than
//     min(d/4, 10 ms) (a busy machine), is not sent either: its slot
//     is given back and its cost settled at nothing; a permit stays
//     spent. This holds at every send of the request, the
//     Transport's own retries included, counting the time the sends
//     before took: a retry whose pause would end with less than d left is
//     not sent (the limit response is returned, see [Transport]), and a
//     retry's wait for its slot and permit ends d before the deadline.
//   - A call abandoned after it was sent (its context ended before the
//     send returned, or before its body was closed) keeps its slot until
//     d after it was sent, when the provider can be assumed done with it,
//     so that the next call does not meet a provider still busy with it.
//     Its permit or cost stays charged, as for any call that may have
//     reached the provider.
//
// Default: 0, neither. Negative values are refused by NewTransport.
func WithCallTime(d time.Duration) Option {
	return transportOption(func(c *transportConfig) { c.call, c.learn = d, false })
}

// WithCallTimeLearned is [WithCallTime] with the call's time learned
// from the Transport's recent calls: the 90th percentile of the last 100
// calls' times, from the send until the answer's body was closed (a call
// its caller abandoned, or whose send failed, is not counted), and never
// less than floor. A call counts for 5 minutes (on the Limiter's clock):
// a slow spell that leaves the callers no room sends no call that could
// lower it, and is forgotten then. While fewer than 10 calls count,
// floor is the call's time (0: none). A call that gets slower raises it within a few calls;
// one that gets faster lowers it within about 10. Default: off. A
// negative floor is refused by NewTransport. The last of WithCallTime
// and WithCallTimeLearned given applies.
func WithCallTimeLearned(floor time.Duration) Option {
	return transportOption(func(c *transportConfig) { c.call, c.learn = floor, true })
}

// ContextWithMaxWait returns a copy of ctx that makes a [Transport] wait
// at most d for a permit for requests made with it, instead of the
// client's maxWait ([WithMaxWait]). 0 takes only a permit free now;
// [throttle.Forever] waits until ctx ends. A negative d makes those
// requests fail with an error matching [throttle.ErrInvalid]. A nil ctx
// stands for context.Background().
func ContextWithMaxWait(ctx context.Context, d time.Duration) context.Context {
	if ctx == nil {
		ctx = context.Background()
	}
	return context.WithValue(ctx, maxWaitKey{}, d)
}

// NewTransport returns a [Transport] drawing permits from lim, or from
// the limiter [WithRequestKey] chooses per request. Options:
// [WithBase], [WithRequestKey], [WithMaxWait], [WithRetries],
// [WithLimitStatuses], [WithRetryAnyMethod], [WithConcurrency],
// [WithAnswer], [WithCost], [WithCallTime], [WithCallTimeLearned], [WithLogger]. The Transport sleeps on the
// clock of the request's Limiter ([throttle.WithClock]).
//
// Build one Transport and share it: without [WithBase], each has a pool
// of connections of its own, kept idle for up to 90 s after use
// ([Transport.CloseIdleConnections] closes them).
//
// It refuses, with an error matching [throttle.ErrInvalid]: a nil lim
// without WithRequestKey, a negative maxWait, a negative number of
// retries, a nil estimate for WithCost, a negative call time.
func NewTransport(lim *throttle.Limiter, opts ...Option) (*Transport, error) {
	c := transportConfig{maxWait: throttle.Forever, retries: 2, log: slog.Default(),
		limit: []int{http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusForbidden}}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if lim == nil && c.key == nil {
		return nil, errs.Invalid("httpclient: NewTransport", "lim", nil, "must be a Limiter unless WithRequestKey chooses one per request")
	}
	if c.maxWait < 0 {
		return nil, errs.Invalid("httpclient: NewTransport", "WithMaxWait", c.maxWait, "must be 0, positive or throttle.Forever")
	}
	if c.retries < 0 {
		return nil, errs.Invalid("httpclient: NewTransport", "WithRetries", c.retries, "must be 0 or more")
	}
	limit := make(map[int]bool, len(c.limit))
	for _, code := range c.limit {
		if code < 400 || code > 599 {
			return nil, errs.Invalid("httpclient: NewTransport", "WithLimitStatuses", code, "must be an error status, from 400 to 599")
		}
		limit[code] = true
	}
	if c.call < 0 {
		return nil, errs.Invalid("httpclient: NewTransport", "WithCallTime", c.call, "must be 0 or positive")
	}
	if c.slots != nil && nilcheck.IsNil(c.slots) {
		return nil, errs.Invalid("httpclient: NewTransport", "WithConcurrency", fmt.Sprintf("(%T)(nil)", c.slots), "must be a cap (was its constructor's error checked?), or nil for none")
	}
	if c.cost != nil && c.cost.estimate == nil {
		return nil, errs.Invalid("httpclient: NewTransport", "WithCost estimate", nil, "must be a function")
	}
	if c.base == nil {
		c.base = defaultBase()
	}
	var learned *callTimes
	if c.learn {
		learned = &callTimes{}
	}
	return &Transport{
		lim:     lim,
		base:    c.base,
		key:     c.key,
		maxWait: c.maxWait,
		retries: c.retries,
		log:     c.log,
		limit:   limit,
		anyVerb: c.anyVerb,
		slots:   c.slots,
		answer:  c.answer,
		cost:    c.cost,
		call:    c.call,
		learned: learned,
		paused:  make(map[throttle.Keyed]time.Time),
		edges:   make(map[edgeID]edge),
	}, nil
}

// RoundTrip implements http.RoundTripper: it waits for a permit, sends
// req through the base RoundTripper, and reacts to a limit as the
// [Transport] doc says. When no permit comes within the wait it returns
// an error matching [throttle.ErrTimeout] (and context.DeadlineExceeded
// when the deadline was the bound) without sending anything; when the
// context ends it returns the context's error. A nil req, or a Transport
// not built by [NewTransport], gives an error matching
// [throttle.ErrInvalid].
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req == nil {
		return nil, fmt.Errorf("httpclient: %w", errs.Invalid("Transport", "request", nil, "must be a request"))
	}
	r := req
	fail := func(err error) (*http.Response, error) {
		if r.Body != nil {
			r.Body.Close() // a RoundTripper closes the body, even on errors
		}
		return nil, fmt.Errorf("httpclient: %w", err)
	}
	if t == nil {
		return fail(errs.Invalid("Transport", "Transport", nil, "must be built by NewTransport"))
	}
	ctx := req.Context()
	k, maxWait, est, err := t.resolve(req)
	if err != nil {
		return fail(err)
	}
	clock := k.Limiter().Clock()
	var waited time.Duration
	for attempt := 0; ; attempt++ {
		left, call, byCall, err := t.attemptWait(ctx, clock.Now(), maxWait, waited)
		if err != nil {
			return fail(err)
		}
		start := clock.Now()
		h, grant, err := t.admit(ctx, clock, k, left, est)
		// The slot is freed however this attempt ends, a panic included
		// (a WithAnswer hook's, the base RoundTripper's), unless it is
		// handed to the response's body.
		defer h.free()
		waited += clock.Since(start)
		if err != nil {
			if byCall && errors.Is(err, throttle.ErrTimeout) {
				err = fmt.Errorf("%w (the wait ends the call's time, %v, before the context's deadline: WithCallTime)", err, call)
			}
			return fail(err)
		}
		if ranLate(ctx, call) {
			// Not sent (see WithCallTime). A permit stays spent: it may
			// be the failure policy's, which the bucket never counted.
			if grant != nil {
				settleCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
				_ = grant.Settle(settleCtx, zeroOf(est)) // best effort
				cancel()
			}
			return fail(noRoom(ctx, call))
		}
		sent := clock.Now()
		resp, err := t.base.RoundTrip(r)
		if err == nil && resp == nil { // a broken base: nothing to read
			err = fmt.Errorf("httpclient: the base RoundTripper (%T) returned no response and no error", t.base)
		}
		if err != nil {
			if release := t.abandoned(ctx, clock, sent, h.hand()); release != nil {
				release()
			}
			return resp, err // a cost taken stays: the request may have reached the provider
		}
		pause, hinted := t.react(ctx, k, resp, sent, clock.Now())
		answer := func() (*http.Response, error) {
			resp = releaseOnClose(resp, t.abandoned(ctx, clock, sent, h.hand()))
			if t.learned != nil {
				resp = releaseOnClose(resp, func() { t.learned.add(ctx, sent, clock.Now()) })
			}
			if grant != nil {
				resp = t.settleOnClose(ctx, k, resp, grant)
			}
			return resp, nil
		}
		if !hinted || attempt >= t.retries || !t.replayable(req) || !fits(ctx, pause, maxWait, waited, t.callTime(clock.Now())) {
			return answer()
		}
		next, err := rewind(req)
		if err != nil {
			return answer() // the body cannot be had again: give the answer
		}
		discard(resp)
		if grant != nil {
			t.settle(ctx, k, grant, t.cost.actual(Usage{})) // a refusal generated nothing
		}
		h.free()
		r = next
	}
}

// resolve returns what req's attempts share: its key (WithRequestKey, or
// the Transport's Limiter), its wait (WithMaxWait, or ContextWithMaxWait),
// and with WithCost its estimated cost, taken before each send instead
// of a permit.
func (t *Transport) resolve(req *http.Request) (k throttle.Keyed, maxWait time.Duration, est throttle.Cost, err error) {
	if t.key != nil {
		k = t.key(req)
	}
	if k.Limiter() == nil && t.lim != nil {
		k = t.lim.Key("")
	}
	if k.Limiter() == nil {
		return k, 0, nil, errs.Invalid("Transport", "WithRequestKey", "zero Keyed", "must return a Keyed from Limiter.Key when NewTransport has no Limiter")
	}
	maxWait = t.maxWait
	if d, ok := req.Context().Value(maxWaitKey{}).(time.Duration); ok {
		maxWait = d
	}
	if maxWait < 0 {
		return k, 0, nil, errs.Invalid("Transport", "ContextWithMaxWait", maxWait, "must be 0, positive or throttle.Forever")
	}
	if t.cost != nil {
		if est, err = t.cost.estimate(req); err != nil {
			return k, 0, nil, fmt.Errorf("estimating the call's cost: %w", err)
		}
		if est == nil {
			est = throttle.Cost{} // refused by AcquireCost: it asks for nothing
		}
	}
	return k, maxWait, est, nil
}

// attemptWait is how long an attempt may wait for its slot and permit:
// what is left of maxWait after waited, shortened to leave the call its
// time before the context's deadline (WithCallTime), at every send: a
// retry's too, after what the sends before it took. byCall reports that
// the call's time set it; call is that time.
func (t *Transport) attemptWait(ctx context.Context, now time.Time, maxWait, waited time.Duration) (left, call time.Duration, byCall bool, err error) {
	left = throttle.Forever
	if maxWait != throttle.Forever {
		left = max(maxWait-waited, 0)
	}
	call = t.callTime(now)
	if room, ok := roomFor(ctx, call); ok && call > 0 {
		if room <= 0 {
			return 0, call, false, noRoom(ctx, call)
		}
		if room < left {
			left, byCall = room, true
		}
	}
	return left, call, byCall, nil
}

// admit holds k's slot (WithConcurrency), then takes a permit, or the
// cost est when it is not nil (WithCost), with the rest of left
// (admit.SlotThenPermit). Without the permit, however admit ends (a panic
// included), the slot is freed.
func (t *Transport) admit(ctx context.Context, clock clockwork.Clock, k throttle.Keyed, left time.Duration, est throttle.Cost) (h *heldSlot, grant *throttle.CostGrant, err error) {
	release, err := admit.SlotThenPermit(left, clock.Now,
		func(d time.Duration) (func(), error) { return t.hold(ctx, k, d) },
		func(d time.Duration) (err error) {
			grant, err = t.acquire(ctx, k, d, est)
			return err
		})
	if err != nil {
		return &heldSlot{}, nil, err
	}
	return &heldSlot{release: release}, grant, nil
}

// react pauses k when resp signals a limit with a retry time, and reports
// resp's answer; it returns the pause, and whether resp named one.
//
// A panic on the way (a WithAnswer hook's, a Pauser's) closes resp's
// body, the provider's and any the hook put in its place, so that the
// connection is not held for the life of the process, and goes on
// unrecovered (see WithAnswer): a hook's panic is a bug to see, not a
// failed call to retry.
func (t *Transport) react(ctx context.Context, k throttle.Keyed, resp *http.Response, sent, now time.Time) (pause time.Duration, hinted bool) {
	body := resp.Body
	done := false
	defer func() {
		if done {
			return
		}
		if body != nil {
			_ = body.Close()
		}
		if resp.Body != nil && resp.Body != body {
			_ = resp.Body.Close()
		}
	}()
	if t.limit[resp.StatusCode] {
		pause, hinted = RetryAfter(resp, now)
		pause = min(pause, maxPause)
		// First, so that the fleet stops at once; the adaptive rate's
		// store calls come after. A retry time from the accounting
		// headers alone holds back only the dimensions they name, each
		// until its own reset, when the bucket can (a Budget).
		if ex := t.exhaustedOnly(k, resp, sent, now); len(ex) == 0 || !t.pauseDimensions(ctx, k, ex) {
			t.pause(ctx, k, pause)
		}
	}
	t.report(ctx, k, resp, sent, now) // the adaptive rate (answer.go)
	done = true
	return pause, hinted
}

// Idle connections the default base keeps (see [WithBase]).
const (
	idlePerHost = 256
	idleInAll   = 1024
)

// defaultBase is WithBase's default: a clone of http.DefaultTransport,
// with its proxy, dial, TLS and HTTP/2 settings, and more idle
// connections.
func defaultBase() http.RoundTripper {
	tr, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return http.DefaultTransport
	}
	tr = tr.Clone()
	tr.MaxIdleConnsPerHost = idlePerHost
	tr.MaxIdleConns = idleInAll
	return tr
}

// CloseIdleConnections closes the idle connections of the base
// RoundTripper, if it has any (http.Client.CloseIdleConnections calls it).
func (t *Transport) CloseIdleConnections() {
	if t == nil {
		return
	}
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// hold takes a slot of k's key within left when the Transport caps
// concurrency, and returns the function that gives it back (nil without
// a cap: then the response's body is left as it is).
func (t *Transport) hold(ctx context.Context, k throttle.Keyed, left time.Duration) (func(), error) {
	if t.slots == nil {
		return nil, nil
	}
	wctx, cancel := waitstop.Context(ctx)
	defer cancel()
	release, err := t.slots.Hold(wctx, k.Key(), left)
	if cause := context.Cause(wctx); err != nil && wctx.Err() != nil && cause != wctx.Err() && !namesStop(err, cause) {
		return nil, fmt.Errorf("concurrency slot: %w (%w)", err, cause)
	}
	if err != nil {
		return nil, fmt.Errorf("concurrency slot: %w", err)
	}
	return release, nil
}

// namesStop reports whether err, a slot wait's error, names already the
// stop that cause (waitstop's "permit waits stopped: <the stop's cause>")
// reports: headway's Slots wrap the stop's cause themselves, a user's own
// may not.
func namesStop(err, cause error) bool {
	if inner := errors.Unwrap(cause); inner != nil {
		cause = inner
	}
	return errors.Is(err, cause)
}

// abandoned returns release made to keep the slot, when ctx has ended by
// the time it is called, until the call's time (WithCallTime) after sent:
// the provider may still run a call its caller abandoned. Without a call
// time, or a slot (nil), it returns release as it is.
func (t *Transport) abandoned(ctx context.Context, clock clockwork.Clock, sent time.Time, release func()) func() {
	if release == nil || t.call <= 0 && t.learned == nil {
		return release
	}
	return func() {
		if ctx.Err() != nil {
			if wait := sent.Add(t.callTime(clock.Now())).Sub(clock.Now()); wait > 0 {
				clock.AfterFunc(wait, release)
				return
			}
		}
		release()
	}
}

// callTime is the room a call needs at now, on the Limiter's clock
// (WithCallTime, WithCallTimeLearned).
func (t *Transport) callTime(now time.Time) time.Duration {
	if t.learned == nil {
		return t.call
	}
	return max(t.call, t.learned.p90(now))
}

// Calls counted for WithCallTimeLearned, the fewest before they say
// anything, and how long one counts (see WithCallTimeLearned for why).
const (
	learnedCalls    = 100
	learnedAtLeast  = 10
	learnedQuantile = 0.9
	learnedAge      = 5 * time.Minute
)

// callTimes keeps the times of the last learnedCalls calls.
type callTimes struct {
	mu   sync.Mutex
	ring [learnedCalls]callTime
	n    int // calls counted, in all
}

// callTime is one call counted: how long it took, and when it ended.
type callTime struct {
	d   time.Duration
	end time.Time
}

// add counts a call sent at sent and done at end, unless ctx ended: its
// caller abandoned it, and its time is not known.
func (c *callTimes) add(ctx context.Context, sent, end time.Time) {
	d := end.Sub(sent)
	if ctx.Err() != nil || d < 0 {
		return
	}
	c.mu.Lock()
	c.ring[c.n%learnedCalls] = callTime{d, end}
	c.n++
	c.mu.Unlock()
}

// p90 is the 90th percentile of the calls counted that ended within
// learnedAge before now, 0 when fewer than learnedAtLeast did.
func (c *callTimes) p90(now time.Time) time.Duration {
	c.mu.Lock()
	ds := make([]time.Duration, 0, min(c.n, learnedCalls))
	for _, ct := range c.ring[:min(c.n, learnedCalls)] {
		if now.Sub(ct.end) < learnedAge {
			ds = append(ds, ct.d)
		}
	}
	c.mu.Unlock()
	if len(ds) < learnedAtLeast {
		return 0
	}
	slices.Sort(ds)
	return ds[int(math.Ceil(learnedQuantile*float64(len(ds))))-1]
}

// heldSlot is a request's slot until it is freed or handed on.
type heldSlot struct{ release func() }

// free gives the slot back, once; nothing after hand.
func (h *heldSlot) free() {
	if r := h.release; r != nil {
		h.release = nil
		r()
	}
}

// hand returns the release for another owner (the response's body), and
// frees nothing itself from then on.
func (h *heldSlot) hand() func() {
	r := h.release
	h.release = nil
	return r
}

// releaseOnClose makes closing resp's body call release; a response with
// no body releases at once. A nil release leaves resp as it is.
func releaseOnClose(resp *http.Response, release func()) *http.Response {
	if release == nil {
		return resp
	}
	switch b := resp.Body.(type) {
	case nil:
		release()
	case io.ReadWriteCloser: // a 101 Switching Protocols body must stay writable
		resp.Body = releasingRW{&releasingBody{ReadCloser: b, release: release}, b}
	default:
		resp.Body = &releasingBody{ReadCloser: b, release: release}
	}
	return resp
}

// releasingBody calls release when closed.
type releasingBody struct {
	io.ReadCloser
	release func()
}

func (b *releasingBody) Close() error {
	err := b.ReadCloser.Close()
	b.release()
	return err
}

// releasingRW is releasingBody for a writable body.
type releasingRW struct {
	*releasingBody
	io.Writer
}

// acquire waits out any local pause of k, then takes a permit within left,
// or the cost est when it is not nil (WithCost), whose grant it returns.
func (t *Transport) acquire(ctx context.Context, k throttle.Keyed, left time.Duration, est throttle.Cost) (*throttle.CostGrant, error) {
	clock := k.Limiter().Clock()
	start := clock.Now()
	for {
		remaining := left
		if left != throttle.Forever {
			remaining = max(left-clock.Since(start), 0)
		}
		if wait := t.pauseLeft(k); wait > 0 {
			// A permit the caller holds (the consumer's, for this
			// attempt) was taken before the provider's pause: spent
			// after it, it would come on top of what the bucket grants
			// then. Wait, then take a new one.
			k.Forfeit(ctx)
			dl, hasDeadline := ctx.Deadline()
			ctxBound := hasDeadline && time.Until(dl) < wait
			if ctxBound || wait > remaining {
				return nil, pausedErr(left, wait, ctxBound)
			}
			if err := sleep(ctx, clock, wait); err != nil {
				return nil, err
			}
			continue
		}
		var grant *throttle.CostGrant
		if est != nil {
			g, err := k.AcquireCost(ctx, est, remaining)
			if err != nil {
				return nil, err
			}
			grant = g
		} else if err := k.Acquire(ctx, remaining); err != nil {
			return nil, err
		}
		// A pause that began as we were granted holds too (the Limiter
		// honours one that began earlier itself): wait again. A cost is
		// settled at nothing; a permit stays spent, as it may be the
		// failure policy's, which the bucket never counted.
		if t.pauseLeft(k) > 0 {
			if grant != nil {
				_ = grant.Settle(context.WithoutCancel(ctx), zeroOf(est)) // best effort
			}
			continue
		}
		return grant, nil
	}
}

// pauseLeft is how long k stays paused locally.
func (t *Transport) pauseLeft(k throttle.Keyed) time.Duration {
	t.mu.Lock()
	until, ok := t.paused[k]
	t.mu.Unlock()
	if !ok {
		return 0
	}
	return until.Sub(k.Limiter().Clock().Now())
}

// sleep waits d on clock, or until ctx ends or its waits are stopped
// (throttle.ContextWithWaitStop).
func sleep(ctx context.Context, clock clockwork.Clock, d time.Duration) error {
	ctx, cancel := waitstop.Context(ctx)
	defer cancel()
	tm := clock.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.Chan():
		return nil
	case <-ctx.Done():
		if cause := context.Cause(ctx); cause != ctx.Err() {
			return fmt.Errorf("waiting out the provider's pause: %w (%w)", ctx.Err(), cause)
		}
		return fmt.Errorf("waiting out the provider's pause: %w", ctx.Err())
	}
}

// pausedErr is the error of a request whose wait ends before a pause the
// provider asked for: it matches throttle.ErrTimeout, and
// context.DeadlineExceeded when ctx's deadline was the bound.
func pausedErr(maxWait, pause time.Duration, ctxBound bool) error {
	if ctxBound {
		return fmt.Errorf("%w: the provider paused the limit for %v, beyond the context's deadline (%w)", throttle.ErrTimeout, pause, context.DeadlineExceeded)
	}
	return fmt.Errorf("%w: the provider paused the limit for %v, beyond maxWait %v", throttle.ErrTimeout, pause, maxWait)
}

// pause stops k for d: in this Transport, and through k's Limiter, as
// [throttle.Limiter.Report] does with a retry time: the Limiter's callers
// of the key, and the bucket, for the whole fleet, when it is a Pauser.
func (t *Transport) pause(ctx context.Context, k throttle.Keyed, d time.Duration) {
	if d <= 0 {
		return
	}
	now := k.Limiter().Clock().Now()
	until := now.Add(d)
	t.mu.Lock()
	if until.After(t.paused[k]) {
		t.paused[k] = until
	}
	for key, u := range t.paused { // few keys: one per paused limit
		if !u.After(now) {
			delete(t.paused, key)
		}
	}
	t.mu.Unlock()
	// (Report does not let ctx's cancellation skip the pause, and bounds
	// the bucket's call.)
	if err := k.Report(ctx, throttle.Answer{Retry: true, RetryAfter: d}); err != nil {
		t.log.Warn("httpclient: pausing the bucket failed; paused this process only", "key", k.Key(), "pause", d, "err", err)
	}
}

// exhaustedOnly is the dimensions resp's accounting headers name as
// exhausted, when no other header names a retry time (nil otherwise),
// each with how long this Transport holds it back for k (see holds); the
// request was sent at sent.
func (t *Transport) exhaustedOnly(k throttle.Keyed, resp *http.Response, sent, now time.Time) []throttle.Exhausted {
	pnow := providerNow(resp.Header, now)
	if _, other := retryHeaders(resp, pnow); other {
		return nil
	}
	return t.holds(k, accountingExhausted(resp.Header, pnow, success(resp.StatusCode)), resp.StatusCode, sent, now)
}

// success reports whether status is a success (2xx).
func success(status int) bool { return status >= 200 && status < 300 }

// alignedFor is how long a Transport remembers that a provider restores
// a dimension only at its window's end; then a success with nothing
// remaining is held for a unit's share again (one refusal, if the
// windows are still aligned, teaches it again).
const alignedFor = 10 * time.Minute

// edge is what a Transport learned of how a provider restores one
// dimension of one key.
type edge struct {
	// holdEnd and restored: the last success that used the dimension's
	// last unit was held until holdEnd (a unit's share of its reset);
	// the provider said the dimension would be full again at restored.
	holdEnd, restored time.Time
	// alignedUntil: until then the provider is known to restore the
	// dimension only at its window's end (see holds).
	alignedUntil time.Time
}

// edgeID names a dimension of a key.
type edgeID struct {
	k   throttle.Keyed
	dim string
}

// holds is how long each exhausted dimension of an answer for k, of
// status, to a request sent at sent, is held back: its hold
// (exhaustion.hold: a unit's share of the reset, after a success), or
// its whole reset while the provider is known to restore the dimension
// only at its window's end (aligned windows). That is learned, per key
// and dimension, from a refusal (429) of a request sent after a
// success's hold ended and before the dimension was to be full again,
// and remembered for alignedFor.
func (t *Transport) holds(k throttle.Keyed, ex []exhaustion, status int, sent, now time.Time) []throttle.Exhausted {
	if len(ex) == 0 {
		return nil
	}
	out := make([]throttle.Exhausted, 0, len(ex))
	var learned []string
	t.mu.Lock()
	for _, e := range ex {
		id := edgeID{k, e.dim}
		ed, known := t.edges[id]
		hold := e.hold
		switch {
		case now.Before(ed.alignedUntil):
			hold = e.reset
		case success(status) && e.hold < e.reset:
			ed.holdEnd, ed.restored = now.Add(e.hold), now.Add(e.reset)
			t.keepEdge(id, ed, now)
		case status == http.StatusTooManyRequests && known && !sent.Before(ed.holdEnd) && sent.Before(ed.restored):
			ed.alignedUntil = now.Add(alignedFor)
			t.keepEdge(id, ed, now)
			learned = append(learned, e.dim)
		}
		out = append(out, throttle.Exhausted{Dimension: e.dim, RetryAfter: hold})
	}
	t.mu.Unlock()
	for _, dim := range learned {
		t.log.Info("httpclient: the provider restores this dimension only at its window's end; a success with nothing remaining holds it until its reset", "key", k.Key(), "dimension", dim, "for", alignedFor)
	}
	return out
}

// keepEdge stores ed for id, and forgets, now and then, the edges that
// say nothing any more (restored and no longer aligned), so that a
// Transport of many keys keeps only the recent ones. t.mu is held.
func (t *Transport) keepEdge(id edgeID, ed edge, now time.Time) {
	t.edges[id] = ed
	if len(t.edges) <= 2*t.edgesKept+16 {
		return
	}
	for id, ed := range t.edges {
		if !ed.restored.After(now) && !ed.alignedUntil.After(now) {
			delete(t.edges, id)
		}
	}
	t.edgesKept = len(t.edges)
}

// pauseDimensions pauses the dimensions ex of k's bucket, for the whole
// fleet, when the bucket pauses dimensions apart and the Transport takes
// its calls' costs (WithCost); it reports whether it did (a failure is
// logged, and the caller pauses the whole key). Without WithCost a call
// takes a permit of the bucket's Take dimension alone, maybe from the
// Limiter's lease, which neither a pause of the other dimensions (spent
// at the provider all the same) nor one in the bucket would hold: the
// whole key is paused then, the lease with it (Limiter.Report).
func (t *Transport) pauseDimensions(ctx context.Context, k throttle.Keyed, ex []throttle.Exhausted) bool {
	if t.cost == nil {
		return false
	}
	dp, ok := throttle.BucketAs[throttle.DimensionPauser](k.Limiter().Bucket())
	if !ok {
		return false
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if err := dp.PauseDimensions(pctx, k.Key(), ex); err != nil {
		t.log.Warn("httpclient: pausing the budget's exhausted dimensions failed; pausing the whole key instead", "key", k.Key(), "err", err)
		return false
	}
	return true
}

// fits reports whether a retry after pause stays within the request's wait:
// maxWait (of which waited is used) and its context's deadline, less the
// call's time (WithCallTime; 0 for none), which the retry's send needs. A
// pause that ends at the deadline does not fit.
func fits(ctx context.Context, pause, maxWait, waited, call time.Duration) bool {
	if maxWait != throttle.Forever && pause > maxWait-waited {
		return false
	}
	if room, ok := roomFor(ctx, call); ok && pause >= room {
		return false
	}
	return ctx.Err() == nil
}

// roomFor is how long a send of a request with ctx may still wait, now,
// for its slot, permit or pause so as to leave a call of call (0: none)
// its time before ctx's deadline; 0 when none is left; ok is false when
// ctx has no deadline.
func roomFor(ctx context.Context, call time.Duration) (room time.Duration, ok bool) {
	dl, ok := ctx.Deadline()
	if !ok {
		return 0, false
	}
	left := time.Until(dl)
	if left <= call {
		return 0, true // also for a call time that left - call would overflow
	}
	return left - call, true
}

// ranLate reports that a request granted within its wait (which ends the
// call's time before ctx's deadline) has less than that time left now,
// by more than min(call/4, 10 ms): the room a Limiter keeps before a
// wait's end for a busy machine to run its caller again. A caller later
// than that was held up (a stalled process, a starved CPU).
func ranLate(ctx context.Context, call time.Duration) bool {
	if call <= 0 {
		return false
	}
	room, ok := roomFor(ctx, call-min(call/4, 10*time.Millisecond))
	return ok && room <= 0
}

// noRoom is the error of a send with less than the call's time left
// before its context's deadline: it matches throttle.ErrTimeout and
// context.DeadlineExceeded.
func noRoom(ctx context.Context, call time.Duration) error {
	dl, _ := ctx.Deadline()
	return fmt.Errorf("%w: %v left before the context's deadline, less than the call's time %v (%w)",
		throttle.ErrTimeout, max(time.Until(dl), 0).Round(time.Millisecond), call, context.DeadlineExceeded)
}

// replayable reports whether req may be sent again after the provider
// paused it: see the Transport doc. It follows net/http's rule for
// retrying a request on a fresh connection, unless WithRetryAnyMethod.
func (t *Transport) replayable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false // the body is gone
	}
	if t.anyVerb {
		return true
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, key := req.Header["Idempotency-Key"]
	_, xKey := req.Header["X-Idempotency-Key"]
	return key || xKey
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
