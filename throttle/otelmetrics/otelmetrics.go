// Package otelmetrics reports what headway does through the OpenTelemetry
// metrics API: permits granted and refused, time spent waiting, calls to
// the bucket's store (Redis) with their errors and latency, and decisions
// made under a failure policy. It depends on package throttle and the
// OpenTelemetry API only; the consumer's metrics are in package
// github.com/headway-go/headway/consumer/otelconsumer.
//
// It costs nothing unless asked: [New] with a nil MeterProvider records
// into a no-op provider, and a Limiter without [throttle.WithObserver]
// does not call an Observer at all. Only the API is imported; the user's
// program picks the SDK and the exporter (Prometheus, OTLP, ...):
//
//	obs, err := otelmetrics.New(meterProvider)
//	if err != nil { ... }
//	lim := throttle.New(b, throttle.WithObserver(obs))
//
// # Instruments
//
// From an [Observer], every one carrying the attributes of [WithAttributes]:
//
//	headway.limiter.acquire.calls       counter    {call}      headway.outcome: granted, timeout, canceled, error
//	headway.limiter.granted.permits     counter    {permit}    permits granted (n of AcquireN)
//	headway.limiter.wait.duration       histogram  s           headway.outcome, as above
//	headway.bucket.calls                counter    {call}      headway.result: granted, refused, error
//	headway.bucket.call.duration        histogram  s           headway.result, as above
//	headway.limiter.degraded.decisions  counter    {decision}  headway.policy, headway.granted
//	headway.limiter.adaptive.rate       gauge      {permit}    the fleet's adaptive rate per interval, 0 when not adapting (Observer.Adapted)
//
// Names and units follow OpenTelemetry's semantic-convention rules: a
// dotted namespace, counts of things named in the plural with a {thing}
// unit, durations in seconds. The meter's instrumentation scope is
// [ScopeName] with headway's module version.
//
// A bucket call's result "error" counts the store's failures (a Redis
// error or timeout) and misconfiguration alike; its duration is the
// store's latency as the caller sees it. An acquire's outcome "timeout"
// means no permit within maxWait or the context's deadline
// ([throttle.ErrTimeout]); "canceled" means the context ended first.
//
// # Cardinality
//
// By default no instrument carries the limiter key: a per-tenant key would
// make one time series per tenant. [WithKeyAttribute] adds it, through a
// function that can map keys to a few classes (an endpoint, a tier).
package otelmetrics

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/headway-go/headway/internal/buildinfo"
	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/throttle"
)

// ScopeName is the instrumentation scope of every instrument of this
// package.
const ScopeName = "github.com/headway-go/headway/throttle/otelmetrics"

// Attribute keys.
const (
	// OutcomeKey is the outcome of an acquire: granted, timeout, canceled
	// or error.
	OutcomeKey = attribute.Key("headway.outcome")
	// ResultKey is the result of a bucket call: granted, refused or error.
	ResultKey = attribute.Key("headway.result")
	// PolicyKey is the failure policy that made a degraded decision.
	PolicyKey = attribute.Key("headway.policy")
	// GrantedKey says whether a degraded decision granted.
	GrantedKey = attribute.Key("headway.granted")
	// KeyKey is the limiter key (a tenant, an endpoint), only with
	// [WithKeyAttribute].
	KeyKey = attribute.Key("headway.key")
)

// Outcomes of an acquire, in the order of the outcome index.
const (
	outGranted = iota
	outTimeout
	outCanceled
	outError
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"granted", "timeout", "canceled", "error"}

// Results of a bucket call.
const (
	resGranted = iota
	resRefused
	resError
	numResults
)

var resultNames = [numResults]string{"granted", "refused", "error"}

// knownPolicies are the failure policies whose attribute sets are built in
// advance; another name costs an allocation per report.
var knownPolicies = [...]string{"open", "closed", "local"}

// Histogram bucket boundaries, in seconds.
var (
	// waitBounds spans a free permit (0) to a long wait for a refill.
	waitBounds = []float64{0, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	// callBounds spans a local bucket (µs) to a slow or failing store.
	callBounds = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5}
)

// Option configures [New].
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	attrs   []attribute.KeyValue // WithAttributes; added to every measurement
	keyAttr func(string) string  // WithKeyAttribute; nil: no key attribute
}

// WithAttributes adds attributes to every measurement, for example the
// name of the limiter when several share a MeterProvider:
//
//	otelmetrics.WithAttributes(attribute.String("headway.limiter", "billing-api"))
//
// Default: none. The attribute keys of this package are taken by it and
// must not be given here.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return optionFunc(func(c *config) { c.attrs = append(c.attrs, attrs...) })
}

