package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/internal/llmprovider"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

// The recipe of docs/limits.md, scaled down: a consumer whose handler is
// a plain client.Do, the Transport taking each call's cost (WithCost) and
// slot (WithConcurrency). Records beyond the budget's requests wait for
// room, an interval after the first ones, which comes after the
// handler's deadline (the budget's pace, interval/limit, is longer than
// that deadline too: each record is placed as soon as there is room): the
// Transport's ErrTimeout is a permit timeout, retried without using up the
// record's attempts, and the consumer keeps running until every record is
// handled, each with one call.
func TestRecipeConsumerWaitsForRoomInsteadOfStopping(t *testing.T) {
	const requests, records = 5, 8
	srv := redisenv.New(t)
	kc := kafkaenv.New(t, kafkaenv.Topic("recipe", 1))
	prov, err := llmprovider.Start(llmprovider.Config{MinTokens: 10, MaxTokens: 40, Seed: 1})
	require.NoError(t, err)
	defer func() { assert.NoError(t, prov.Close()) }()
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
	tr, err := httpclient.NewTransport(lim,
		httpclient.WithCost(func(*http.Request) (throttle.Cost, error) {
			return throttle.Cost{"requests": 1, "tokens": 100}, nil
		}, nil),
		httpclient.WithConcurrency(slots))
	require.NoError(t, err)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	handler := func(ctx context.Context, rec *kgo.Record) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, prov.URL(), bytes.NewReader(rec.Value))
		if err != nil {
			return err
		}
		req.Header.Set(llmprovider.RecordHeader, strconv.FormatInt(rec.Offset, 10))
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode/100 != 2 {
			return errors.New(resp.Status)
		}
		return nil
	}
	c, err := consumer.New(handler, nil,
		consumer.WithHandlerTimeout(300*time.Millisecond), // shorter than the interval and the pace, as a minute's budget is than the default 10 s
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
				t.Fatalf("the consumer stopped %d attempts into a record the budget would grant later: %v", herr.Attempts, err)
			}
			t.Fatalf("the consumer stopped: %v", err)
		case <-ctx.Done():
			t.Fatalf("%d of %d records handled", c.Stats().Handled, records)
		case <-time.After(10 * time.Millisecond):
		}
	}
	s := prov.Stats()
	assert.EqualValues(t, records, s.Accepted, "one call per record")
	assert.EqualValues(t, records, s.Records)
	assert.NotZero(t, c.Stats().PermitTimeouts, "records beyond the budget's requests met the handler's deadline")
	stop()
	require.NoError(t, <-ran)
}
