package consumer_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/throttle"
)

// New checks the Kafka settings the consumer cannot work without, and
// names the missing one, rather than letting Run wait without a word.
func TestNewRefusesMissingKafkaSettings(t *testing.T) {
	t.Parallel()
	h := func(context.Context, *kgo.Record) error { return nil }
	seeds := kgo.SeedBrokers("127.0.0.1:1")
	group := kgo.ConsumerGroup("g")
	topics := kgo.ConsumeTopics("in")
	for _, tc := range []struct {
		name string
		opts []kgo.Opt
		want string
	}{
		{"no topics", []kgo.Opt{seeds, group}, "kgo.ConsumeTopics"},
		{"no group", []kgo.Opt{seeds, topics}, "kgo.ConsumerGroup"},
		{"no brokers", []kgo.Opt{group, topics}, "kgo.SeedBrokers"},
		{"an empty broker address", []kgo.Opt{kgo.SeedBrokers(""), group, topics}, "kgo.SeedBrokers"},
		{"a blank broker address among others", []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1", " "), group, topics}, "kgo.SeedBrokers"},
		{"transactional", []kgo.Opt{seeds, group, topics, kgo.TransactionalID("tx")}, "kgo.TransactionalID"},
		{"autocommit disabled", []kgo.Opt{seeds, group, topics, kgo.DisableAutoCommit()}, "WithKafka"},
		{"direct partitions", []kgo.Opt{seeds, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"in": {0: kgo.NewOffset()}})}, "kgo.ConsumerGroup"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := consumer.New(h, nil, consumer.WithKafka(tc.opts...))
			require.Error(t, err)
			assert.Nil(t, c)
			assert.ErrorIs(t, err, throttle.ErrInvalid)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	// The shaping topic must be a topic of its own.
	for _, opts := range [][]consumer.Option{
		{consumer.WithKafka(seeds, group, topics), consumer.WithShaping("in", time.Second)},
		{consumer.WithKafka(seeds, group, topics), consumer.WithShaping("x", time.Second), consumer.WithDeadLetter("x")},
	} {
		_, err := consumer.New(h, nil, opts...)
		require.ErrorIs(t, err, throttle.ErrInvalid)
		assert.Contains(t, err.Error(), "WithShaping")
	}
	for _, bad := range []consumer.Option{consumer.WithShaping("", time.Second), consumer.WithShaping("s", 0), consumer.WithShaping("s", 2*time.Hour)} {
		_, err := consumer.New(h, nil, consumer.WithKafka(seeds, group, topics), bad)
		require.ErrorIs(t, err, throttle.ErrInvalid)
		assert.Contains(t, err.Error(), "WithShaping")
	}
	// A handler timeout a rebalance could not wait for is refused at New.
	_, err := consumer.New(h, nil, consumer.WithKafka(seeds, group, topics, kgo.RebalanceTimeout(time.Second)),
		consumer.WithHandlerTimeout(time.Second))
	require.ErrorIs(t, err, throttle.ErrInvalid)
	assert.Contains(t, err.Error(), "rebalance timeout")
}

// A consumer whose brokers do not answer says so in its log within 10 s,
// rather than running silently.
func TestRunWarnsWhenNoBrokerAnswers(t *testing.T) {
	t.Parallel()
	logs := &logCapture{}
	h := func(context.Context, *kgo.Record) error { return nil }
	c, err := consumer.New(h, nil,
		consumer.WithKafka(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("in")),
		consumer.WithLogger(slog.New(logs)))
	require.NoError(t, err)
	r := start(t, c)
	began := time.Now()
	waitFor(t, 10*time.Second, "a warning that no broker answers", func() bool {
		for _, w := range logs.find("no Kafka broker answers") {
			if w["level"] == slog.LevelWarn.String() {
				return true
			}
		}
		return false
	})
	t.Logf("warned after %v", time.Since(began))
	require.NoError(t, r.stop(t))
}

// New accepts the configuration every user writes first, whatever form the
// franz-go release in the user's module returns its options in (v1.22.3
// returned the topics in another form than v1.22.2, and New refused every
// consumer).
func TestNewAcceptsTheFirstConfigurationAUserWrites(t *testing.T) {
	t.Parallel()
	h := func(context.Context, *kgo.Record) error { return nil }
	for _, opts := range [][]consumer.Option{
		{consumer.WithKafka(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("app"), kgo.ConsumeTopics("orders"))},
		{consumer.WithKafka(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("app"), kgo.ConsumeTopics("orders", "refunds")),
			consumer.WithShaping("orders-parked", time.Second), consumer.WithDeadLetter("orders-dlq")},
		{consumer.WithKafka(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("app"), kgo.ConsumeTopics("orders.*"), kgo.ConsumeRegex()),
			consumer.WithShaping("orders-parked", time.Second)},
		{consumer.WithKafka(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("app"), kgo.ConsumeTopics("orders"),
			kgo.RebalanceTimeout(time.Minute), kgo.FetchMaxPartitionBytes(64<<20))},
	} {
		c, err := consumer.New(h, nil, opts...)
		require.NoError(t, err)
		assert.NotNil(t, c)
	}
}

// A dead-letter topic the consumer consumes itself would take every dead
// letter back to the handler, and a record that always fails would go
// round for ever: New refuses it, as it refuses such a shaping topic.
// Patterns (kgo.ConsumeRegex) are not refused: the consumer leaves the
// topic out of what they match
// (TestPatternsLeaveTheDeadLetterTopicOut).
func TestNewRefusesADeadLetterTopicItConsumes(t *testing.T) {
	t.Parallel()
	h := func(context.Context, *kgo.Record) error { return nil }
	seeds, group := kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("g")
	_, err := consumer.New(h, nil, consumer.WithKafka(seeds, group, kgo.ConsumeTopics("in", "in-dlq")), consumer.WithDeadLetter("in-dlq"))
	require.ErrorIs(t, err, throttle.ErrInvalid)
	assert.Contains(t, err.Error(), "WithDeadLetter")

	c, err := consumer.New(h, nil, consumer.WithKafka(seeds, group, kgo.ConsumeTopics("in-dlq"), kgo.ConsumeRegex()), consumer.WithDeadLetter("in-dlq"))
	require.NoError(t, err)
	assert.NotNil(t, c)
}

// A pattern that also matches the dead-letter topic (orders\..* and
// orders.dlq) does not make the consumer read its own dead letters: the
// group's member subscribes to the other topics only.
func TestPatternsLeaveTheDeadLetterTopicOut(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("orders.a", 1), kafkaenv.Topic("orders.dlq", 1))
	h := func(context.Context, *kgo.Record) error { return errTest }
	opts := append(kafkaenv.FastClientOpts(), kgo.SeedBrokers(kc.Addrs()...), kgo.ConsumerGroup("g"),
		kgo.ConsumeTopics(`^orders\.`), kgo.ConsumeRegex(), kgo.AutoCommitInterval(time.Minute))
	c, err := consumer.New(h, nil, consumer.WithKafka(opts...), consumer.WithHandlerTimeout(time.Second),
		consumer.WithLogger(testLogger()), consumer.WithRetry(1, time.Millisecond, time.Millisecond),
		consumer.WithDeadLetter("orders.dlq"))
	require.NoError(t, err)
	produce(t, kc, "orders.a", 1, 1, nil)
	start(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	g, err := kc.WaitGroupBalanced(ctx, "g", 1)
	require.NoError(t, err)
	for _, m := range g.Members {
		assert.Equal(t, []string{"orders.a"}, m.SubscribedTopics)
		assert.NotContains(t, m.Assignment, "orders.dlq")
	}
	waitFor(t, 15*time.Second, "the record dead-lettered", func() bool { return c.Stats().DeadLettered == 1 })
	assert.Len(t, readAll(t, kc, "orders.dlq", 1), 1)
}
