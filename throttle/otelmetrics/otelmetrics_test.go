package otelmetrics_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.uber.org/goleak"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/oteltest"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/otelmetrics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// counting wraps a bucket and counts its answers independently of the
// Observer.
type counting struct {
	inner                   throttle.Bucket
	granted, refused, error atomic.Int64
}

func (c *counting) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	d, err := c.inner.Take(ctx, key, n, maxWait)
	switch {
	case err != nil:
		c.error.Add(1)
	case d.Granted:
		c.granted.Add(1)
	default:
		c.refused.Add(1)
	}
	return d, err
}

// Real Acquire calls on a fake clock: every outcome is counted, permits
// add up n, and the wait histogram holds the exact time waited.
func TestObserverCountsAcquires(t *testing.T) {
	r := oteltest.NewReader(t, otelmetrics.ScopeName)
	obs, err := otelmetrics.New(r.MP, otelmetrics.WithAttributes(attribute.String("headway.limiter", "test")))
	require.NoError(t, err)
	clock := clockwork.NewFakeClock()
	local, err := throttle.NewLocal(3, time.Second, throttle.WithClock(clock))
	require.NoError(t, err)
	cb := &counting{inner: local}
	lim := throttle.New(cb, throttle.WithClock(clock), throttle.WithObserver(obs))
	ctx := context.Background()

	// 3 granted at once (the burst); then 3 more, reserved by the Local
	// bucket (GCRA) one interval ahead: the Limiter sleeps exactly that
	// long on the fake clock; then 2 refused at once.
	require.NoError(t, lim.AcquireN(ctx, 2, 0))
	require.NoError(t, lim.Acquire(ctx, 0))
	done := make(chan error, 1)
	go func() { done <- lim.AcquireN(ctx, 3, 5*time.Second) }()
	waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, clock.BlockUntilContext(waitCtx, 1))
	// One interval, then nanosecond steps for the rounding of the
	// emission interval (1s/3 rounded up): the clock ends exactly at the
	// reservation.
	clock.Advance(time.Second)
	for i := 0; ; i++ {
		if i == 100 {
			t.Fatal("the waiter was not granted after the clock advanced")
		}
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(20 * time.Millisecond):
			clock.Advance(time.Nanosecond)
			continue
		}
		break
	}
	for range 2 {
		require.ErrorIs(t, lim.Acquire(ctx, 0), throttle.ErrTimeout)
	}
	// A cancelled context, and an invalid call (an error).
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	require.ErrorIs(t, lim.Acquire(cctx, time.Second), context.Canceled)
	require.ErrorIs(t, lim.Acquire(ctx, -1), throttle.ErrInvalid)

	got := r.Collect(t)
	const lt = "headway.limiter=test,"
	assert.Equal(t, map[string]int64{
		lt + "headway.outcome=granted":  3,
		lt + "headway.outcome=timeout":  2,
		lt + "headway.outcome=canceled": 1,
		lt + "headway.outcome=error":    1,
	}, oteltest.Sums(t, got["headway.limiter.acquire.calls"]))
	assert.Equal(t, map[string]int64{"headway.limiter=test": 2 + 1 + 3}, oteltest.Sums(t, got["headway.limiter.granted.permits"]))
	w := oteltest.Hists(t, got["headway.limiter.wait.duration"])
	assert.EqualValues(t, 3, w[lt+"headway.outcome=granted"].Count)
	assert.InDelta(t, 1.0, w[lt+"headway.outcome=granted"].Sum, 1e-6, "granted: 2 at once, 1 after one interval (1 s, rounded up to the ns per permit)")
	assert.Equal(t, oteltest.Hist{Count: 2}, w[lt+"headway.outcome=timeout"])

	// Bucket calls, against the independent count.
	calls := oteltest.Sums(t, got["headway.bucket.calls"])
	assert.Equal(t, cb.granted.Load(), calls[lt+"headway.result=granted"])
	assert.Equal(t, cb.refused.Load(), calls[lt+"headway.result=refused"])
	assert.EqualValues(t, 3, cb.granted.Load())
	assert.GreaterOrEqual(t, cb.refused.Load(), int64(1))
	assert.NotContains(t, calls, lt+"headway.result=error")
	ct := oteltest.Hists(t, got["headway.bucket.call.duration"])
	assert.EqualValues(t, cb.granted.Load(), ct[lt+"headway.result=granted"].Count)
	assert.Zero(t, ct[lt+"headway.result=granted"].Sum, "a Local bucket takes no time on a fake clock")
	assert.NotContains(t, got, "headway.limiter.degraded.decisions", "nothing degraded")
}

