package consumer_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/throttle"
)

// keyOrder checks, at the handler, that each key's records come in
// offset order, and counts the records of each tenant (the key's prefix
// before '-').
type keyOrder struct {
	// repeats allows a record handled again right after itself (a
	// redelivery after a member stopped without committing it).
	repeats  bool
	mu       sync.Mutex
	last     map[string]int64
	reorders []string
	handled  map[string]int
	seen     map[int64]bool
}

func newKeyOrder() *keyOrder {
	return &keyOrder{last: map[string]int64{}, handled: map[string]int{}, seen: map[int64]bool{}}
}

func (o *keyOrder) handle(_ context.Context, rec *kgo.Record) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := fmt.Sprintf("%s/%d/%s", rec.Topic, rec.Partition, rec.Key)
	if last, ok := o.last[k]; ok && (rec.Offset < last || rec.Offset == last && !o.repeats) {
		o.reorders = append(o.reorders, fmt.Sprintf("%s: %d after %d", k, rec.Offset, last))
	}
	o.last[k] = rec.Offset
	if !o.seen[rec.Offset] {
		o.seen[rec.Offset] = true
		o.handled[tenant(rec)]++
	}
	return nil
}

func (o *keyOrder) count(tenant string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.handled[tenant]
}

func tenant(rec *kgo.Record) string {
	t, _, _ := strings.Cut(string(rec.Key), "-")
	return t
}

// tenants returns a WithLimiterFor of a budget per tenant: hot has one
// permit per hour, spent here; cold has plenty.
func tenants(t *testing.T) consumer.Option {
	hot := limiter(t, 1, time.Hour)
	require.NoError(t, hot.Key("hot").Acquire(context.Background(), 0))
	cold := limiter(t, 100_000, time.Second)
	return consumer.WithLimiterFor(func(r *kgo.Record) throttle.Keyed {
		if tenant(r) == "hot" {
			return hot.Key("hot")
		}
		return cold.Key(tenant(r))
	})
}

// produceTenants writes, to one partition of topic, one record of tenant
// hot, then n records of tenant cold over 50 keys.
func produceTenants(t *testing.T, kc *kafkaenv.Cluster, topic string, n int) {
	produce(t, kc, topic, 1, n+1, func(_ int32, i int) string {
		if i == 0 {
			return "hot-0"
		}
		return fmt.Sprintf("cold-%d", i%50)
	})
}

// One hot tenant does not stop its partition: with shaping on, as the
// package doc recommends, its record leaves the partition's path for the
// shaping topic once it has waited the bound, and all 2,000 cold records
// behind it are handled within seconds while it waits; every key's order
// holds, nothing is lost, and the partition's commit passes the hot
// record, which waits in the shaping topic.
func TestHotTenantDoesNotStopItsPartition(t *testing.T) {
	t.Parallel()
	const cold = 2000
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("in.shaping", 4))
	produceTenants(t, kc, "in", cold)

	o := newKeyOrder()
	c, err := consumer.New(o.handle, nil, append(base(kc, "g", "in"), tenants(t),
		consumer.WithShaping("in.shaping", time.Second))...) // as the package doc recommends
	require.NoError(t, err)
	began := time.Now()
	r := start(t, c)
	waitFor(t, 10*time.Second, "every cold record handled", func() bool { return o.count("cold") == cold })
	t.Logf("%d cold records handled in %v", cold, time.Since(began))
	waitFor(t, 10*time.Second, "the hot record parked", func() bool { return c.Stats().Parked == 1 })
	require.NoError(t, r.stop(t))
	assert.Equal(t, []int64{cold + 1}, committed(t, kc, "g", "in", 1), "the partition's commit passed the hot record")

	assert.Zero(t, o.count("hot"), "the hot record waits for its tenant's permit")
	assert.Empty(t, o.reorders)
	s := c.Stats()
	assert.EqualValues(t, 1, s.Parked)
	recs := readAll(t, kc, "in.shaping", 1)
	require.Len(t, recs, 1, "the hot record is in the shaping topic")
	hs := headers(recs[0])
	assert.Equal(t, "hot-0", string(recs[0].Key))
	assert.Equal(t, "in", hs[consumer.HeaderTopic])
	assert.Equal(t, "0", hs[consumer.HeaderOffset])
}

