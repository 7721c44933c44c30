package otelmetrics

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/throttle"
)

// ObserveConsumer reports c's [consumer.Consumer.Stats] through mp's
// observable instruments (see the package documentation), read once per
// collection, with the attribute headway.consumer set to name plus those
// of [WithAttributes] ([WithKeyAttribute] does not apply). It may be
// called before, during or after c runs, and once per consumer: several
// consumers sharing mp need distinct names.
//
// unregister stops the reports; call it when c is done, or its last
// figures are reported for as long as mp collects. A nil mp reports
// nothing. ObserveConsumer fails when c is nil, name is empty, an option
// is invalid, or mp refuses an instrument or the callback.
func ObserveConsumer(mp metric.MeterProvider, name string, c *consumer.Consumer, opts ...Option) (unregister func() error, err error) {
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
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		g, err := m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	partitions := gauge("headway.consumer.partitions", "{partition}", "Partitions the consumer owns.")
	waiting := gauge("headway.consumer.waiting", "{partition}", "Partitions waiting for a permit.")
	buffered := gauge("headway.consumer.buffered", "{record}", "Records the consumer holds: queued, waiting for a permit, or being handled.")
	inFlight := gauge("headway.consumer.in_flight", "{call}", "Handler calls running.")
	handled := counter("headway.consumer.handled", "{record}", "Records whose handler returned nil.")
	retried := counter("headway.consumer.retried", "{call}", "Attempts after a record's first.")
	deadLettered := counter("headway.consumer.dead_lettered", "{record}", "Records written to the dead-letter topic.")
	timeouts := counter("headway.consumer.permit_timeouts", "{call}", "Waits for a permit that ended without one.")
	limiterErrors := counter("headway.consumer.limiter_errors", "{call}", "Failures of the limiter's store.")
	permitWait, err := m.Float64ObservableCounter("headway.consumer.permit.wait",
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
		o.ObserveInt64(inFlight, int64(s.InFlight), opt...)
		o.ObserveInt64(handled, s.Handled, opt...)
		o.ObserveInt64(retried, s.Retried, opt...)
		o.ObserveInt64(deadLettered, s.DeadLettered, opt...)
		o.ObserveInt64(timeouts, s.PermitTimeouts, opt...)
		o.ObserveInt64(limiterErrors, s.LimiterErrors, opt...)
		o.ObserveFloat64(permitWait, s.PermitWait.Seconds(), opt...)
		return nil
	}, partitions, waiting, buffered, inFlight, handled, retried, deadLettered, timeouts, limiterErrors, permitWait)
	if err != nil {
		return nil, instrumentErr(err)
	}
	return reg.Unregister, nil
}

func invalid(field, value, want string) error {
	return throttle.Invalid("otelmetrics", field, value, want)
}
