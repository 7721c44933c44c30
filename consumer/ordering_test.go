package consumer_test

import (
	"context"
	"fmt"
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

// orderLog checks, as calls happen, that calls of one ordering unit never
// overlap and come in offset order, and counts the calls running at once.
type orderLog struct {
	unit func(*kgo.Record) string // the ordering unit of a record

	mu       sync.Mutex
	running  map[string]bool
	last     map[string]int64
	overlaps []string
	reorders []string
	now, top int
	handled  int
}

func newOrderLog(unit func(*kgo.Record) string) *orderLog {
	return &orderLog{unit: unit, running: map[string]bool{}, last: map[string]int64{}}
}

func (o *orderLog) handler(hold time.Duration) consumer.Handler {
	return func(_ context.Context, rec *kgo.Record) error {
		u := fmt.Sprintf("%d/%s", rec.Partition, o.unit(rec))
		o.mu.Lock()
		if o.running[u] {
			o.overlaps = append(o.overlaps, fmt.Sprintf("%s@%d", u, rec.Offset))
		}
		if last, ok := o.last[u]; ok && rec.Offset <= last {
			o.reorders = append(o.reorders, fmt.Sprintf("%s: %d after %d", u, rec.Offset, last))
		}
		o.running[u], o.last[u] = true, rec.Offset
		o.now++
		o.top = max(o.top, o.now)
		o.mu.Unlock()

		time.Sleep(hold) // a slow call, so that calls can overlap

		o.mu.Lock()
		o.running[u] = false
		o.now--
		o.handled++
		o.mu.Unlock()
		return nil
	}
}

func (o *orderLog) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.handled
}

// Each ordering keeps its promise while records of a partition are in
// flight concurrently: ByKey never overlaps or reorders calls of one key,
// ByPartition of one partition, and every ordering commits everything in
// the end. The keys' concurrency shows in the calls running at once.
func TestOrderingsKeepTheirOrder(t *testing.T) {
	t.Parallel()
	const parts, perPart, keys = 2, 120, 4
	byKey := func(r *kgo.Record) string { return string(r.Key) }
	whole := func(*kgo.Record) string { return "" }
	none := func(r *kgo.Record) string { return fmt.Sprint(r.Offset) }
	for _, tt := range []struct {
		ordering consumer.Ordering
		unit     func(*kgo.Record) string
		inFlight int
		// most calls at once that the ordering allows here
		most int
	}{
		{consumer.ByKey, byKey, 64, parts * keys},
		{consumer.ByPartition, whole, 64, parts},
		{consumer.Unordered, none, 6, 6},
	} {
		t.Run(tt.ordering.String(), func(t *testing.T) {
			t.Parallel()
			kc := kafkaenv.New(t, kafkaenv.Topic("in", parts))
			produce(t, kc, "in", parts, perPart, func(_ int32, i int) string { return fmt.Sprint("k", i%keys) })
			o := newOrderLog(tt.unit)
			c, err := consumer.New(o.handler(2*time.Millisecond), limiter(t, 1000, 100*time.Millisecond),
				append(base(kc, "g", "in"), consumer.WithOrdering(tt.ordering), consumer.WithMaxInFlight(tt.inFlight))...)
			require.NoError(t, err)
			r := start(t, c)
			waitFor(t, 30*time.Second, "every record handled", func() bool { return o.count() == parts*perPart })
			require.NoError(t, r.stop(t))

			assert.Empty(t, o.overlaps, "calls of one unit overlapped")
			assert.Empty(t, o.reorders, "calls of one unit out of offset order")
			assert.LessOrEqual(t, o.top, tt.most, "calls at once")
			assert.Equal(t, c.Stats().PeakInFlight, o.top)
			assert.Greater(t, o.top, 1, "no two calls ever ran at once")
			assert.Equal(t, []int64{perPart, perPart}, committed(t, kc, "g", "in", parts))
			t.Logf("%s: at most %d calls at once", tt.ordering, o.top)
		})
	}
}

// A record that keeps failing holds back only its key: records of other
// keys behind it in the partition are handled meanwhile, and the failing
// key's later records wait for it, in order.
func TestRetryHoldsBackOnlyItsKey(t *testing.T) {
	t.Parallel()
	const n = 40
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	// Offset 0 has key "bad"; so do 10, 20, 30. The others have keys of
	// their own.
	produce(t, kc, "in", 1, n, func(_ int32, i int) string {
		if i%10 == 0 {
			return "bad"
		}
		return fmt.Sprint("k", i)
	})
	heal := make(chan struct{})
	var mu sync.Mutex
	var order []int64
	var others, failures atomic.Int64
	h := func(_ context.Context, rec *kgo.Record) error {
		if string(rec.Key) == "bad" && rec.Offset == 0 {
			select {
			case <-heal:
			default:
				failures.Add(1)
				return errTest
			}
		}
		mu.Lock()
		order = append(order, rec.Offset)
		mu.Unlock()
		if string(rec.Key) != "bad" {
			others.Add(1)
		}
		return nil
	}
	c, err := consumer.New(h, limiter(t, 1000, 100*time.Millisecond), append(base(kc, "g", "in"),
		consumer.WithRetry(1000, 2*time.Millisecond, 2*time.Millisecond))...)
	require.NoError(t, err)
	r := start(t, c)
	// Both, whichever comes first: on a busy machine the other keys'
	// records can all be handled before offset 0 is first tried.
	waitFor(t, 20*time.Second, "the other keys' records handled while offset 0 fails", func() bool {
		return others.Load() == n-4 && failures.Load() > 0
	})
	assert.Zero(t, c.Stats().Handled-int64(n-4), "no record of the failing key handled before it")
	close(heal)
	waitFor(t, 20*time.Second, "every record handled", func() bool { return c.Stats().Handled == n })
	require.NoError(t, r.stop(t))

	mu.Lock()
	defer mu.Unlock()
	var bad []int64
	for _, off := range order {
		if off%10 == 0 {
			bad = append(bad, off)
		}
	}
	assert.Equal(t, []int64{0, 10, 20, 30}, bad, "the failing key's records in offset order")
	assert.Positive(t, c.Stats().Retried)
	assert.Equal(t, []int64{n}, committed(t, kc, "g", "in", 1))
}