// handling is one handler call: which record, and from where it came to
// the handler (its own topic, or parked).
type keyLog struct {
	mu      sync.Mutex
	offsets map[string][]int64 // key → offsets in handling order
}

func (l *keyLog) add(rec *kgo.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.offsets == nil {
		l.offsets = map[string][]int64{}
	}
	l.offsets[string(rec.Key)] = append(l.offsets[string(rec.Key)], rec.Offset)
}

func (l *keyLog) get(key string) []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int64(nil), l.offsets[key]...)
}

func (l *keyLog) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, o := range l.offsets {
		n += len(o)
	}
	return n
}

// A key with many records, each slow to handle, holds its partition at
// most the shaping bound: the records of it a worker took before the bound
// ran out are handled in place (each takes at least 10 ms, so at most
// bound/10ms + 1 of them), the rest go to the shaping topic and are
// handled from there, and the key's order holds across the switch. The
// other keys' records are not held up, and everything is committed.
func TestKeyWithManyRecordsIsParkedInOrder(t *testing.T) {
	t.Parallel()
	const hot, others = 150, 300
	const bound = 100 * time.Millisecond
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("in.shaping", 3))
	// The hot key's records first, then the others'.
	produce(t, kc, "in", 1, hot+others, func(_ int32, i int) string {
		if i < hot {
			return "hot"
		}
		return fmt.Sprint("k", i%30)
	})
	var l keyLog
	var direct atomicCounter
	h := func(_ context.Context, rec *kgo.Record) error {
		l.add(rec)
		if string(rec.Key) == "hot" {
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	}
	c, err := consumer.New(func(ctx context.Context, rec *kgo.Record) error {
		if string(rec.Key) == "hot" && rec.Topic == "in" {
			direct.add()
		}
		return h(ctx, rec)
	}, nil, append(base(kc, "g", "in"), consumer.WithShaping("in.shaping", bound))...)
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 20*time.Second, "every record handled", func() bool { return l.total() == hot+others })
	require.NoError(t, r.stop(t))

	got := l.get("hot")
	want := make([]int64, hot)
	for i := range want {
		want[i] = int64(i)
	}
	assert.Equal(t, want, got, "the hot key's records, once each, in offset order")
	s := c.Stats()
	t.Logf("hot key: %d records handled before it was parked, %d parked", hot-int(s.Parked), s.Parked)
	assert.LessOrEqual(t, hot-int(s.Parked), int(bound/(10*time.Millisecond))+1, "records of the key handled in place, beyond the bound")
	assert.Positive(t, s.Parked)
	assert.Equal(t, []int64{hot + others}, committed(t, kc, "g", "in", 1))
}

type atomicCounter struct {
	mu sync.Mutex
	n  int
}

func (a *atomicCounter) add() { a.mu.Lock(); a.n++; a.mu.Unlock() }

// gate is a bucket that grants while open, and while closed refuses,
// telling the limiter to ask again in 200 ms. Records draw from the
// budget of their key (byKey).
type gate struct {
	only string // refuse only this key while closed; "": every key
	mu   sync.Mutex
	open bool
}

func (g *gate) Take(_ context.Context, key string, _ int64, _ time.Duration) (throttle.Decision, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open || g.only != "" && key != g.only {
		return throttle.Decision{Granted: true}, nil
	}
	return throttle.Decision{Delay: 200 * time.Millisecond}, nil
}

func (g *gate) set(open bool) { g.mu.Lock(); g.open = open; g.mu.Unlock() }

