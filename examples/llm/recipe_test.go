package main

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// The recipe of docs/limits.md, scaled down: a consumer whose handler
// waits for its cost with AcquireCost. Records beyond a period's budget
// wait for the next period, which comes after the handler's deadline: the
// handler's ErrTimeout is a permit timeout, retried without using up the
// record's attempts, and the consumer keeps running until every record
// is handled.
func TestRecipeConsumerWaitsForTheNextPeriodInsteadOfStopping(t *testing.T) {
	const requests, records = 5, 8
	srv := redisenv.New(t)
	kc := kafkaenv.New(t, kafkaenv.Topic("recipe", 1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range records {
		require.NoError(t, kc.Produce(ctx, "recipe", &kgo.Record{Value: []byte("doc " + strconv.Itoa(i))}))
	}

	rdb := srv.Client()
	budget, err := bucket.NewBudget(rdb, "recipe", []bucket.Dimension{
		{Name: "requests", Limit: requests, Interval: 2 * time.Second},
		{Name: "tokens", Limit: 10_000, Interval: 2 * time.Second},
	})
	require.NoError(t, err)
	slots, err := bucket.NewConcurrency(rdb, "recipe", 2)
	require.NoError(t, err)
	defer slots.Close()
	lim := throttle.New(budget)
	defer lim.Close()

	var granted atomic.Int64
	handler := func(ctx context.Context, rec *kgo.Record) error {
		est := throttle.Cost{"requests": 1, "tokens": 100}
		g, err := lim.AcquireCost(ctx, est, time.Minute)
		if err != nil {
			return err
		}
		granted.Add(1)
		return g.Settle(ctx, throttle.Cost{"requests": 1, "tokens": 40})
	}
	c, err := consumer.New(handler, nil, consumer.WithConcurrency(slots),
		consumer.WithHandlerTimeout(time.Second), // shorter than the period, as a minute's budget is than the default 10 s
		consumer.WithKafka(append(kafkaenv.FastClientOpts(),
			kgo.SeedBrokers(kc.Addrs()...), kgo.ConsumerGroup("recipe"), kgo.ConsumeTopics("recipe"),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		)...))
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- c.Run(runCtx) }()

	handled := func() bool { return c.Stats().Handled == records }
	for !handled() {
		select {
		case err := <-ran:
			var herr *consumer.HandlerError
			if errors.As(err, &herr) {
				t.Fatalf("the consumer stopped %d attempts into a record the next period would grant: %v", herr.Attempts, err)
			}
			t.Fatalf("the consumer stopped: %v", err)
		case <-ctx.Done():
			t.Fatalf("%d of %d records handled", c.Stats().Handled, records)
		case <-time.After(10 * time.Millisecond):
		}
	}
	assert.EqualValues(t, records, granted.Load(), "one cost per record")
	assert.NotZero(t, c.Stats().PermitTimeouts, "records beyond the first period met the handler's deadline")
	stop()
	require.NoError(t, <-ran)
}
