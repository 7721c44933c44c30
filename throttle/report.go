package throttle

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Answer is what a provider said about one call, for [Limiter.Report]:
// that it refused it, whether it named a time to come back, and the limit
// it advertises. The Transport of package throttle/httpclient reads it from HTTP responses (its ReadAnswer);
// other callers (a Kafka handler calling a gRPC API, say) fill it in
// themselves, or return it from a consumer handler in an [*AnswerError].
type Answer struct {
	// Refused reports that the provider turned the call away for its
	// rate limit (HTTP 429).
	Refused bool
	// Retry reports that the provider named a time before which calls
	// are useless (Retry-After on a refusal; a reset time when nothing
	// remains): RetryAfter from now. Such an answer pauses the bucket
	// for the whole fleet. A refusal with a retry time also counts as a
	// refusal for the adaptive rate, as one without: a provider that
	// keeps refusing the fleet's bursts with Retry-After (a sliding
	// window meeting a token bucket's period starts) teaches the fleet
	// to pace below it, rather than pause it at every period's edge. A
	// RetryAfter of 0 or less names no time to wait for: nothing is
	// paused.
	//
	// RetryAfter is a duration from when the answer came. A provider
	// that names a time instead (a reset at 12:00:30) names it on its
	// own clock: subtract the provider's time of the answer (HTTP's Date
	// header), not the instance's clock, or an instance a few seconds
	// behind pauses the whole fleet for those seconds too, and one
	// ahead not at all (httpclient.ReadAnswer does so).
	//
	// One answer pauses for at most an hour: a provider naming a later
	// time (a daily quota, a typo, a clock years off) is asked again
	// after the hour, one call, rather than stopping the fleet for days.
	Retry      bool
	RetryAfter time.Duration
	// Limit is the limit the provider advertises (X-RateLimit-Limit,
	// RateLimit-Policy, ...), 0 when it advertises none, per Window; a
	// Window of 0 means the bucket's own interval. A limit below the
	// configured one lowers the fleet's adaptive ceiling.
	Limit  int64
	Window time.Duration
}

// AnswerError is an error that carries the provider's answer. A handler
// of package consumer returns one (wrapped or not) when the provider
// refused its call, so that the fleet adapts as it does for calls through
// the Transport:
//
//	if resp.StatusCode == http.StatusTooManyRequests {
//		return &throttle.AnswerError{Answer: httpclient.ReadAnswer(resp, time.Now()), Err: errRefused}
//	}
type AnswerError struct {
	Answer Answer
	Err    error
}

// Error implements error.
func (e *AnswerError) Error() string {
	what := "answered"
	if e.Answer.Refused {
		what = "refused the call"
	}
	if e.Err == nil {
		return "throttle: the provider " + what
	}
	return fmt.Sprintf("throttle: the provider %s: %v", what, e.Err)
}

// Unwrap returns the error the answer came with.
func (e *AnswerError) Unwrap() error { return e.Err }

// Report tells l what the provider answered to a call made with one of
// its permits, so that the fleet sharing l's bucket adapts (docs/adaptive.md
// gives the law):
//
//   - an answer with a retry time (Answer.Retry) pauses the key until
//     then (at most an hour): l's callers of it wait for the pause's end
//     (at once ErrTimeout for a wait that ends first; one waiting for its
//     permit's time gives the permit back), whatever the bucket answers,
//     and so does the whole fleet when the bucket pauses (a [Pauser]; the
//     callers of a Cost are held by the bucket's pause only);
//   - a refusal, with a retry time or without, lowers the adaptive rate
//     (at most once per interval, however many callers report it) and
//     paces grants evenly;
//   - a limit advertised below the configured one lowers the ceiling
//     (with or without a retry time; before a refusal in the same answer
//     is applied, so that the refusal is measured against it).
//
// An answer that says nothing new (a success within the limit) costs
// nothing: no store call. Report needs the bucket's limit per interval:
// every bucket of package bucket and [Local] give it (a bucket of your own
// through a Fallback method, see [Bucket]); for another bucket only the
// pause applies. It returns the store's errors, if any, joined: the pause
// and the adaptation are each best effort, and one may have been made
// when the other failed.
//
// When Report returns nil, the fleet's adaptive state (in the bucket's
// shared store for the buckets of package bucket, else in l) holds the
// answer: a refusal's decrease is written, or the state already
// held a decrease made within the interval before it (another caller's
// report of the same refusals), which counts for it; an advertised limit
// is the ceiling. l paces by that state from its next call on: a reply of
// an earlier store call landing later never replaces it in l's view. (A
// store that loses its state afterwards, an empty restart, loses the
// answer with it.) An error means the change may not have been made: the
// store failed, or other instances changed the state under each swap
// Report tried.
func (l *Limiter) Report(ctx context.Context, a Answer) error { return l.report(ctx, "", a) }

// Report is [Limiter.Report] for k's key.
func (k Keyed) Report(ctx context.Context, a Answer) error {
	if k.l == nil {
		return fmt.Errorf("throttle: zero Keyed: %w: build it with Limiter.Key", ErrInvalid)
	}
	return k.l.report(ctx, k.key, a)
}

// maxAnswerPause caps the pause one answer can impose (see Answer.Retry),
// as the Transport and ReadAnswer of package throttle/httpclient do.
const maxAnswerPause = time.Hour

func (l *Limiter) report(ctx context.Context, key string, ans Answer) error {
	if l.bad != nil {
		return l.bad
	}
	hint := ans.Retry && ans.RetryAfter > 0
	if !ans.Refused && !hint && ans.Limit <= 0 {
		return nil // a success that says nothing new: free
	}
	// The adaptation matters beyond this call: do not let its
	// cancellation skip it.
	ctx = context.WithoutCancel(ctx)
	var errs []error
	if hint {
		// Honour the hint first: the pause is what the provider asked.
		errs = append(errs, l.pause(ctx, key, min(ans.RetryAfter, maxAnswerPause)))
	}
	if !l.adapt.ok {
		return errors.Join(errs...)
	}
	st := l.state(key)
	defer l.release(st)
	law := l.law(st)
	if ans.Limit > 0 {
		adv := float64(ans.Limit)
		if ans.Window > 0 {
			adv = adv * float64(law.interval) / float64(ans.Window)
		}
		errs = append(errs, l.update(ctx, st, func(s AdaptiveState, now time.Time) (AdaptiveState, bool) {
			return law.advertised(s, adv, now)
		}))
	}
	if ans.Refused {
		// With a hint or without, after the advertised limit (see Report).
		errs = append(errs, l.update(ctx, st, law.refused))
	}
	return errors.Join(errs...)
}

// pause stops key for d: in this instance at once (its callers wait at
// the key's gate, its lease hands out nothing), and in the bucket, for
// the whole fleet, when it pauses.
func (l *Limiter) pause(ctx context.Context, key string, d time.Duration) error {
	st := l.state(key)
	until := addSat(l.tb.now(), d)
	if l.leasing != nil {
		st.lease.pause(until)
	}
	st.notePause(until) // for callers waiting for their grant's time (waiter.usable)
	st.gate.hold(until)
	l.release(st)
	p := l.caps.pauser
	if p == nil {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return p.Pause(pctx, key, d)
}