// A member that takes over a partition knows which keys of it have
// records still parked, from the shaping topic: the key's new record is
// parked behind them rather than handled before them, though its permit
// would come at once. Here the parked record's handler holds it for a
// second, long enough for an overtaking record to be seen.
func TestNewOwnerKeepsTheOrderOfAParkedKey(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("in.shaping", 2))
	produce(t, kc, "in", 1, 1, func(int32, int) string { return "k" })
	g := &gate{}
	newMember := func(h consumer.Handler) *consumer.Consumer {
		// A limiter per member, as separate processes have, on one bucket.
		c, err := consumer.New(h, throttle.New(g), append(base(kc, "g", "in"),
			consumer.WithShaping("in.shaping", 100*time.Millisecond),
			consumer.WithHandlerTimeout(1500*time.Millisecond))...)
		require.NoError(t, err)
		return c
	}

	// a parks offset 0 (no permit), and leaves.
	a := newMember(func(context.Context, *kgo.Record) error { return nil })
	ra := start(t, a)
	waitFor(t, 10*time.Second, "a parks the record", func() bool { return a.Stats().Parked == 1 })
	require.NoError(t, ra.stop(t))

	// The key's next record; permits now come at once.
	produce(t, kc, "in", 1, 1, func(int32, int) string { return "k" })
	g.set(true)

	var mu sync.Mutex
	var order []int64
	overtaken := false
	b := newMember(func(ctx context.Context, rec *kgo.Record) error {
		mu.Lock()
		order = append(order, rec.Offset)
		mu.Unlock()
		if rec.Offset == 0 {
			// Hold the parked record a while: an overtaking record
			// would be handled meanwhile.
			deadline := time.Now().Add(time.Second)
			for time.Now().Before(deadline) {
				mu.Lock()
				overtaken = overtaken || len(order) > 1
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}
		return nil
	})
	rb := start(t, b)
	waitFor(t, 15*time.Second, "b handles both records", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) >= 2
	})
	require.NoError(t, rb.stop(t))
	mu.Lock()
	defer mu.Unlock()
	assert.False(t, overtaken, "the key's new record was handled while its parked one was")
	assert.Equal(t, []int64{0, 1}, order)
	assert.EqualValues(t, 1, b.Stats().Parked, "b parked the key's new record behind the parked one")
}

// Once a key's parked records have all been handled, its next records are
// handled in place again.
func TestParkedKeyIsHandledInPlaceOnceItsParkedRecordsAreDone(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("in.shaping", 2))
	produce(t, kc, "in", 1, 1, func(int32, int) string { return "k" })
	g := &gate{}
	var l keyLog
	c, err := consumer.New(func(_ context.Context, rec *kgo.Record) error { l.add(rec); return nil }, throttle.New(g),
		append(base(kc, "g", "in"), consumer.WithShaping("in.shaping", 50*time.Millisecond))...)
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 10*time.Second, "the record parked", func() bool { return c.Stats().Parked == 1 })
	g.set(true)
	waitFor(t, 10*time.Second, "the parked record handled", func() bool { return len(l.get("k")) == 1 })
	// The shaping topic's watermark has passed the parked record: the
	// key's next records go in place.
	produce(t, kc, "in", 1, 3, func(int32, int) string { return "k" })
	waitFor(t, 10*time.Second, "the next records handled", func() bool { return len(l.get("k")) == 4 })
	require.NoError(t, r.stop(t))
	assert.Equal(t, []int64{0, 1, 2, 3}, l.get("k"))
	assert.EqualValues(t, 1, c.Stats().Parked, "only the first record was parked")
}

// Without shaping, a key that waits holds its partition: its records and
// those behind it stay held, up to the partition's bound in records
// (queue size + one poll), and then the partition's fetching pauses: the
// cold records beyond it wait.
func TestWithoutShapingAWaitingKeyHoldsItsPartitionAtTheBound(t *testing.T) {
	t.Parallel()
	const cold, queue, poll = 2000, 64, 16
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produceTenants(t, kc, "in", cold)
	o := newKeyOrder()
	c, err := consumer.New(o.handle, nil, append(base(kc, "g", "in"), tenants(t),
		consumer.WithQueueSize(queue), consumer.WithPollSize(poll))...)
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 10*time.Second, "the partition paused with the hot record waiting", func() bool {
		s := c.Stats()
		return len(s.Partitions) == 1 && s.Partitions[0].Paused && s.Partitions[0].Waiting
	})
	require.NoError(t, r.stop(t))
	s := c.Stats()
	assert.LessOrEqual(t, s.PeakBuffered, queue+poll)
	assert.Less(t, o.count("cold"), queue+poll, "cold records handled past the bound")
	assert.LessOrEqual(t, committed(t, kc, "g", "in", 1)[0], int64(0), "nothing committed past the waiting record")
}