// A Redis bucket whose server goes away: the store's errors are counted as
// bucket calls with result=error, the acquires by what Acquire returned,
// and the latency histogram holds every call.
func TestObserverCountsRedisErrors(t *testing.T) {
	srv := redisenv.New(t)
	// No retries: once the server is gone, each call fails at once.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	r := oteltest.NewReader(t, otelmetrics.ScopeName)
	obs, err := otelmetrics.New(r.MP)
	require.NoError(t, err)
	tb, err := bucket.NewTokenBucket(rdb, t.Name(), 5, 10*time.Second)
	require.NoError(t, err)
	cb := &counting{inner: tb}
	lim := throttle.New(cb, throttle.WithObserver(obs))
	ctx := context.Background()
	var granted, timeouts int
	for range 8 {
		switch err := lim.Acquire(ctx, 0); {
		case err == nil:
			granted++
		case errors.Is(err, throttle.ErrTimeout):
			timeouts++
		default:
			t.Fatalf("Acquire: %v", err)
		}
	}
	require.Equal(t, 5, granted)
	require.NoError(t, srv.Close())
	// Another key: the first key's next place is the rest of the
	// interval away and would refuse without asking the bucket. What Acquire
	// returns while Redis is gone depends on the Limiter's failure policy
	// (the store's error, or a degraded decision): the metrics must match
	// what it returned, whatever it was.
	want := map[string]int64{"headway.outcome=granted": 5, "headway.outcome=timeout": int64(timeouts)}
	degradedGrants := 0
	for range 3 {
		err := lim.Key("other").Acquire(ctx, 0)
		switch {
		case err == nil:
			want["headway.outcome=granted"]++
			degradedGrants++
		case errors.Is(err, throttle.ErrTimeout):
			want["headway.outcome=timeout"]++
		default:
			var be *throttle.BackendError
			require.ErrorAs(t, err, &be, "Acquire with Redis gone")
			want["headway.outcome=error"]++
		}
	}

	got := r.Collect(t)
	assert.Equal(t, want, oteltest.Sums(t, got["headway.limiter.acquire.calls"]))
	if degradedGrants > 0 {
		assert.NotEmpty(t, got["headway.limiter.degraded.decisions"], "grants while Redis was gone are reported as degraded")
	}
	calls := oteltest.Sums(t, got["headway.bucket.calls"])
	wantCalls := map[string]int64{}
	for result, n := range map[string]int64{"granted": cb.granted.Load(), "refused": cb.refused.Load(), "error": cb.error.Load()} {
		if n > 0 { // (a result never seen has no series)
			wantCalls["headway.result="+result] = n
		}
	}
	assert.Equal(t, wantCalls, calls)
	assert.Positive(t, cb.error.Load(), "the bucket was asked while Redis was gone")
	ct := oteltest.Hists(t, got["headway.bucket.call.duration"])
	var n uint64
	var sum float64
	for _, h := range ct {
		n += h.Count
		sum += h.Sum
	}
	assert.EqualValues(t, cb.granted.Load()+cb.refused.Load()+cb.error.Load(), n)
	assert.Positive(t, sum, "real Redis round trips take time")
}