// Records finished out of order commit nothing past the first unfinished
// one: with offset 3 in flight and every other record handled, the
// committed offset (autocommitted every 100 ms) reaches 3 and stays there;
// once 3 finishes, everything is committed.
func TestWatermarkCommitsNothingPastTheFirstUnfinished(t *testing.T) {
	t.Parallel()
	const n = 10
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, n, func(_ int32, i int) string { return fmt.Sprint("k", i) })
	gate := make(chan struct{})
	var others atomic.Int64
	h := func(ctx context.Context, rec *kgo.Record) error {
		if rec.Offset == 3 {
			select {
			case <-gate:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		others.Add(1)
		return nil
	}
	c, err := consumer.New(h, limiter(t, 1000, 100*time.Millisecond),
		kafka(kc, "g", "in", kgo.AutoCommitInterval(100*time.Millisecond), kgo.RebalanceTimeout(20*time.Second)),
		consumer.WithHandlerTimeout(10*time.Second), consumer.WithLogger(testLogger()))
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 10*time.Second, "every record but offset 3 handled", func() bool { return others.Load() == n-1 })
	waitFor(t, 10*time.Second, "offsets 0-2 committed", func() bool {
		return committed(t, kc, "g", "in", 1)[0] == 3
	})
	// Several autocommits later, still nothing past offset 3.
	for range 5 {
		time.Sleep(100 * time.Millisecond) // an autocommit interval
		require.EqualValues(t, 3, committed(t, kc, "g", "in", 1)[0], "committed past the unfinished offset 3")
	}
	s := c.Stats()
	assert.Equal(t, n-3, s.Buffered, "offsets 3-9 held: 3 in flight, 4-9 finished behind it")
	close(gate)
	waitFor(t, 10*time.Second, "everything committed", func() bool { return committed(t, kc, "g", "in", 1)[0] == n })
	require.NoError(t, r.stop(t))
}

// A member that dies with records finished out of order behind an
// unfinished one: the next owner handles again exactly the records from
// the first unfinished on (the unfinished one and those finished behind
// it, uncommitted), and none before it.
func TestCrashRedeliversOnlyFromTheWatermark(t *testing.T) {
	t.Parallel()
	const n = 10
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, n, func(_ int32, i int) string { return fmt.Sprint("k", i) })

	gate := make(chan struct{})
	defer close(gate)
	var aOthers atomic.Int64
	aHandler := func(ctx context.Context, rec *kgo.Record) error {
		if rec.Offset == 3 {
			select {
			case <-gate:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		aOthers.Add(1)
		return nil
	}
	ks := &killSwitch{}
	a, err := consumer.New(aHandler, limiter(t, 1000, 100*time.Millisecond), append(base(kc, "g", "in"),
		consumer.WithKafka(kgo.AutoCommitInterval(100*time.Millisecond), kgo.Dialer(ks.DialContext),
			kgo.RetryTimeout(time.Second), kgo.RequestRetries(1)))...)
	require.NoError(t, err)
	ra := start(t, a)
	waitFor(t, 10*time.Second, "a handles all but offset 3", func() bool { return aOthers.Load() == n-1 })
	waitFor(t, 10*time.Second, "a's autocommit reaches offset 3", func() bool { return committed(t, kc, "g", "in", 1)[0] == 3 })
	ks.kill()

	h := newHandled(n - 3)
	b, err := consumer.New(h.handler("b"), limiter(t, 1000, 100*time.Millisecond), base(kc, "g", "in")...)
	require.NoError(t, err)
	rb := start(t, b)
	h.waitFull(t, 30*time.Second)
	require.NoError(t, rb.stop(t))
	t.Logf("the dead member's Run: %v", ra.stop(t))

	var got []int64
	for _, x := range h.snapshot() {
		got = append(got, x.offset)
	}
	assert.ElementsMatch(t, []int64{3, 4, 5, 6, 7, 8, 9}, got,
		"redelivered: the unfinished record and the finished ones behind it, nothing before")
	assert.Equal(t, []int64{n}, committed(t, kc, "g", "in", 1))
}