// WithKeyAttribute adds the attribute headway.key to the limiter's
// instruments, with the value fn(key) for a call under key (the key of
// [throttle.Limiter.Key]; "" for the limiter's own budget). A nil fn
// records the key as is. Default: no key attribute.
//
// Every distinct value is a time series of its own in every instrument:
// keep the values few. With per-tenant keys, have fn map a key to its
// class ("tenant-42/search" → "search"). With this option each report
// builds its attribute set, which allocates.
func WithKeyAttribute(fn func(key string) string) Option {
	return optionFunc(func(c *config) {
		if fn == nil {
			fn = func(k string) string { return k }
		}
		c.keyAttr = fn
	})
}

func newConfig(opts []Option) (config, error) {
	var c config
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	for _, kv := range c.attrs {
		switch kv.Key {
		case OutcomeKey, ResultKey, PolicyKey, GrantedKey, KeyKey:
			return c, errs.Invalid("otelmetrics", "WithAttributes", string(kv.Key), "must not use an attribute key of package otelmetrics")
		}
		if !kv.Valid() {
			return c, errs.Invalid("otelmetrics", "WithAttributes", fmt.Sprintf("%q", kv.Key), "must be a valid attribute (non-empty key, set value)")
		}
	}
	return c, nil
}

// meter returns the package's meter from mp, or a no-op one for a nil mp.
func meter(mp metric.MeterProvider) metric.Meter {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	return mp.Meter(ScopeName, metric.WithInstrumentationVersion(buildinfo.Version()))
}

// Observer implements [throttle.Observer] with OpenTelemetry instruments.
// Build one with [New] and give it to [throttle.WithObserver]; one
// Observer may serve several Limiters. It is safe for concurrent use.
//
// Without [WithKeyAttribute], its methods build nothing per call: the
// attribute sets are made by New, and a report costs what the
// MeterProvider's instruments cost (nothing with a nil provider).
type Observer struct {
	acquires  metric.Int64Counter
	permits   metric.Int64Counter
	wait      metric.Float64Histogram
	calls     metric.Int64Counter
	callTime  metric.Float64Histogram
	degraded  metric.Int64Counter
	adaptive  metric.Float64Gauge // adaptive.go
	base      []attribute.KeyValue
	keyAttr   func(string) string
	plain     measure // the base attributes only
	outcome   [numOutcomes]measure
	result    [numResults]measure
	policy    [len(knownPolicies)][2]measure // [policy][granted]
	noContext context.Context
}

// measure holds the options of one attribute set, built once.
type measure struct {
	add    []metric.AddOption
	record []metric.RecordOption
}

func newMeasure(attrs []attribute.KeyValue) measure {
	o := metric.WithAttributeSet(attribute.NewSet(attrs...))
	return measure{add: []metric.AddOption{o}, record: []metric.RecordOption{o}}
}

var _ throttle.Observer = (*Observer)(nil)

// New returns an Observer whose instruments come from mp (see the package
// documentation for their names). A nil mp records nothing: the Observer
// then costs a few nanoseconds per report. New fails only when mp refuses
// an instrument or an option is invalid.
func New(mp metric.MeterProvider, opts ...Option) (*Observer, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	m := meter(mp)
	o := &Observer{base: cfg.attrs, keyAttr: cfg.keyAttr, noContext: context.Background()}
	if o.acquires, err = m.Int64Counter("headway.limiter.acquire.calls",
		metric.WithUnit("{call}"),
		metric.WithDescription("Acquire and AcquireN calls, by outcome.")); err != nil {
		return nil, instrumentErr(err)
	}
	if o.permits, err = m.Int64Counter("headway.limiter.granted.permits",
		metric.WithUnit("{permit}"),
		metric.WithDescription("Permits granted by Acquire and AcquireN.")); err != nil {
		return nil, instrumentErr(err)
	}
	if o.wait, err = m.Float64Histogram("headway.limiter.wait.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Time from an Acquire call to its return, by outcome."),
		metric.WithExplicitBucketBoundaries(waitBounds...)); err != nil {
		return nil, instrumentErr(err)
	}
	if o.calls, err = m.Int64Counter("headway.bucket.calls",
		metric.WithUnit("{call}"),
		metric.WithDescription("Calls to the bucket's Take, by result; result=error counts store (Redis) errors.")); err != nil {
		return nil, instrumentErr(err)
	}
	if o.callTime, err = m.Float64Histogram("headway.bucket.call.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Latency of the bucket's Take, including its store's round trip, by result."),
		metric.WithExplicitBucketBoundaries(callBounds...)); err != nil {
		return nil, instrumentErr(err)
	}
	if o.degraded, err = m.Int64Counter("headway.limiter.degraded.decisions",
		metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions made without the bucket because its store failed, by failure policy and decision.")); err != nil {
		return nil, instrumentErr(err)
	}
	if o.adaptive, err = m.Float64Gauge("headway.limiter.adaptive.rate",
		metric.WithUnit("{permit}"),
		metric.WithDescription("The fleet's adaptive rate in permits per interval of the bucket, after each change this process made; 0 when not adapting (grants not paced).")); err != nil {
		return nil, instrumentErr(err)
	}
	o.plain = newMeasure(o.with())
	for i, name := range outcomeNames {
		o.outcome[i] = newMeasure(o.with(OutcomeKey.String(name)))
	}
	for i, name := range resultNames {
		o.result[i] = newMeasure(o.with(ResultKey.String(name)))
	}
	for i, name := range knownPolicies {
		for g := range 2 {
			o.policy[i][g] = newMeasure(o.with(PolicyKey.String(name), GrantedKey.Bool(g == 1)))
		}
	}
	return o, nil
}

