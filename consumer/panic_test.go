package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/kafkaenv"
)

// logCapture is a slog handler that keeps every record, for tests that
// check what the consumer logs.
type logCapture struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCapture) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}
func (l *logCapture) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCapture) WithGroup(string) slog.Handler      { return l }

// find returns the attributes of the logged records whose message
// contains msg.
func (l *logCapture) find(msg string) []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, r := range l.recs {
		if !strings.Contains(r.Message, msg) {
			continue
		}
		attrs := map[string]string{"level": r.Level.String()}
		r.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.String()
			return true
		})
		out = append(out, attrs)
	}
	return out
}

// readAll reads every record of topic from the start, until it has n of
// them, or 30 s passed (a record acknowledged by Kafka, Stats.Parked 1,
// was not read within the 5 s this waited before, beside other packages'
// tests).
func readAll(t *testing.T, kc *kafkaenv.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	rd, err := kc.Client(kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer rd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		fs := rd.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		require.NoError(t, fs.Err())
		recs = append(recs, fs.Records()...)
	}
	return recs
}

func headers(r *kgo.Record) map[string]string {
	out := map[string]string{}
	for _, h := range r.Headers {
		out[h.Key] = string(h.Value)
	}
	return out
}

// A handler that panics on a record does not take the process down: the
// panic is a failed attempt, retried, then dead-lettered with the panic
// and its stack (bounded) in the error header; the stack is logged; the
// partition goes on.
func TestHandlerPanicIsRetriedAndDeadLettered(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("dlt", 1))
	produce(t, kc, "in", 1, 5, func(_ int32, i int) string { return fmt.Sprint("k", i) })

	var calls atomic.Int64
	h := newHandled(4)
	handler := func(ctx context.Context, rec *kgo.Record) error {
		if rec.Offset == 2 {
			calls.Add(1)
			var m map[string]int
			m["poison"]++ // panics: assignment to entry in nil map
		}
		return h.handler("a")(ctx, rec)
	}
	logs := &logCapture{}
	c, err := consumer.New(handler, limiter(t, 1000, 100*time.Millisecond), append(base(kc, "g", "in"),
		consumer.WithRetry(3, time.Millisecond, time.Millisecond),
		consumer.WithDeadLetter("dlt"),
		consumer.WithLogger(slog.New(logs)))...)
	require.NoError(t, err)
	r := start(t, c)
	h.waitFull(t, 10*time.Second)
	waitFor(t, 10*time.Second, "the poison record dead-lettered", func() bool { return c.Stats().DeadLettered == 1 })
	require.NoError(t, r.stop(t))

	assert.EqualValues(t, 3, calls.Load(), "the panicking record was attempted 3 times")
	assert.Equal(t, []int64{5}, committed(t, kc, "g", "in", 1))
	recs := readAll(t, kc, "dlt", 1)
	require.Len(t, recs, 1)
	got := headers(recs[0])
	assert.Equal(t, "2", got[consumer.HeaderOffset])
	assert.Contains(t, got[consumer.HeaderError], "panic")
	assert.Contains(t, got[consumer.HeaderError], "assignment to entry in nil map")
	assert.Contains(t, got[consumer.HeaderError], "TestHandlerPanicIsRetriedAndDeadLettered", "the stack is in the header")
	assert.LessOrEqual(t, len(got[consumer.HeaderError]), consumer.MaxErrorHeader)

	logged := logs.find("panicked")
	require.NotEmpty(t, logged, "the panic is logged")
	assert.Contains(t, logged[0]["stack"], "TestHandlerPanicIsRetriedAndDeadLettered")
}

// Without a dead-letter topic, a record whose handler panics on every
// attempt stops the consumer like any failing record: Run returns a
// HandlerError whose error is the PanicError, and the record is not
// committed.
func TestHandlerPanicStopsTheConsumerWithoutDeadLetter(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, 3, nil)
	boom := fmt.Errorf("boom")
	handler := func(_ context.Context, rec *kgo.Record) error {
		if rec.Offset == 1 {
			panic(boom)
		}
		return nil
	}
	c, err := consumer.New(handler, limiter(t, 1000, 100*time.Millisecond), append(base(kc, "g", "in"),
		consumer.WithRetry(2, time.Millisecond, time.Millisecond))...)
	require.NoError(t, err)
	err = start(t, c).wait(t, 10*time.Second)
	var herr *consumer.HandlerError
	require.ErrorAs(t, err, &herr)
	assert.EqualValues(t, 1, herr.Offset)
	assert.Equal(t, 2, herr.Attempts)
	var perr *consumer.PanicError
	require.ErrorAs(t, err, &perr)
	assert.Equal(t, boom, perr.Value)
	assert.ErrorIs(t, err, boom, "a panic with an error value unwraps to it")
	assert.Contains(t, string(perr.Stack), "TestHandlerPanicStopsTheConsumerWithoutDeadLetter")
	assert.Equal(t, []int64{1}, committed(t, kc, "g", "in", 1))
}
