// Package otelconsumer reports the state of a headway consumer through the
// OpenTelemetry metrics API, read from [consumer.Consumer.Stats] at each
// collection.
//
//	unregister, err := otelconsumer.Observe(meterProvider, "mailer", c)
//	if err != nil { ... }
//	defer unregister()
//
// Limiter metrics (permits, waits, store calls) are in package
// github.com/headway-go/headway/throttle/otelmetrics, which does not
// depend on Kafka.
//
// # Instruments
//
// Every one carries headway.consumer set to the consumer's name, and the
// attributes of [WithAttributes]:
//
//	headway.consumer.owned_partitions       up-down counter  {partition}  partitions owned
//	headway.consumer.waiting_partitions     up-down counter  {partition}  partitions waiting for a permit
//	headway.consumer.buffered_records       up-down counter  {record}     records held: queued, waiting or in a handler
//	headway.consumer.buffered_bytes         up-down counter  By           what those records count for (WithQueueBytes)
//	headway.consumer.active_calls           up-down counter  {call}       handler calls running
//	headway.consumer.handled.records        counter          {record}     records handled
//	headway.consumer.retried.calls          counter          {call}       attempts after a record's first
//	headway.consumer.dead_lettered.records  counter          {record}     records sent to the dead-letter topic
//	headway.consumer.parked.records         counter          {record}     records parked in the shaping topic
//	headway.consumer.permit.timeouts        counter          {timeout}    permit waits that timed out
//	headway.consumer.limiter.errors         counter          {error}      limiter store failures
//	headway.consumer.permit.wait.time       counter          s            total time spent waiting for permits
//
// The first five are up-down counters, not gauges: the figures of several
// instances add up (the partitions of a consumer group, the records it
// holds), which is what a sum across instances should show. Names and
// units follow OpenTelemetry's semantic-convention rules; the meter's
// instrumentation scope is [ScopeName] with headway's module version.
package otelconsumer

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/buildinfo"
	"github.com/headway-go/headway/internal/errs"
)

// ScopeName is the instrumentation scope of every instrument of this
// package.
const ScopeName = "github.com/headway-go/headway/consumer/otelconsumer"

// ConsumerKey names the consumer of [Observe].
const ConsumerKey = attribute.Key("headway.consumer")

// Option configures [Observe].
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	attrs []attribute.KeyValue
}

// WithAttributes adds attributes to every measurement, such as the
// service's region. They must be valid and must not use [ConsumerKey].
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return optionFunc(func(c *config) { c.attrs = append(c.attrs, attrs...) })
}

func newConfig(opts []Option) (config, error) {
	var c config
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	for _, kv := range c.attrs {
		if kv.Key == ConsumerKey {
			return c, invalid("WithAttributes", string(kv.Key), "must not use the attribute key of package otelconsumer")
		}
		if !kv.Valid() {
			return c, invalid("WithAttributes", fmt.Sprintf("%q", kv.Key), "must be a valid attribute (non-empty key, set value)")
		}
	}
	return c, nil
}

func meter(mp metric.MeterProvider) metric.Meter {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	return mp.Meter(ScopeName, metric.WithInstrumentationVersion(buildinfo.Version()))
}

func instrumentErr(err error) error {
	return fmt.Errorf("otelconsumer: creating an instrument: %w", err)
}

// Observe reports c's [consumer.Consumer.Stats] through mp's observable
// instruments (see the package documentation), read once per collection,
// with the attribute headway.consumer set to name plus those of
// [WithAttributes]. It may be
// called before, during or after c runs, and once per consumer: several
// consumers sharing mp need distinct names.
//
// unregister stops the reports; call it when c is done, or its last
// figures are reported for as long as mp collects. A nil mp reports
// nothing. Observe fails when c is nil, name is empty, an option
// is invalid, or mp refuses an instrument or the callback.
func Observe(mp metric.MeterProvider, name string, c *consumer.Consumer, opts ...Option) (unregister func() error, err error) {
	if c == nil {
		return nil, invalid("Consumer", "nil", "must not be nil")
	}
	if name == "" {
		return nil, invalid("name", `""`, "must name the consumer")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	m := meter(mp)
	var errs []error
	upDown := func(name, unit, desc string) metric.Int64ObservableUpDownCounter {
		g, err := m.Int64ObservableUpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		g, err := m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	partitions := upDown("headway.consumer.owned_partitions", "{partition}", "Partitions the consumer owns.")
	waiting := upDown("headway.consumer.waiting_partitions", "{partition}", "Partitions waiting for a permit.")
	buffered := upDown("headway.consumer.buffered_records", "{record}", "Records the consumer holds: queued, waiting for a permit, or being handled.")
	bufferedBytes := upDown("headway.consumer.buffered_bytes", "By", "What the records the consumer holds count for: keys, values, headers and bookkeeping.")
	inFlight := upDown("headway.consumer.active_calls", "{call}", "Handler calls running.")
	handled := counter("headway.consumer.handled.records", "{record}", "Records whose handler returned nil.")
	retried := counter("headway.consumer.retried.calls", "{call}", "Attempts after a record's first.")
	deadLettered := counter("headway.consumer.dead_lettered.records", "{record}", "Records written to the dead-letter topic.")
	parked := counter("headway.consumer.parked.records", "{record}", "Records written to the shaping topic.")
	timeouts := counter("headway.consumer.permit.timeouts", "{timeout}", "Waits for a permit that ended without one.")
	limiterErrors := counter("headway.consumer.limiter.errors", "{error}", "Failures of the limiter's store.")
	permitWait, err := m.Float64ObservableCounter("headway.consumer.permit.wait.time",
		metric.WithUnit("s"), metric.WithDescription("Total time partitions have spent waiting for permits."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, instrumentErr(err)
	}

	attrs := append(append([]attribute.KeyValue(nil), cfg.attrs...), ConsumerKey.String(name))
	opt := []metric.ObserveOption{metric.WithAttributeSet(attribute.NewSet(attrs...))}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := c.Stats()
		o.ObserveInt64(partitions, int64(len(s.Partitions)), opt...)
		o.ObserveInt64(waiting, int64(s.Waiting), opt...)
		o.ObserveInt64(buffered, int64(s.Buffered), opt...)
		o.ObserveInt64(bufferedBytes, s.BufferedBytes, opt...)
		o.ObserveInt64(inFlight, int64(s.InFlight), opt...)
		o.ObserveInt64(handled, s.Handled, opt...)
		o.ObserveInt64(retried, s.Retried, opt...)
		o.ObserveInt64(deadLettered, s.DeadLettered, opt...)
		o.ObserveInt64(parked, s.Parked, opt...)
		o.ObserveInt64(timeouts, s.PermitTimeouts, opt...)
		o.ObserveInt64(limiterErrors, s.LimiterErrors, opt...)
		o.ObserveFloat64(permitWait, s.PermitWait.Seconds(), opt...)
		return nil
	}, partitions, waiting, buffered, bufferedBytes, inFlight, handled, retried, deadLettered, parked, timeouts, limiterErrors, permitWait)
	if err != nil {
		return nil, instrumentErr(err)
	}
	return reg.Unregister, nil
}

func invalid(field, value, want string) error {
	return errs.Invalid("otelconsumer", field, value, want)
}
