package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/throttle"
)

// TestMain checks that no goroutine outlives the tests. Every kgo client
// and kfake cluster a test starts is closed in its cleanup, so no goleak
// option is needed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testLogger discards logs unless HEADWAY_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("HEADWAY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// limiter returns a Limiter over a Local bucket of limit permits per
// interval on the real clock.
func limiter(t testing.TB, limit int64, interval time.Duration, opts ...throttle.LocalOption) *throttle.Limiter {
	t.Helper()
	clock := clockwork.NewRealClock()
	b, err := throttle.NewLocal(limit, interval, append([]throttle.LocalOption{throttle.WithClock(clock)}, opts...)...)
	require.NoError(t, err)
	return throttle.New(b, throttle.WithClock(clock), throttle.WithLogger(testLogger()))
}

// kafka returns the WithKafka option of a fast group member of group
// reading topic. AutoCommitInterval is long, so that what a test sees
// committed was committed by the consumer on a revocation or at shutdown,
// not by the periodic autocommit.
func kafka(kc *kafkaenv.Cluster, group, topic string, more ...kgo.Opt) consumer.Option {
	opts := append(kafkaenv.FastClientOpts(),
		kgo.SeedBrokers(kc.Addrs()...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.AutoCommitInterval(time.Minute),
	)
	return consumer.WithKafka(append(opts, more...)...)
}

// base returns the options every test consumer shares: fast group
// settings allow a handler timeout of at most 1.5 s.
func base(kc *kafkaenv.Cluster, group, topic string) []consumer.Option {
	return []consumer.Option{
		kafka(kc, group, topic),
		consumer.WithHandlerTimeout(time.Second),
		consumer.WithLogger(testLogger()),
	}
}

// produce writes n records to each of partitions partitions of topic, with
// values "p<partition>-<i>" and key key(partition, i). It may be called
// from any goroutine.
func produce(t testing.TB, kc *kafkaenv.Cluster, topic string, partitions int32, n int, key func(p int32, i int) string) {
	if err := produceErr(kc, topic, partitions, n, key); err != nil {
		t.Errorf("producing: %v", err)
	}
}

func produceErr(kc *kafkaenv.Cluster, topic string, partitions int32, n int, key func(p int32, i int) string) error {
	cl, err := kc.Client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return err
	}
	defer cl.Close()
	var recs []*kgo.Record
	for i := range n {
		for p := range partitions {
			r := &kgo.Record{Topic: topic, Partition: p, Value: fmt.Appendf(nil, "p%d-%d", p, i)}
			if key != nil {
				r.Key = []byte(key(p, i))
			}
			recs = append(recs, r)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

// committed returns the group's committed offset of each partition of
// topic (-1 when none), as a new owner would read it. It may be called from
// any goroutine; on failure it reports the error and returns -2s.
func committed(t testing.TB, kc *kafkaenv.Cluster, group, topic string, partitions int32) []int64 {
	out, err := committedErr(kc, group, topic, partitions)
	if err != nil {
		t.Errorf("fetching committed offsets: %v", err)
		out = make([]int64, partitions)
		for i := range out {
			out[i] = -2
		}
	}
	return out
}

func committedErr(kc *kafkaenv.Cluster, group, topic string, partitions int32) ([]int64, error) {
	cl, err := kc.Client()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic = topic
	for p := range partitions {
		rt.Partitions = append(rt.Partitions, p)
	}
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, err
	}
	out := make([]int64, partitions)
	for i := range out {
		out[i] = -1
	}
	for _, tr := range resp.Topics {
		for _, pr := range tr.Partitions {
			if err := kerr.ErrorForCode(pr.ErrorCode); err != nil {
				return nil, err
			}
			out[pr.Partition] = pr.Offset
		}
	}
	return out, nil
}

// running is a consumer's Run in a goroutine.
type running struct {
	c      *consumer.Consumer
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

func start(t testing.TB, c *consumer.Consumer) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = c.Run(ctx)
	}()
	t.Cleanup(func() { _ = r.stop(t) })
	return r
}

// stop cancels Run and returns its error; Run must return within 10 s.
func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	return r.wait(t, 10*time.Second)
}

// wait waits for Run to return by itself.
func (r *running) wait(t testing.TB, d time.Duration) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(d):
		t.Fatalf("Run did not return within %v", d)
		return nil
	}
}

// handled records which consumer handled which record, in the order of
// handling.
type handled struct {
	mu     sync.Mutex
	log    []handling
	seen   map[[2]int64]int // (partition, offset) → times handled
	want   int
	full   chan struct{} // closed once want distinct records were handled
	closed bool
}

type handling struct {
	who       string
	partition int32
	offset    int64
}

func newHandled(want int) *handled {
	return &handled{seen: make(map[[2]int64]int), want: want, full: make(chan struct{})}
}

func (h *handled) add(who string, rec *kgo.Record) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.log = append(h.log, handling{who, rec.Partition, rec.Offset})
	k := [2]int64{int64(rec.Partition), rec.Offset}
	h.seen[k]++
	if len(h.seen) == h.want && !h.closed {
		h.closed = true
		close(h.full)
	}
}

func (h *handled) waitFull(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case <-h.full:
	case <-time.After(d):
		h.mu.Lock()
		n := len(h.seen)
		h.mu.Unlock()
		t.Fatalf("only %d of %d records handled within %v", n, h.want, d)
	}
}

// handler returns a Handler that records as who.
func (h *handled) handler(who string) consumer.Handler {
	return func(_ context.Context, rec *kgo.Record) error {
		h.add(who, rec)
		return nil
	}
}

// snapshot returns the handling log.
func (h *handled) snapshot() []handling {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]handling(nil), h.log...)
}

var errTest = errors.New("test: handler refuses")