func instrumentErr(err error) error {
	return fmt.Errorf("otelmetrics: creating an instrument: %w", err)
}

// with returns the base attributes followed by more, in a new slice.
func (o *Observer) with(more ...attribute.KeyValue) []attribute.KeyValue {
	out := make([]attribute.KeyValue, 0, len(o.base)+len(more)+1)
	out = append(out, o.base...)
	return append(out, more...)
}

// keyed returns m, or, with WithKeyAttribute, the options of m's
// attributes plus key's.
func (o *Observer) keyed(m measure, key string, more ...attribute.KeyValue) measure {
	if o.keyAttr == nil {
		return m
	}
	return newMeasure(append(o.with(more...), KeyKey.String(o.keyAttr(key))))
}

// Acquired implements [throttle.Observer].
func (o *Observer) Acquired(key string, n int64, waited time.Duration, err error) {
	i := outcomeOf(err)
	m := o.keyed(o.outcome[i], key, OutcomeKey.String(outcomeNames[i]))
	o.acquires.Add(o.noContext, 1, m.add...)
	if i == outGranted {
		o.permits.Add(o.noContext, n, o.keyed(o.plain, key).add...)
	}
	o.wait.Record(o.noContext, waited.Seconds(), m.record...)
}

// BucketCall implements [throttle.Observer].
func (o *Observer) BucketCall(key string, d throttle.Decision, took time.Duration, err error) {
	i := resGranted
	switch {
	case err != nil:
		i = resError
	case !d.Granted:
		i = resRefused
	}
	m := o.keyed(o.result[i], key, ResultKey.String(resultNames[i]))
	o.calls.Add(o.noContext, 1, m.add...)
	o.callTime.Record(o.noContext, took.Seconds(), m.record...)
}

// Degraded implements [throttle.Observer].
func (o *Observer) Degraded(key string, policy string, granted bool, _ error) {
	g := 0
	if granted {
		g = 1
	}
	for i, name := range knownPolicies {
		if name == policy {
			m := o.keyed(o.policy[i][g], key, PolicyKey.String(policy), GrantedKey.Bool(granted))
			o.degraded.Add(o.noContext, 1, m.add...)
			return
		}
	}
	attrs := o.with(PolicyKey.String(policy), GrantedKey.Bool(granted))
	if o.keyAttr != nil {
		attrs = append(attrs, KeyKey.String(o.keyAttr(key)))
	}
	o.degraded.Add(o.noContext, 1, newMeasure(attrs).add...)
}

// outcomeOf classifies an Acquire's error. ErrTimeout comes first: a
// timeout bounded by the context's deadline also matches
// context.DeadlineExceeded.
func outcomeOf(err error) int {
	switch {
	case err == nil:
		return outGranted
	case errors.Is(err, throttle.ErrTimeout):
		return outTimeout
	case errors.Is(err, context.Canceled):
		// The caller gave up, even if a store call was cut by it.
		return outCanceled
	case isBackend(err):
		// A store failure, even one cut by the Limiter's own store
		// deadline (which wraps context.DeadlineExceeded).
		return outError
	case errors.Is(err, context.DeadlineExceeded): // Canceled is taken above
		return outCanceled
	default:
		return outError
	}
}

// isBackend reports whether err is a store failure. Apart from outcomeOf
// so that only errors that get this far pay for errors.As.
func isBackend(err error) bool {
	var be *throttle.BackendError
	return errors.As(err, &be)
}
