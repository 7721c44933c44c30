// The end-to-end test: several consumer instances in one group on a Kafka
// topic share one Redis token bucket in front of a provider that counts,
// while one instance stops and another joins.
package headway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/guarantee"
	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/internal/provider"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// deliveries records, per partition, the offsets in the order their
// handler calls succeeded.
type deliveries struct {
	mu    sync.Mutex
	order map[int32][]int64
}

func (d *deliveries) add(p int32, off int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.order[p] = append(d.order[p], off)
}

func TestFleetSharesOneLimitAcrossARebalance(t *testing.T) {
	const (
		topic      = "e2e"
		group      = "e2e-fleet"
		partitions = 6
		records    = 1800
		limit      = 100
		interval   = 200 * time.Millisecond
		// tolerance is how late a request may reach the provider after
		// its grant (HTTP on loopback, a busy 2-core machine under -race)
		// and still count in the period it was granted in.
		tolerance = 50 * time.Millisecond
	)
	rs := redisenv.New(t)
	kc := kafkaenv.New(t, kafkaenv.Topic(topic, partitions))
	prov, err := provider.Start(provider.Config{Limit: limit, Interval: interval, Policy: provider.Periods, Tolerance: tolerance})
	require.NoError(t, err)
	t.Cleanup(func() { _ = prov.Close() })

	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	t.Cleanup(hc.CloseIdleConnections)
	got := &deliveries{order: map[int32][]int64{}}
	var calls429 atomic.Int64
	handler := func(ctx context.Context, rec *kgo.Record) error {
		q := url.Values{"topic": {rec.Topic}, "partition": {strconv.Itoa(int(rec.Partition))}, "offset": {strconv.FormatInt(rec.Offset, 10)}}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, prov.URL()+"/call?"+q.Encode(), nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			calls429.Add(1)
			return fmt.Errorf("provider answered %s", resp.Status)
		}
		got.add(rec.Partition, rec.Offset)
		return nil
	}

	type instance struct {
		stop context.CancelFunc
		done chan error
	}
	start := func(name string) instance {
		// Each instance has its own Redis client and bucket, as separate
		// processes would; they share the bucket's key.
		b, err := bucket.NewTokenBucket(rs.Client(), "e2e", limit, interval)
		require.NoError(t, err)
		c, err := consumer.New(handler, throttle.New(b),
			consumer.WithKafka(append(kafkaenv.FastClientOpts(),
				kgo.SeedBrokers(kc.Addrs()...),
				kgo.ConsumerGroup(group),
				kgo.ConsumeTopics(topic),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
				kgo.ClientID(name),
			)...),
			consumer.WithHandlerTimeout(time.Second),
			consumer.WithRetry(5, 20*time.Millisecond, 200*time.Millisecond),
		)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		in := instance{stop: cancel, done: make(chan error, 1)}
		go func() { in.done <- c.Run(ctx) }()
		return in
	}
	stop := func(in instance) {
		in.stop()
		select {
		case err := <-in.done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("consumer stopped with %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a consumer did not stop within 20 s")
		}
	}
	waitHandled := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for prov.Stats().Records < n {
			require.True(t, time.Now().Before(deadline), "only %d of %d records handled after 60 s", prov.Stats().Records, n)
			time.Sleep(10 * time.Millisecond) // a poll of the outcome, not synchronisation
		}
	}

	recs := make([]*kgo.Record, records)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Partition: int32(i % partitions), Value: []byte(strconv.Itoa(i))}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prod, err := kc.Client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	require.NoError(t, prod.ProduceSync(ctx, recs...).FirstErr())

	a, b, c := start("a"), start("b"), start("c")
	waitHandled(records / 3)
	stop(b) // a rebalance: b's partitions move to a and c
	waitHandled(2 * records / 3)
	d := start("d") // another rebalance: d joins
	waitHandled(records)
	for _, in := range []instance{a, c, d} {
		stop(in)
	}

	s := prov.Stats()
	t.Logf("provider: %+v", s)
	assert.Equal(t, int64(records), s.Records, "every produced record handled at least once, none lost")
	assert.Zero(t, s.Rejected, "the provider never answered 429")
	assert.Zero(t, calls429.Load())
	assert.LessOrEqual(t, s.MaxInWindow, int64(limit), "the provider saw at most the limit in one period")
	rep := guarantee.Periods(prov.Arrivals(), limit, interval, tolerance)
	require.NoError(t, rep.Err(), "independent check of the token bucket's guarantee at the provider")
	t.Logf("guarantee: %s", rep)
	// Duplicates are possible only around the two rebalances, and a clean
	// revocation commits what was handled before handing a partition on:
	// there should be none. At most one per partition is tolerated, for a
	// handler abandoned at its timeout on a slow machine; a missing commit
	// on revoke would show hundreds.
	assert.LessOrEqual(t, s.Duplicates, int64(partitions), "duplicates beyond what clean rebalances allow")
	t.Logf("duplicates around the rebalances: %d", s.Duplicates)

	// Per-partition order of first deliveries.
	got.mu.Lock()
	defer got.mu.Unlock()
	assert.Len(t, got.order, partitions)
	for p, offs := range got.order {
		seen := map[int64]bool{}
		last := int64(-1)
		for _, off := range offs {
			if seen[off] {
				continue // a redelivery after a rebalance
			}
			seen[off] = true
			assert.Greater(t, off, last, "partition %d: offset %d handled for the first time after %d", p, off, last)
			last = off
		}
		assert.Equal(t, records/partitions, len(seen), "partition %d: records handled", p)
	}
}
