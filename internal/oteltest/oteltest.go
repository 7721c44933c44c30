// Package oteltest reads back what headway's OpenTelemetry instruments
// recorded, for the tests of the metrics packages (throttle/otelmetrics,
// consumer/otelconsumer): a MeterProvider with a manual reader, and the
// data points of each kind of instrument keyed by their attributes.
package oteltest

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Reader is a MeterProvider (MP) whose measurements of one instrumentation
// scope can be collected on demand.
type Reader struct {
	MP    *sdkmetric.MeterProvider
	r     *sdkmetric.ManualReader
	scope string
}

// NewReader returns a Reader of the instruments of scope (a package's
// ScopeName); the provider is shut down when t ends.
func NewReader(t testing.TB, scope string) *Reader {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &Reader{MP: mp, r: r, scope: scope}
}

// Collect returns the metrics of the Reader's scope, by name, and fails t
// if the scope's meter carries no version.
func (r *Reader) Collect(t testing.TB) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.r.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != r.scope {
			continue
		}
		require.NotEmpty(t, sm.Scope.Version, "the meter of %s carries no version", sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// Sums returns an int64 sum's data points keyed by their attributes (see
// [Attrs]).
func Sums(t testing.TB, a metricdata.Aggregation) map[string]int64 {
	t.Helper()
	s, ok := a.(metricdata.Sum[int64])
	require.True(t, ok, "%T is not an int64 sum", a)
	return points(s.DataPoints)
}

// UpDowns is [Sums] for an int64 up-down counter: a sum that is not
// monotonic, so that a backend adds the figures of several instances.
func UpDowns(t testing.TB, a metricdata.Aggregation) map[string]int64 {
	t.Helper()
	s, ok := a.(metricdata.Sum[int64])
	require.True(t, ok && !s.IsMonotonic, "%T is not an int64 up-down counter", a)
	return points(s.DataPoints)
}

// Gauges is [Sums] for an int64 gauge.
func Gauges(t testing.TB, a metricdata.Aggregation) map[string]int64 {
	t.Helper()
	g, ok := a.(metricdata.Gauge[int64])
	require.True(t, ok, "%T is not an int64 gauge", a)
	return points(g.DataPoints)
}

// Hist is a histogram data point's count and sum.
type Hist struct {
	Count uint64
	Sum   float64
}

// Hists returns a float64 histogram's data points keyed by their
// attributes.
func Hists(t testing.TB, a metricdata.Aggregation) map[string]Hist {
	t.Helper()
	h, ok := a.(metricdata.Histogram[float64])
	require.True(t, ok, "%T is not a float64 histogram", a)
	out := map[string]Hist{}
	for _, dp := range h.DataPoints {
		out[Attrs(dp.Attributes)] = Hist{dp.Count, dp.Sum}
	}
	return out
}

func points(dps []metricdata.DataPoint[int64]) map[string]int64 {
	out := map[string]int64{}
	for _, dp := range dps {
		out[Attrs(dp.Attributes)] = dp.Value
	}
	return out
}

// Attrs writes an attribute set as "k=v,k=v", in the set's order.
func Attrs(s attribute.Set) string {
	var b strings.Builder
	for i, kv := range s.ToSlice() {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(string(kv.Key) + "=" + kv.Value.Emit())
	}
	return b.String()
}
