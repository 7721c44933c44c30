package otelmetrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/headway-go/headway/internal/oteltest"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/otelmetrics"
)

// A refusal reported to the Limiter records the new adaptive rate.
func TestObserverRecordsAdaptiveRate(t *testing.T) {
	r := oteltest.NewReader(t, otelmetrics.ScopeName)
	o, err := otelmetrics.New(r.MP)
	require.NoError(t, err)
	clock := clockwork.NewFakeClock()
	b, err := throttle.NewLocal(50, time.Second, throttle.WithClock(clock))
	require.NoError(t, err)
	lim := throttle.New(b, throttle.WithClock(clock), throttle.WithObserver(o))
	require.NoError(t, lim.Report(context.Background(), throttle.Answer{Refused: true}))

	g, ok := r.Collect(t)["headway.limiter.adaptive.rate"].(metricdata.Gauge[float64])
	require.True(t, ok, "the adaptive rate is a float64 gauge")
	require.Len(t, g.DataPoints, 1)
	assert.InDelta(t, 45, g.DataPoints[0].Value, 1e-9)
}

// userObserver is an Observer a user might write: it embeds the package's
// and counts the acquisitions itself.
type userObserver struct {
	*otelmetrics.Observer
	acquired int
}

func (u *userObserver) Acquired(key string, n int64, waited time.Duration, err error) {
	u.acquired++
	u.Observer.Acquired(key, n, waited, err)
}

// A user's Observer that embeds this package's still records the
// adaptive rate.
func TestEmbeddingObserverRecordsAdaptiveRate(t *testing.T) {
	r := oteltest.NewReader(t, otelmetrics.ScopeName)
	o, err := otelmetrics.New(r.MP)
	require.NoError(t, err)
	clock := clockwork.NewFakeClock()
	b, err := throttle.NewLocal(50, time.Second, throttle.WithClock(clock))
	require.NoError(t, err)
	lim := throttle.New(b, throttle.WithClock(clock), throttle.WithObserver(&userObserver{Observer: o}))
	require.NoError(t, lim.Report(context.Background(), throttle.Answer{Refused: true}))

	g, ok := r.Collect(t)["headway.limiter.adaptive.rate"].(metricdata.Gauge[float64])
	require.True(t, ok, "the adaptive rate is a float64 gauge")
	require.Len(t, g.DataPoints, 1)
	assert.InDelta(t, 45, g.DataPoints[0].Value, 1e-9)
}