// A member that stops while writing a parked record (its writes to the
// shaping topic failing meanwhile) does not wait for the write beyond the
// handler timeout, and commits nothing past the record; the next member
// handles that record, and every record after it that its commit's
// offset map does not say finished, each key in order.
func TestStopWhileParkingLosesNothing(t *testing.T) {
	t.Parallel()
	const cold = 20
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("in.shaping", 2))
	produce(t, kc, "in", 1, cold+1, func(_ int32, i int) string {
		if i == 0 {
			return "hot"
		}
		return fmt.Sprint("k-", i)
	})
	g := &gate{only: "hot"}
	fault := kc.Fake().Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "in.shaping", Err: kerr.NotLeaderForPartition, Count: -1})
	o := newKeyOrder()
	o.repeats = true // a's records not committed are handled again
	member := func() *consumer.Consumer {
		c, err := consumer.New(o.handle, nil, append(base(kc, "g", "in"), byKey(throttle.New(g)),
			consumer.WithShaping("in.shaping", 50*time.Millisecond),
			consumer.WithHandlerTimeout(300*time.Millisecond))...)
		require.NoError(t, err)
		return c
	}
	a := member()
	ra := start(t, a)
	waitFor(t, 10*time.Second, "a writes the parked record, in vain", func() bool { return fault.Hits() > 0 && o.count("k") == cold })
	require.NoError(t, ra.stop(t))
	assert.LessOrEqual(t, committed(t, kc, "g", "in", 1)[0], int64(0), "committed past the record being parked")
	assert.Zero(t, a.Stats().Parked)

	fault.Remove()
	g.set(true)
	b := member()
	rb := start(t, b)
	// b handles the record a was parking (a committed nothing past it),
	// and the others again unless a's offset map has them.
	waitFor(t, 10*time.Second, "b handles every record", func() bool {
		s := b.Stats()
		return o.count("hot") == 1 && s.Handled+s.Restored == cold+1
	})
	assert.GreaterOrEqual(t, b.Stats().Handled, int64(1))
	require.NoError(t, rb.stop(t))
	assert.Empty(t, o.reorders)
	assert.Equal(t, cold, o.count("k"))
	assert.Equal(t, []int64{cold + 1}, committed(t, kc, "g", "in", 1))
}

// A member that dies after parking a record and before committing it
// loses nothing: the next member finds the key parked, parks its records
// again behind the first copy (a duplicate), and the key's records are
// first handled in offset order.
func TestCrashBetweenParkingAndCommitLosesNothing(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("in.shaping", 2))
	produce(t, kc, "in", 1, 5, func(_ int32, i int) string {
		if i == 0 {
			return "hot"
		}
		return fmt.Sprint("k", i)
	})
	g := &gate{only: "hot"}
	var mu sync.Mutex
	var log []string // who/offset of each handling
	handler := func(who string) consumer.Handler {
		return func(_ context.Context, rec *kgo.Record) error {
			mu.Lock()
			log = append(log, fmt.Sprintf("%s/%s/%d", who, rec.Key, rec.Offset))
			mu.Unlock()
			return nil
		}
	}
	ks := &killSwitch{}
	a, err := consumer.New(handler("a"), nil, append(base(kc, "g", "in"), byKey(throttle.New(g)),
		consumer.WithShaping("in.shaping", 50*time.Millisecond),
		consumer.WithKafka(kgo.Dialer(ks.DialContext), kgo.RetryTimeout(time.Second), kgo.RequestRetries(1)))...)
	require.NoError(t, err)
	ra := start(t, a)
	waitFor(t, 10*time.Second, "a parks the hot record and handles the rest", func() bool {
		s := a.Stats()
		return s.Parked == 1 && s.Handled == 4
	})
	ks.kill()
	// The hot key's next record, and permits for it.
	produce(t, kc, "in", 1, 1, func(int32, int) string { return "hot" })
	g.set(true)

	b, err := consumer.New(handler("b"), nil, append(base(kc, "g", "in"), byKey(throttle.New(g)),
		consumer.WithShaping("in.shaping", 50*time.Millisecond))...)
	require.NoError(t, err)
	rb := start(t, b)
	seen := func(entry string) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(log, entry)
	}
	waitFor(t, 20*time.Second, "b handles the hot key's next record", func() bool { return seen("b/hot/5") })
	require.NoError(t, rb.stop(t))
	t.Logf("the dead member's Run: %v", ra.stop(t))

	mu.Lock()
	defer mu.Unlock()
	first := map[string]int{}
	for i, e := range log {
		if _, ok := first[e[2:]]; !ok {
			first[e[2:]] = i
		}
	}
	for i := 1; i <= 4; i++ {
		assert.Contains(t, first, fmt.Sprintf("k%d/%d", i, i), "record %d lost", i)
	}
	require.Contains(t, first, "hot/0", "the parked record lost")
	assert.Less(t, first["hot/0"], first["hot/5"], "the hot key's records first handled out of order: %v", log)
	assert.Equal(t, []int64{6}, committed(t, kc, "g", "in", 1))
}

