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
// kfake topic raw: every record of a 6-partition topic read by a new
// group member, handled by a no-op handler under a limiter that always
// grants (consumer), or polled and marked for commit (raw). records/s is
// counted from the start (a new client joins the group) to the last
// record: both pay the join and the fetches (a client fetches ahead while
// it joins, so counting from the first record would time only the raw
// client's draining of its buffer).
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

func BenchmarkConsumeConsumer(b *testing.B) {
	kc := benchCluster(b)
	lim := throttle.New(always{})
	var spent time.Duration
	for i := 0; b.Loop(); i++ {
		var n atomic.Int64
		done := make(chan struct{})
		h := func(context.Context, *kgo.Record) error {
			if n.Add(1) == benchTotal {
				close(done)
			}
			return nil
		}
		c, err := consumer.New(h, lim, kafka(kc, fmt.Sprint("consumer-", i), "bench"),
			consumer.WithHandlerTimeout(time.Second), consumer.WithLogger(testLogger()))
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
		spent += time.Since(began)
		cancel()
		require.NoError(b, <-ran)
	}
	b.ReportMetric(float64(benchTotal)*float64(b.N)/spent.Seconds(), "records/s")
}

func BenchmarkConsumeRawFranzGo(b *testing.B) {
	kc := benchCluster(b)
	var spent time.Duration
	for i := 0; b.Loop(); i++ {
		opts := append(kafkaenv.FastClientOpts(),
			kgo.SeedBrokers(kc.Addrs()...),
			kgo.ConsumerGroup(fmt.Sprint("raw-", i)),
			kgo.ConsumeTopics("bench"),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.AutoCommitMarks(),
		)
		began := time.Now()
		cl, err := kgo.NewClient(opts...)
		require.NoError(b, err)
		n := 0
		deadline := time.Now().Add(time.Minute)
		for n < benchTotal {
			require.True(b, time.Now().Before(deadline), "only %d of %d records polled in a minute", n, benchTotal)
			fs := cl.PollRecords(context.Background(), 256)
			recs := fs.Records()
			cl.MarkCommitRecords(recs...)
			n += len(recs)
		}
		spent += time.Since(began)
		cl.Close()
	}
	b.ReportMetric(float64(benchTotal)*float64(b.N)/spent.Seconds(), "records/s")
}
