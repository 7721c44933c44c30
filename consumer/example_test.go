package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/throttle"
)

// A mailer sends one email per record, at most 2 per 100 ms. The Kafka
// cluster here is an in-process fake; in production, name real brokers in
// kgo.SeedBrokers and share a Redis bucket (package bucket) across the
// fleet instead of the in-memory one.
func Example() {
	kc, err := kafkaenv.Start(kafkaenv.Topic("emails", 1))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer kc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, to := range []string{"ann", "bob", "cy"} {
		if err := kc.Produce(ctx, "emails", &kgo.Record{Value: []byte(to)}); err != nil {
			fmt.Println(err)
			return
		}
	}

	b, err := throttle.NewLocal(2, 100*time.Millisecond)
	if err != nil {
		fmt.Println(err)
		return
	}
	lim := throttle.New(b)

	sent := 0 // records without a key share one key: calls never overlap
	send := func(ctx context.Context, rec *kgo.Record) error {
		fmt.Println("send to", string(rec.Value))
		if sent++; sent == 3 {
			cancel() // done: shut down, committing what was sent
		}
		return nil
	}
	c, err := consumer.New(send, lim,
		consumer.WithKafka(append(kafkaenv.FastClientOpts(),
			kgo.SeedBrokers(kc.Addrs()...),
			kgo.ConsumerGroup("mailer"),
			kgo.ConsumeTopics("emails"),
		)...),
		consumer.WithHandlerTimeout(time.Second), // at most half the rebalance timeout
		consumer.WithDeadLetter("emails.dlt"),
		consumer.WithLogger(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Run(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("handled:", c.Stats().Handled)
	// Output:
	// send to ann
	// send to bob
	// send to cy
	// handled: 3
}

// By default (ByKey) records with the same key are handled one at a time,
// in offset order, while different keys run concurrently: here the calls
// for "ann" and "bob" may interleave, but each customer's records come in
// the order they were produced.
func ExampleWithOrdering() {
	kc, err := kafkaenv.Start(kafkaenv.Topic("events", 1))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer kc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i, who := range []string{"ann", "bob", "ann", "bob", "ann", "bob"} {
		rec := &kgo.Record{Key: []byte(who), Value: fmt.Appendf(nil, "event %d", i)}
		if err := kc.Produce(ctx, "events", rec); err != nil {
			fmt.Println(err)
			return
		}
	}
	b, err := throttle.NewLocal(100, 100*time.Millisecond)
	if err != nil {
		fmt.Println(err)
		return
	}

	var mu sync.Mutex // calls for different keys run concurrently
	seen := map[string][]string{}
	n := 0
	handle := func(ctx context.Context, rec *kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		seen[string(rec.Key)] = append(seen[string(rec.Key)], string(rec.Value))
		if n++; n == 6 {
			cancel()
		}
		return nil
	}
	c, err := consumer.New(handle, throttle.New(b),
		consumer.WithKafka(append(kafkaenv.FastClientOpts(),
			kgo.SeedBrokers(kc.Addrs()...),
			kgo.ConsumerGroup("crm"),
			kgo.ConsumeTopics("events"),
		)...),
		consumer.WithOrdering(consumer.ByKey), // the default
		consumer.WithMaxInFlight(16),
		consumer.WithHandlerTimeout(time.Second),
		consumer.WithLogger(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Run(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("ann:", seen["ann"])
	fmt.Println("bob:", seen["bob"])
	// Output:
	// ann: [event 0 event 2 event 4]
	// bob: [event 1 event 3 event 5]
}

// A provider allows 100 calls a second for one API key. Password resets
// are urgent: they go ahead of every tenant's backlog, and 5 calls of each
// second are theirs alone, so that a reset never waits for the shared
// bucket's next grant (the bulk records' bucket keeps 95). The two
// buckets live in the fleet's Redis under keys of their own; together
// they keep the provider's 100.
func ExampleUrgentReserve() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	bulk, err := bucket.NewTokenBucket(rdb, "mail-api", 95, time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	resets, err := bucket.NewTokenBucket(rdb, "mail-api:urgent", 5, time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	tenant := func(r *kgo.Record) string { t, _, _ := strings.Cut(string(r.Key), ":"); return t } // keys "<tenant>:<user>"
	isReset := func(r *kgo.Record) bool { return r.Topic == "password-resets" }
	send := func(ctx context.Context, r *kgo.Record) error { return nil }
	c, err := consumer.New(send, throttle.New(bulk),
		consumer.WithKafka(kgo.SeedBrokers("localhost:9092"), kgo.ConsumerGroup("mailer"), kgo.ConsumeTopics("mail", "password-resets")),
		consumer.WithFairness(tenant,
			consumer.Urgent(isReset, 0.2), // beyond the reserve: at most 20 % of the shared permits
			consumer.UrgentReserve(throttle.New(resets)),
		),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = c.Run // c.Run(ctx) consumes until ctx ends
}