// A record larger than a producer batch (1.5 MB, compressible) is parked
// and handled from the shaping topic whole.
func TestLargeRecordIsParkedWhole(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("in.shaping", 1))
	value := bytes.Repeat([]byte("headway "), 1_500_000/8)
	produceLarge(t, kc, "in", value)
	g := &gate{}
	got := make(chan []byte, 1)
	c, err := consumer.New(func(_ context.Context, rec *kgo.Record) error {
		got <- bytes.Clone(rec.Value)
		return nil
	}, throttle.New(g), append(base(kc, "g", "in"), consumer.WithShaping("in.shaping", 50*time.Millisecond))...)
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 10*time.Second, "the record parked", func() bool { return c.Stats().Parked == 1 })
	g.set(true)
	select {
	case v := <-got:
		assert.True(t, bytes.Equal(value, v), "the parked record's value came back whole")
	case <-time.After(10 * time.Second):
		t.Fatal("the parked record was not handled")
	}
	require.NoError(t, r.stop(t))
}

// The smallest queues (one record, 1 KiB, one record per poll) still
// handle every record, each key in order, with shaping parking the keys
// that wait.
func TestTinyQueuesHandleEveryRecord(t *testing.T) {
	t.Parallel()
	const n = 100
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 2), kafkaenv.Topic("in.shaping", 2))
	produce(t, kc, "in", 2, n, func(p int32, i int) string { return fmt.Sprintf("k%d", i%7) })
	g := &gate{only: "k0"} // key k0 gets no permit at first: it is parked
	o := newKeyOrder()
	var total sync.WaitGroup
	total.Add(2 * n)
	seen := map[[2]int64]bool{}
	var mu sync.Mutex
	c, err := consumer.New(func(ctx context.Context, rec *kgo.Record) error {
		mu.Lock()
		k := [2]int64{int64(rec.Partition), rec.Offset}
		first := !seen[k]
		seen[k] = true
		mu.Unlock()
		if first {
			total.Done()
		}
		return o.handle(ctx, rec)
	}, nil, append(base(kc, "g", "in"), byKey(throttle.New(g)),
		consumer.WithQueueSize(1), consumer.WithQueueBytes(1024), consumer.WithPollSize(1),
		consumer.WithMaxInFlight(4), consumer.WithShaping("in.shaping", 20*time.Millisecond))...)
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 10*time.Second, "k0 parked", func() bool { return c.Stats().Parked > 0 })
	g.set(true)
	done := make(chan struct{})
	go func() { total.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("not every record handled within 30 s: %+v", c.Stats())
	}
	require.NoError(t, r.stop(t))
	assert.Empty(t, o.reorders)
	assert.Equal(t, []int64{n, n}, committed(t, kc, "g", "in", 2))
	t.Logf("parked: %d", c.Stats().Parked)
}

// byKey gives each record the budget of its key on lim.
func byKey(lim *throttle.Limiter) consumer.Option {
	return consumer.WithLimiterFor(func(r *kgo.Record) throttle.Keyed { return lim.Key(string(r.Key)) })
}

