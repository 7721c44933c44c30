package consumer

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/internal/kafkaenv"
)

// warnings is a slog handler that keeps the messages and attributes of
// warnings.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, b.String())
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

func (w *warnings) has(sub string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.msgs {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}

// idleConsumer returns a consumer of topic in group on kc that checks
// for idleness every few milliseconds.
func idleConsumer(t *testing.T, kc *kafkaenv.Cluster, group, topic string, w *warnings) *Consumer {
	t.Helper()
	c, err := New(func(context.Context, *kgo.Record) error { return nil }, nil,
		WithKafka(append(kafkaenv.FastClientOpts(), kgo.SeedBrokers(kc.Addrs()...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic))...),
		WithHandlerTimeout(time.Second), WithLogger(slog.New(w)))
	require.NoError(t, err)
	c.cfg.idleFirst, c.cfg.idleAssign = 20*time.Millisecond, 50*time.Millisecond
	return c
}

func runFor(t *testing.T, c *Consumer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return")
		}
	}
}

// A consumer of a topic that does not exist says which.
func TestRunWarnsWhenTopicsDoNotExist(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("exists", 1))
	w := &warnings{}
	stop := runFor(t, idleConsumer(t, kc, "g", "missing", w))
	defer stop()
	require.Eventually(t, func() bool { return w.has("do not exist") && w.has("missing=[missing]") }, 10*time.Second, 5*time.Millisecond)
}

// A member that gets no partition (more members than partitions) says so;
// one that owns a partition does not.
func TestRunWarnsWhenNoPartitionIsAssigned(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("one", 1))
	wa, wb := &warnings{}, &warnings{}
	a := idleConsumer(t, kc, "g", "one", wa)
	stopA := runFor(t, a)
	defer stopA()
	require.Eventually(t, func() bool { return len(a.Stats().Partitions) == 1 }, 10*time.Second, 5*time.Millisecond)
	wa.mu.Lock()
	wa.msgs = nil // what a said before it owned the partition
	wa.mu.Unlock()
	stopB := runFor(t, idleConsumer(t, kc, "g", "one", wb))
	defer stopB()
	require.Eventually(t, func() bool { return wb.has("no partition assigned") }, 10*time.Second, 5*time.Millisecond)
	assert.False(t, wa.has("no partition assigned"), "the member that owns the partition warned")
}