func TestObserverDegradedAndKeyAttribute(t *testing.T) {
	r := oteltest.NewReader(t, otelmetrics.ScopeName)
	class := func(key string) string { // "tenant/endpoint" → "endpoint"
		for i := len(key) - 1; i >= 0; i-- {
			if key[i] == '/' {
				return key[i+1:]
			}
		}
		return key
	}
	obs, err := otelmetrics.New(r.MP, otelmetrics.WithKeyAttribute(class))
	require.NoError(t, err)
	storeErr := &throttle.BackendError{Op: "take", Err: errors.New("connection refused")}
	obs.Degraded("t1/search", "open", true, storeErr)
	obs.Degraded("t2/search", "open", true, storeErr)
	obs.Degraded("t1/send", "closed", false, storeErr)
	obs.Degraded("t1/send", "custom", false, storeErr)

	clock := clockwork.NewFakeClock()
	local, err := throttle.NewLocal(1, time.Hour, throttle.WithClock(clock))
	require.NoError(t, err)
	lim := throttle.New(local, throttle.WithClock(clock), throttle.WithObserver(obs))
	for _, tenant := range []string{"t1", "t2", "t3"} {
		require.NoError(t, lim.Key(tenant+"/search").Acquire(context.Background(), 0))
	}

	got := r.Collect(t)
	assert.Equal(t, map[string]int64{
		"headway.granted=true,headway.key=search,headway.policy=open":  2,
		"headway.granted=false,headway.key=send,headway.policy=closed": 1,
		"headway.granted=false,headway.key=send,headway.policy=custom": 1,
	}, oteltest.Sums(t, got["headway.limiter.degraded.decisions"]))
	assert.Equal(t, map[string]int64{"headway.key=search,headway.outcome=granted": 3},
		oteltest.Sums(t, got["headway.limiter.acquire.calls"]), "three tenants, one series")
}

// Without a key attribute, the limiter key never reaches an attribute:
// a thousand tenants make one series per outcome.
func TestObserverNoKeyByDefault(t *testing.T) {
	r := oteltest.NewReader(t, otelmetrics.ScopeName)
	obs, err := otelmetrics.New(r.MP)
	require.NoError(t, err)
	local, err := throttle.NewLocal(1, time.Hour)
	require.NoError(t, err)
	lim := throttle.New(local, throttle.WithObserver(obs))
	for i := range 1000 {
		require.NoError(t, lim.Key(fmt.Sprint("tenant-", i)).Acquire(context.Background(), 0))
	}
	got := r.Collect(t)
	assert.Equal(t, map[string]int64{"headway.outcome=granted": 1000}, oteltest.Sums(t, got["headway.limiter.acquire.calls"]))
	assert.Equal(t, map[string]int64{"headway.result=granted": 1000}, oteltest.Sums(t, got["headway.bucket.calls"]))
}

// The hot path allocates nothing of its own: with a nil MeterProvider
// (no-op) a report allocates nothing at all, and with the SDK it
// allocates no more than the SDK does for a pre-built attribute set.
func TestObserverAllocations(t *testing.T) {
	noop, err := otelmetrics.New(nil)
	require.NoError(t, err)
	sdk, err := otelmetrics.New(oteltest.NewReader(t, otelmetrics.ScopeName).MP, otelmetrics.WithAttributes(attribute.String("headway.limiter", "x")))
	require.NoError(t, err)
	d := throttle.Decision{Granted: true}
	timeoutErr := fmt.Errorf("%w: test", throttle.ErrTimeout)
	for name, o := range map[string]*otelmetrics.Observer{"noop": noop, "sdk": sdk} {
		allocs := testing.AllocsPerRun(1000, func() {
			o.Acquired("tenant-1", 1, time.Millisecond, nil)
			o.Acquired("tenant-1", 1, time.Millisecond, timeoutErr)
			o.BucketCall("tenant-1", d, time.Microsecond, nil)
			o.Degraded("tenant-1", "open", true, timeoutErr)
		})
		t.Logf("%s: %.1f allocations per four reports", name, allocs)
		assert.Zero(t, allocs, "%s: allocations per four reports", name)
	}
}

// One Observer serves many goroutines at once (run with -race).
func TestObserverConcurrent(t *testing.T) {
	r := oteltest.NewReader(t, otelmetrics.ScopeName)
	obs, err := otelmetrics.New(r.MP)
	require.NoError(t, err)
	local, err := throttle.NewLocal(1_000_000, time.Second)
	require.NoError(t, err)
	lim := throttle.New(local, throttle.WithObserver(obs))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 500 {
				_ = lim.Acquire(context.Background(), 0)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, map[string]int64{"headway.outcome=granted": 4000}, oteltest.Sums(t, r.Collect(t)["headway.limiter.acquire.calls"]))
}

func TestNewRefusesReservedAttributes(t *testing.T) {
	_, err := otelmetrics.New(nil, otelmetrics.WithAttributes(otelmetrics.OutcomeKey.String("x")))
	assert.ErrorIs(t, err, throttle.ErrInvalid)
	_, err = otelmetrics.New(nil, otelmetrics.WithAttributes(attribute.KeyValue{}))
	assert.ErrorIs(t, err, throttle.ErrInvalid)
}