// A large record among a key's parked records keeps its place: the
// records before it are written, then it alone, then those after it, so
// the shaping topic, and the handler, see them in offset order.
func TestLargeRecordAmongParkedRecordsKeepsItsPlace(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("in.shaping", 1))
	big := bytes.Repeat([]byte("headway "), 1_500_000/8)
	cl, err := kc.Client(kgo.ProducerBatchMaxBytes(8<<20), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	var recs []*kgo.Record
	for i, v := range [][]byte{[]byte("small-0"), big, []byte("small-2"), []byte("small-3")} {
		recs = append(recs, &kgo.Record{Topic: "in", Key: []byte("hot"), Value: v, Headers: []kgo.RecordHeader{{Key: "i", Value: fmt.Append(nil, i)}}})
	}
	require.NoError(t, cl.ProduceSync(context.Background(), recs...).FirstErr())
	cl.Close()

	g := &gate{}
	var mu sync.Mutex
	var order []int64
	c, err := consumer.New(func(_ context.Context, rec *kgo.Record) error {
		mu.Lock()
		order = append(order, rec.Offset)
		mu.Unlock()
		return nil
	}, throttle.New(g), append(base(kc, "g", "in"), consumer.WithShaping("in.shaping", 50*time.Millisecond))...)
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 10*time.Second, "every record parked", func() bool { return c.Stats().Parked == 4 })
	g.set(true)
	waitFor(t, 10*time.Second, "every record handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == 4 })
	require.NoError(t, r.stop(t))
	assert.Equal(t, []int64{0, 1, 2, 3}, order)
	var offs []string
	for _, rec := range readAll(t, kc, "in.shaping", 4) {
		offs = append(offs, headers(rec)[consumer.HeaderOffset])
	}
	assert.Equal(t, []string{"0", "1", "2", "3"}, offs, "the shaping topic's order")
}

// A record the shaping topic refuses as too large (its max.message.bytes
// is below the record's topic's) does not stop the consumer, which would
// stop again on it after every restart: it waits in place, behind its
// key's parked records, and every record of its key is handled, whole and
// in order.
func TestRecordTooLargeForTheShapingTopicWaitsInPlace(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	createTopic(t, kc, "in.shaping", 1, map[string]string{"max.message.bytes": "100000"})
	large := make([]byte, 300_000)
	_, _ = rand.Read(large)
	cl, err := kc.Client(kgo.ProducerBatchMaxBytes(8 << 20))
	require.NoError(t, err)
	for i, v := range [][]byte{[]byte("small"), large, []byte("small")} {
		require.NoError(t, cl.ProduceSync(context.Background(), &kgo.Record{Topic: "in", Key: []byte("big"), Value: v}).FirstErr(), "record %d", i)
	}
	cl.Close()

	g := &gate{}
	logs := &logCapture{}
	var mu sync.Mutex
	var offsets []int64
	var whole bool
	c, err := consumer.New(func(_ context.Context, rec *kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		offsets = append(offsets, rec.Offset)
		if rec.Offset == 1 {
			whole = bytes.Equal(large, rec.Value)
		}
		return nil
	}, throttle.New(g), append(base(kc, "g", "in"), consumer.WithShaping("in.shaping", 50*time.Millisecond),
		consumer.WithLogger(slog.New(logs)))...)
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 10*time.Second, "parking refused as too large", func() bool {
		return len(logs.find("consumer: record too large for the shaping topic; it waits in place")) > 0
	})
	g.set(true)
	waitFor(t, 10*time.Second, "every record handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(offsets) >= 3
	})
	require.NoError(t, r.stop(t), "the consumer stopped on a record too large to park")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []int64{0, 1, 2}, offsets, "the key's records in order, once each")
	assert.True(t, whole, "the large record's value came back whole")
}

// A record whose permit is free is handled in place, however late a
// worker reaches it: the shaping bound parks records that would wait, not
// records that a busy machine was slow to start. With a bound of 1 ns
// every worker is "late"; each key's only record still goes straight to
// the handler, and the shaping topic stays empty.
func TestRecordWithAFreePermitIsNotParkedWhenItsWorkerIsLate(t *testing.T) {
	t.Parallel()
	const n = 20 // per partition
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 2), kafkaenv.Topic("in.shaping", 2))
	produce(t, kc, "in", 2, n, func(p int32, i int) string { return fmt.Sprint("k-", p, "-", i) })
	o := newKeyOrder()
	c, err := consumer.New(o.handle, nil, append(base(kc, "g", "in"), byKey(throttle.New(&gate{open: true})),
		consumer.WithShaping("in.shaping", time.Nanosecond))...)
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 10*time.Second, "every record handled", func() bool { return c.Stats().Handled == 2*n })
	require.NoError(t, r.stop(t))
	assert.Zero(t, c.Stats().Parked, "records with a free permit were parked")
	assert.Empty(t, o.reorders)
	assert.Equal(t, []int64{n, n}, committed(t, kc, "g", "in", 2))
}
