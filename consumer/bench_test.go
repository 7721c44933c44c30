package consumer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/throttle"
)

// The consumer's own overhead, side by side with franz-go polling the same
// kfake topic raw, in one run: each iteration reads every record of a
// 6-partition topic with a new group, first raw (polled and marked for
// commit), then with the consumer (a no-op handler under a limiter that
// always grants). records/s is counted from the start (a new client joins
// the group) to the last record: both pay the join and the fetches.
// decodes/record counts the records of every batch the consumer's client
// decoded (kgo's OnFetchBatchRead) per record handled: 1 when nothing is
// fetched twice.
//
//	go test -run '^$' -bench 'Consume' -benchtime 5x ./consumer/
const (
	benchParts   = 6
	benchPerPart = 20000
	benchTotal   = benchParts * benchPerPart
)

func benchCluster(b *testing.B) *kafkaenv.Cluster {
	b.Helper()
	kc := kafkaenv.New(b, kafkaenv.Topic("bench", benchParts))
	produce(b, kc, "bench", benchParts, benchPerPart, func(_ int32, i int) string { return fmt.Sprint("k", i%1000) })
	return kc
}

// always is a bucket that grants every take: the limiter costs only its
// own code.
type always struct{}

func (always) Take(context.Context, string, int64, time.Duration) (throttle.Decision, error) {
	return throttle.Decision{Granted: true}, nil
}

// decodes counts the records of the batches a client decodes.
type decodes struct{ n atomic.Int64 }

func (d *decodes) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	d.n.Add(int64(m.NumRecords))
}

func BenchmarkConsume(b *testing.B) {
	kc := benchCluster(b)
	lim := throttle.New(always{})
	var consumerTime, rawTime time.Duration
	var decoded int64
	for i := 0; b.Loop(); i++ {
		rawTime += consumeRaw(b, kc, fmt.Sprint("raw-", i))
		d, n := consumeWith(b, kc, lim, fmt.Sprint("consumer-", i))
		consumerTime += d
		decoded += n
	}
	consumerRate := float64(benchTotal) * float64(b.N) / consumerTime.Seconds()
	rawRate := float64(benchTotal) * float64(b.N) / rawTime.Seconds()
	b.ReportMetric(consumerRate, "records/s")
	b.ReportMetric(rawRate, "raw-records/s")
	b.ReportMetric(consumerRate/rawRate, "x-raw")
	b.ReportMetric(float64(decoded)/float64(benchTotal*b.N), "decodes/record")
}

// consumeWith reads the topic with a consumer and returns the time taken
// and the records its client decoded.
func consumeWith(b *testing.B, kc *kafkaenv.Cluster, lim *throttle.Limiter, group string, more ...consumer.Option) (time.Duration, int64) {
	return consumeCall(b, kc, lim, group, nil, more...)
}

// consumeCall is consumeWith with a handler that runs call (nil: none)
// for each record.
func consumeCall(b *testing.B, kc *kafkaenv.Cluster, lim *throttle.Limiter, group string, call func(), more ...consumer.Option) (time.Duration, int64) {
	var n atomic.Int64
	done := make(chan struct{})
	h := func(context.Context, *kgo.Record) error {
		if call != nil {
			call()
		}
		if n.Add(1) == benchTotal {
			close(done)
		}
		return nil
	}
	dec := &decodes{}
	c, err := consumer.New(h, lim, append([]consumer.Option{kafka(kc, group, "bench", kgo.WithHooks(dec)),
		consumer.WithHandlerTimeout(time.Second), consumer.WithLogger(testLogger())}, more...)...)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	began := time.Now()
	go func() { ran <- c.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		b.Fatalf("only %d of %d records handled in a minute", n.Load(), benchTotal)
	}
	spent := time.Since(began)
	cancel()
	require.NoError(b, <-ran)
	return spent, dec.n.Load()
}

// consumeRaw reads the topic with franz-go alone and returns the time
// taken.
func consumeRaw(b *testing.B, kc *kafkaenv.Cluster, group string) time.Duration {
	opts := append(kafkaenv.FastClientOpts(),
		kgo.SeedBrokers(kc.Addrs()...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics("bench"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.AutoCommitMarks(),
	)
	began := time.Now()
	cl, err := kgo.NewClient(opts...)
	require.NoError(b, err)
	defer cl.Close()
	n := 0
	deadline := time.Now().Add(time.Minute)
	for n < benchTotal {
		require.True(b, time.Now().Before(deadline), "only %d of %d records polled in a minute", n, benchTotal)
		fs := cl.PollRecords(context.Background(), 256)
		recs := fs.Records()
		cl.MarkCommitRecords(recs...)
		n += len(recs)
	}
	return time.Since(began)
}

// benchGroups numbers the groups of BenchmarkConsumeFairness.
var benchGroups atomic.Int64

// One tenant under WithFairness against the same consumer without it, in
// one run, on the topic of BenchmarkConsume: "always" with a limiter that
// always grants and a no-op handler (the scheduler's own cost), "paced"
// with a limit of 20,000 per second (Local, 2,000 per 100 ms) and a
// handler of 1 ms (whether the few permit requests kept outstanding keep
// the limit's pace). x-plain is the rate with fairness over the rate
// without.
//
//	go test -run '^$' -bench 'ConsumeFairness' -benchtime 3x ./consumer/
func BenchmarkConsumeFairness(b *testing.B) {
	kc := benchCluster(b)
	one := consumer.WithFairness(func(*kgo.Record) string { return "tenant" })
	for _, tt := range []struct {
		name string
		lim  func() *throttle.Limiter
		call func()
	}{
		{"always", func() *throttle.Limiter { return throttle.New(always{}) }, nil},
		{"paced", func() *throttle.Limiter { return limiter(b, 2000, 100*time.Millisecond) }, func() { time.Sleep(time.Millisecond) }},
	} {
		b.Run(tt.name, func(b *testing.B) {
			var plain, fair time.Duration
			for b.Loop() {
				i := benchGroups.Add(1) // a new group each time, whatever runs the function again
				d, _ := consumeCall(b, kc, tt.lim(), fmt.Sprint(tt.name, "-plain-", i), tt.call)
				plain += d
				d, _ = consumeCall(b, kc, tt.lim(), fmt.Sprint(tt.name, "-fair-", i), tt.call, one)
				fair += d
			}
			plainRate := float64(benchTotal) * float64(b.N) / plain.Seconds()
			fairRate := float64(benchTotal) * float64(b.N) / fair.Seconds()
			b.ReportMetric(plainRate, "plain-records/s")
			b.ReportMetric(fairRate, "fair-records/s")
			b.ReportMetric(fairRate/plainRate, "x-plain")
		})
	}
}
