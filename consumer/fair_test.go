package consumer_test

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/throttle"
)

// tenantOfKey is the tenant of a record keyed "<tenant>-<entity>".
func tenantOfKey(r *kgo.Record) string {
	t, _, _ := strings.Cut(string(r.Key), "-")
	return t
}

// grantLog records the order in which records reach the handler, and
// checks the order per key as orderLog does.
type grantLog struct {
	*orderLog
	mu    sync.Mutex
	order []string // key of each call, in call order
}

func newGrantLog() *grantLog {
	return &grantLog{orderLog: newOrderLog(func(r *kgo.Record) string { return string(r.Key) })}
}

func (g *grantLog) handler(h *handled) consumer.Handler {
	inner := g.orderLog.handler(time.Millisecond)
	return func(ctx context.Context, rec *kgo.Record) error {
		g.mu.Lock()
		g.order = append(g.order, string(rec.Key))
		g.mu.Unlock()
		h.add("c", rec)
		return inner(ctx, rec)
	}
}

// positions returns where the calls of records whose key has prefix
// were, in call order.
func (g *grantLog) positions(prefix string) []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []int
	for i, k := range g.order {
		if strings.HasPrefix(k, prefix) {
			out = append(out, i)
		}
	}
	return out
}

// fairBacklog produces, on each of parts partitions, perPart records of
// tenant A (50 keys per partition), then late records of tenant B (one
// key each), so that B's records are behind A's whole backlog in every
// partition.
func fairBacklog(t *testing.T, kc *kafkaenv.Cluster, topic string, parts int32, perPart, late int) {
	produce(t, kc, topic, parts, perPart, func(p int32, i int) string { return fmt.Sprintf("A-%d.%d", p, i%50) })
	produce(t, kc, topic, parts, late, func(p int32, i int) string { return fmt.Sprintf("B-%d.%d", p, i) })
}

// gatedLimiter is a Limiter of 10 permits per 50 ms on a fake clock whose
// first period is spent: no permit comes until the clock moves.
func gatedLimiter(t *testing.T) (*throttle.Limiter, *clockwork.FakeClock) {
	t.Helper()
	clock := clockwork.NewFakeClock()
	b, err := throttle.NewLocal(10, 50*time.Millisecond, throttle.WithClock(clock))
	require.NoError(t, err)
	lim := throttle.New(b, throttle.WithClock(clock), throttle.WithLogger(testLogger()))
	require.NoError(t, lim.AcquireN(context.Background(), 10, 0))
	return lim, clock
}

// driveWhenFetched waits until c holds all total records, then moves
// clock 5 ms at a time until h has them all handled.
func driveWhenFetched(t *testing.T, c *consumer.Consumer, clock *clockwork.FakeClock, h *handled, total int) {
	t.Helper()
	waitFor(t, 30*time.Second, "every record fetched", func() bool { return c.Stats().Buffered == total })
	waitFor(t, 30*time.Second, "every record handled", func() bool {
		select {
		case <-h.full:
			return true
		default:
			clock.Advance(5 * time.Millisecond)
			return false
		}
	})
}

// A tenant whose few records sit behind another tenant's backlog in every
// partition gets permits in turn with it, not after it: each of B's
// records is among the first calls, while A's records keep their order
// per key and every record is handled and committed once. Without
// WithFairness, B's records come last (the control).
func TestFairnessServesALateTenantAheadOfABacklog(t *testing.T) {
	t.Parallel()
	const parts, perPart, late = 3, 100, 2
	for _, fairness := range []bool{true, false} {
		t.Run(fmt.Sprint("fairness=", fairness), func(t *testing.T) {
			t.Parallel()
			kc := kafkaenv.New(t, kafkaenv.Topic("in", parts))
			fairBacklog(t, kc, "in", parts, perPart, late)
			total := parts * (perPart + late)
			h := newHandled(total)
			g := newGrantLog()
			opts := append(base(kc, "g", "in"), consumer.WithMaxInFlight(64))
			if fairness {
				opts = append(opts, consumer.WithFairness(tenantOfKey))
			}
			// No permit until every record is in the consumer: where B's
			// records are among the calls is the scheduler's doing, not
			// how soon each partition's fetch came back (a loaded machine
			// delivered two partitions 50 calls late).
			lim, clock := gatedLimiter(t)
			c, err := consumer.New(g.handler(h), lim, opts...)
			require.NoError(t, err)
			r := start(t, c)
			driveWhenFetched(t, c, clock, h, total)
			require.NoError(t, r.stop(t))

			bs := g.positions("B-")
			require.Len(t, bs, parts*late)
			if fairness {
				// B is active from its records' arrival: every other
				// permit is B's until its 6 records are done.
				assert.Less(t, bs[len(bs)-1], 40, "B's calls at %v of %d", bs, total)
			} else {
				assert.Greater(t, bs[len(bs)-1], 100, "control: without fairness B's calls come behind A's backlog, at %v", bs)
			}
			assert.Empty(t, g.overlaps, "calls of one key overlapped")
			assert.Empty(t, g.reorders, "calls of one key out of order")
			for k, n := range h.seen {
				assert.Equal(t, 1, n, "record %v handled %d times", k, n)
			}
			assert.Equal(t, []int64{perPart + late, perPart + late, perPart + late}, committed(t, kc, "g", "in", parts))
		})
	}
}

// An urgent record behind every tenant's backlog is among the next calls.
func TestFairnessServesUrgentRecordsFirst(t *testing.T) {
	t.Parallel()
	const parts, perPart = 2, 100
	kc := kafkaenv.New(t, kafkaenv.Topic("in", parts))
	produce(t, kc, "in", parts, perPart, func(p int32, i int) string { return fmt.Sprintf("%c-%d.%d", 'A'+i%3, p, i%7) })
	produce(t, kc, "in", parts, 1, func(p int32, i int) string { return fmt.Sprintf("U-%d", p) })
	total := parts * (perPart + 1)
	h := newHandled(total)
	g := newGrantLog()
	isUrgent := func(r *kgo.Record) bool { return tenantOfKey(r) == "U" }
	// No permit until every record has been fetched: the urgent
	// records' places in the calls depend on the scheduler alone, not on
	// when Kafka delivered the second partition (a loaded machine once
	// delivered it 50 calls late).
	lim, clock := gatedLimiter(t)
	c, err := consumer.New(g.handler(h), lim,
		append(base(kc, "g", "in"), consumer.WithFairness(tenantOfKey, consumer.Urgent(isUrgent, 0.5)))...)
	require.NoError(t, err)
	r := start(t, c)
	driveWhenFetched(t, c, clock, h, total)
	require.NoError(t, r.stop(t))
	us := g.positions("U-")
	require.Len(t, us, parts)
	assert.Less(t, us[len(us)-1], 20, "urgent calls at %v of %d", us, total)
	assert.Empty(t, g.reorders)
}

// Records waiting for their turn belong to their partition: when a second
// member joins and takes partitions over, the records the first held go
// to the new owner, and every record is handled, in order per key,
// nothing lost.
func TestFairnessHandsWaitingRecordsOverOnRebalance(t *testing.T) {
	t.Parallel()
	const parts, perPart, late = 4, 60, 2
	kc := kafkaenv.New(t, kafkaenv.Topic("in", parts))
	fairBacklog(t, kc, "in", parts, perPart, late)
	total := parts * (perPart + late)
	h := newHandled(total)
	g := newGrantLog()
	lim := limiter(t, 10, 50*time.Millisecond)
	newMember := func() *consumer.Consumer {
		c, err := consumer.New(g.handler(h), lim, append(base(kc, "g", "in"), consumer.WithFairness(tenantOfKey))...)
		require.NoError(t, err)
		return c
	}
	r1 := start(t, newMember())
	require.Eventually(t, func() bool { return g.count() >= 20 }, 20*time.Second, 5*time.Millisecond)
	r2 := start(t, newMember())
	h.waitFull(t, 60*time.Second)
	require.NoError(t, r1.stop(t))
	require.NoError(t, r2.stop(t))
	assert.Empty(t, g.overlaps)
	assert.Empty(t, g.reorders)
	want := make([]int64, parts)
	for i := range want {
		want[i] = perPart + late
	}
	assert.Equal(t, want, committed(t, kc, "g", "in", parts))
}

// A tenant whose own budget is spent (WithLimiterFor) holds up no other
// under WithFairness: the permit requests for its budget wait alone, the
// other tenants' budgets get requests of their own, and with WithShaping
// its record is parked at the bound as without fairness.
func TestFairnessWithASpentBudgetHoldsUpNoOtherTenant(t *testing.T) {
	t.Parallel()
	for _, shaping := range []bool{false, true} {
		t.Run(fmt.Sprint("shaping=", shaping), func(t *testing.T) {
			t.Parallel()
			const cold = 500
			kc := kafkaenv.New(t, kafkaenv.Topic("in", 1), kafkaenv.Topic("in.shaping", 2))
			produceTenants(t, kc, "in", cold) // hot's record first, then cold's (keyOrder counts one partition)
			o := newKeyOrder()
			opts := append(base(kc, "g", "in"), tenants(t), consumer.WithFairness(tenant))
			if shaping {
				opts = append(opts, consumer.WithShaping("in.shaping", 500*time.Millisecond))
			}
			c, err := consumer.New(o.handle, nil, opts...)
			require.NoError(t, err)
			r := start(t, c)
			waitFor(t, 20*time.Second, "every cold record handled", func() bool { return o.count("cold") == cold })
			if shaping {
				waitFor(t, 10*time.Second, "the hot record parked", func() bool { return c.Stats().Parked == 1 })
			}
			require.NoError(t, r.stop(t))
			assert.Zero(t, o.count("hot"), "the hot record waits for its tenant's permit")
			assert.Empty(t, o.reorders)
			if shaping {
				assert.Equal(t, []int64{cold + 1}, committed(t, kc, "g", "in", 1), "the commit passed the parked record")
			} else {
				assert.Equal(t, []int64{0}, committed(t, kc, "g", "in", 1), "the hot record keeps the watermark")
			}
		})
	}
}

// overlap is a throttle.Observer that keeps when each Acquire began and
// ended, to tell how many were outstanding at once.
type overlap struct {
	mu    sync.Mutex
	spans [][2]time.Time
}

func (o *overlap) Acquired(_ string, _ int64, waited time.Duration, _ error) {
	end := time.Now()
	o.mu.Lock()
	o.spans = append(o.spans, [2]time.Time{end.Add(-waited), end})
	o.mu.Unlock()
}
func (o *overlap) BucketCall(string, throttle.Decision, time.Duration, error) {}
func (o *overlap) Degraded(string, string, bool, error)                       {}

// most returns the most Acquire calls outstanding at once.
func (o *overlap) most() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	type ev struct {
		at time.Time
		d  int
	}
	var evs []ev
	for _, s := range o.spans {
		evs = append(evs, ev{s[0], 1}, ev{s[1], -1})
	}
	slices.SortFunc(evs, func(a, b ev) int { return cmp.Or(a.at.Compare(b.at), a.d-b.d) })
	n, top := 0, 0
	for _, e := range evs {
		n += e.d
		top = max(top, n)
	}
	return top
}

// The point of WithFairness: a backlog does not queue inside the limiter.
// Without it, every worker waits in Acquire (the control: far more than
// 8 at once); with it, an instance keeps at most 8 requests outstanding,
// and the records wait in the scheduler, where each permit's record is
// chosen when it comes.
func TestFairnessKeepsFewPermitRequestsOutstanding(t *testing.T) {
	t.Parallel()
	for _, fairness := range []bool{true, false} {
		t.Run(fmt.Sprint("fairness=", fairness), func(t *testing.T) {
			t.Parallel()
			const parts, perPart = 2, 150
			kc := kafkaenv.New(t, kafkaenv.Topic("in", parts))
			produce(t, kc, "in", parts, perPart, func(p int32, i int) string { return fmt.Sprintf("A-%d.%d", p, i) })
			h := newHandled(parts * perPart)
			obs := &overlap{}
			b, err := throttle.NewLocal(20, 100*time.Millisecond)
			require.NoError(t, err)
			lim := throttle.New(b, throttle.WithObserver(obs), throttle.WithLogger(testLogger()))
			opts := append(base(kc, "g", "in"), consumer.WithMaxInFlight(64))
			if fairness {
				opts = append(opts, consumer.WithFairness(tenantOfKey))
			}
			c, err := consumer.New(h.handler("c"), lim, opts...)
			require.NoError(t, err)
			r := start(t, c)
			h.waitFull(t, 30*time.Second)
			require.NoError(t, r.stop(t))
			if fairness {
				assert.LessOrEqual(t, obs.most(), 8)
			} else {
				assert.Greater(t, obs.most(), 32, "control: the workers wait in Acquire")
			}
		})
	}
}

// While the limiter paces every grant (here each is a reservation 5 ms
// ahead, so every grant takes about as long as the last), an instance
// keeps one permit request outstanding: more would only hold places in a
// row, and leave the other instances of the group without a grant
// meanwhile (an urgent record that comes there waits for them). It took
// how long a grant took for the limiter's word, so grants paced alike
// counted as unpaced and it kept up to 8.
func TestFairnessKeepsOnePermitRequestWhileTheLimiterPaces(t *testing.T) {
	t.Parallel()
	const parts, perPart = 2, 40
	kc := kafkaenv.New(t, kafkaenv.Topic("in", parts))
	produce(t, kc, "in", parts, perPart, func(p int32, i int) string { return fmt.Sprintf("A-%d.%d", p, i) })
	h := newHandled(parts * perPart)
	obs := &overlap{}
	lim := throttle.New(reserving{delay: 5 * time.Millisecond}, throttle.WithObserver(obs), throttle.WithLogger(testLogger()))
	c, err := consumer.New(h.handler("c"), lim, append(base(kc, "g", "in"), consumer.WithMaxInFlight(64), consumer.WithFairness(tenantOfKey))...)
	require.NoError(t, err)
	r := start(t, c)
	h.waitFull(t, 30*time.Second)
	require.NoError(t, r.stop(t))
	assert.Equal(t, 1, obs.most(), "permit requests outstanding at once while every grant is paced")
}

// reserving is a Bucket that grants every permit as a reservation delay
// ahead: the Limiter paces every grant.
type reserving struct{ delay time.Duration }

func (b reserving) Take(context.Context, string, int64, time.Duration) (throttle.Decision, error) {
	return throttle.Decision{Granted: true, Delay: b.delay}, nil
}

// WithConcurrency under WithFairness: the permit requests take the slot
// first, and the record the permit goes to holds it through its call, so
// calls never exceed the cap, and every record is handled; at shutdown
// the slots all come back.
func TestFairnessKeepsTheConcurrencyCap(t *testing.T) {
	t.Parallel()
	const parts, perPart, capacity = 3, 40, 2
	kc := kafkaenv.New(t, kafkaenv.Topic("in", parts))
	produce(t, kc, "in", parts, perPart, func(p int32, i int) string { return fmt.Sprintf("%c-%d.%d", 'A'+i%3, p, i%5) })
	slots, err := throttle.NewLocalSlots(capacity)
	require.NoError(t, err)
	h := newHandled(parts * perPart)
	var f inFlight
	c, err := consumer.New(f.handler(2*time.Millisecond, h, "a"), limiter(t, 100000, time.Second),
		append(base(kc, "g", "in"), consumer.WithConcurrency(slots), consumer.WithFairness(tenantOfKey))...)
	require.NoError(t, err)
	r := start(t, c)
	h.waitFull(t, 15*time.Second)
	require.NoError(t, r.stop(t))
	assert.LessOrEqual(t, f.most.Load(), int64(capacity), "most handler calls at once")
	for range capacity {
		_, err := slots.Hold(context.Background(), "", 0)
		require.NoError(t, err, "every slot came back")
	}
}

// WithPermitWait holds under WithFairness: the permit request waits at
// most the wait, and its timeout is the permit timeout of the record
// whose turn it was, handled by the policy (TimeoutFail: a failed
// attempt, and without retries or a dead-letter topic, Run stops).
func TestFairnessPermitTimeoutGoesToTheRecordWhoseTurnItWas(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, 3, func(_ int32, i int) string { return fmt.Sprint("A-", i) })
	lim := limiter(t, 1, time.Hour)
	require.NoError(t, lim.Acquire(context.Background(), 0)) // spent: none for an hour
	h := newHandled(1)
	c, err := consumer.New(h.handler("a"), lim, append(base(kc, "g", "in"), consumer.WithFairness(tenantOfKey),
		consumer.WithPermitWait(100*time.Millisecond, consumer.TimeoutFail), consumer.WithRetry(1, time.Millisecond, time.Millisecond),
		// One worker: the next request's timeout waits for it, so the
		// first record's failure stops Run before the second record's
		// can (with a worker each, the two failures raced to Run).
		consumer.WithMaxInFlight(1))...)
	require.NoError(t, err)
	err = start(t, c).wait(t, 10*time.Second)
	var herr *consumer.HandlerError
	require.ErrorAs(t, err, &herr)
	assert.ErrorIs(t, herr, throttle.ErrTimeout)
	assert.EqualValues(t, 0, herr.Offset, "the first record's turn")
	assert.Empty(t, h.snapshot())
	assert.Positive(t, c.Stats().PermitTimeouts)
}

// Every ordering keeps its promise under WithFairness: calls of one unit
// (key, partition) never overlap and come in offset order, and every
// record is handled and committed once.
func TestFairnessKeepsEveryOrdering(t *testing.T) {
	t.Parallel()
	const parts, perPart = 2, 90
	for _, tt := range []struct {
		ordering consumer.Ordering
		unit     func(*kgo.Record) string
	}{
		{consumer.ByKey, func(r *kgo.Record) string { return string(r.Key) }},
		{consumer.ByPartition, func(*kgo.Record) string { return "" }},
		{consumer.Unordered, func(r *kgo.Record) string { return fmt.Sprint(r.Offset) }},
	} {
		t.Run(tt.ordering.String(), func(t *testing.T) {
			t.Parallel()
			kc := kafkaenv.New(t, kafkaenv.Topic("in", parts))
			produce(t, kc, "in", parts, perPart, func(p int32, i int) string { return fmt.Sprintf("%c-%d", 'A'+i%3, i%4) })
			o := newOrderLog(tt.unit)
			h := newHandled(parts * perPart)
			handler := o.handler(time.Millisecond)
			c, err := consumer.New(func(ctx context.Context, rec *kgo.Record) error {
				err := handler(ctx, rec)
				h.add("c", rec)
				return err
			}, limiter(t, 20, 10*time.Millisecond), append(base(kc, "g", "in"), consumer.WithOrdering(tt.ordering), consumer.WithFairness(tenantOfKey))...)
			require.NoError(t, err)
			r := start(t, c)
			h.waitFull(t, 20*time.Second)
			require.NoError(t, r.stop(t))
			assert.Empty(t, o.overlaps)
			assert.Empty(t, o.reorders)
			assert.Equal(t, []int64{perPart, perPart}, committed(t, kc, "g", "in", parts))
		})
	}
}

// Stats.PermitWait counts under WithFairness the time records wait in
// the scheduler for their permit: three records at one permit per
// 100 ms wait 0, 100 and 200 ms (250 ms at least in all, for slack).
func TestFairnessCountsTheWaitForAPermitInStats(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, 3, func(_ int32, i int) string { return fmt.Sprint("A-", i) })
	h := newHandled(3)
	c, err := consumer.New(h.handler("a"), limiter(t, 1, 100*time.Millisecond),
		append(base(kc, "g", "in"), consumer.WithFairness(tenantOfKey))...)
	require.NoError(t, err)
	r := start(t, c)
	h.waitFull(t, 10*time.Second)
	require.NoError(t, r.stop(t))
	assert.GreaterOrEqual(t, c.Stats().PermitWait, 250*time.Millisecond)
}

// Stats under WithFairness: records queued for their permit count as
// waiting, and so does their partition.
func TestFairnessCountsQueuedRecordsAsWaitingInStats(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, 3, func(_ int32, i int) string { return fmt.Sprint("A-", i) })
	h := newHandled(1)
	c, err := consumer.New(h.handler("a"), limiter(t, 1, time.Hour), // one permit, then none for an hour
		append(base(kc, "g", "in"), consumer.WithFairness(tenantOfKey))...)
	require.NoError(t, err)
	r := start(t, c)
	h.waitFull(t, 10*time.Second)
	require.Eventually(t, func() bool { return c.Stats().WaitingRecords == 2 }, 10*time.Second, time.Millisecond)
	s := c.Stats()
	assert.Equal(t, 1, s.Waiting, "partitions with a record waiting")
	require.Len(t, s.Partitions, 1)
	assert.True(t, s.Partitions[0].Waiting)
	require.NoError(t, r.stop(t))
	assert.Zero(t, c.Stats().WaitingRecords)
}

// One worker, a concurrency cap of one and every record failing its first
// call: each retry waits in the scheduler for a permit while fresh
// records of other tenants wait for the one worker, and still every
// record is handled once its retry comes.
func TestFairnessWithOneWorkerAndRetriesHandlesEveryRecord(t *testing.T) {
	t.Parallel()
	const parts, perPart = 2, 15
	kc := kafkaenv.New(t, kafkaenv.Topic("in", parts))
	produce(t, kc, "in", parts, perPart, func(p int32, i int) string { return fmt.Sprintf("%c-%d.%d", 'A'+i%3, p, i) })
	slots, err := throttle.NewLocalSlots(1)
	require.NoError(t, err)
	h := newHandled(parts * perPart)
	var failed sync.Map
	handler := func(ctx context.Context, rec *kgo.Record) error {
		if _, again := failed.LoadOrStore(fmt.Sprint(rec.Partition, "/", rec.Offset), true); !again {
			return fmt.Errorf("first call of %s fails", rec.Key)
		}
		h.add("a", rec)
		return nil
	}
	c, err := consumer.New(handler, limiter(t, 1000, time.Second),
		append(base(kc, "g", "in"), consumer.WithMaxInFlight(1), consumer.WithConcurrency(slots),
			consumer.WithRetry(3, time.Millisecond, time.Millisecond), consumer.WithFairness(tenantOfKey))...)
	require.NoError(t, err)
	r := start(t, c)
	h.waitFull(t, 20*time.Second)
	require.NoError(t, r.stop(t))
	_, err = slots.Hold(context.Background(), "", 0)
	assert.NoError(t, err, "the slot came back")
}

// UrgentReserve: an urgent record is handled while the shared limit is
// spent (the next shared permit is minutes away), on a permit of the
// reserve, and its handler's context holds that permit as the shared
// budget's (a Transport on the shared Limiter, here an Acquire that may
// not wait, takes no second one). Normal records never take the
// reserve's permits: the shared limit's 10 are all they get.
func TestFairnessUrgentReserveServesUrgentRecordsWhileTheSharedLimitIsSpent(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, 30, func(_ int32, i int) string { return fmt.Sprintf("A-%d", i%5) })
	shared, reserve := limiter(t, 10, time.Hour), limiter(t, 3, time.Hour)
	var mu sync.Mutex
	count := map[string]int{}
	var unpaid []string // records whose call found no permit in its context
	handle := func(ctx context.Context, r *kgo.Record) error {
		err := shared.Acquire(ctx, 0)
		mu.Lock()
		defer mu.Unlock()
		count[tenantOfKey(r)]++
		if err != nil {
			unpaid = append(unpaid, string(r.Key))
		}
		return nil
	}
	counted := func(tenant string, n int) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return count[tenant] == n }
	}
	isUrgent := func(r *kgo.Record) bool { return tenantOfKey(r) == "U" }
	c, err := consumer.New(handle, shared, append(base(kc, "g", "in"),
		consumer.WithFairness(tenantOfKey, consumer.Urgent(isUrgent, 0.5), consumer.UrgentReserve(reserve)))...)
	require.NoError(t, err)
	r := start(t, c)
	waitFor(t, 20*time.Second, "the shared limit's 10 permits used", counted("A", 10))
	produce(t, kc, "in", 1, 2, func(_ int32, i int) string { return fmt.Sprintf("U-%d", i) })
	waitFor(t, 20*time.Second, "both urgent records handled while the shared limit is spent", counted("U", 2))
	require.NoError(t, r.stop(t))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 10, count["A"], "normal records take no permit of the reserve")
	assert.Empty(t, unpaid, "every call's context held its permit")
}

// UrgentReserve is a part of the provider's limit beside the Limiter
// given to New: New refuses that same Limiter (a key of it would be a
// second whole limit), and a reserve with WithLimiterFor's budgets.
func TestUrgentReserveRefusesTheSharedLimiterAndWithLimiterFor(t *testing.T) {
	shared := limiter(t, 10, time.Second)
	isUrgent := func(*kgo.Record) bool { return true }
	for name, opts := range map[string][]consumer.Option{
		"the shared Limiter": {consumer.WithFairness(tenantOfKey, consumer.Urgent(isUrgent, 0.5), consumer.UrgentReserve(shared))},
		"WithLimiterFor": {
			consumer.WithFairness(tenantOfKey, consumer.Urgent(isUrgent, 0.5), consumer.UrgentReserve(limiter(t, 1, time.Second))),
			consumer.WithLimiterFor(func(r *kgo.Record) throttle.Keyed { return shared.Key(string(r.Key)) }),
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := consumer.New(func(context.Context, *kgo.Record) error { return nil }, shared,
				append(opts, consumer.WithKafka(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("in")))...)
			require.ErrorIs(t, err, throttle.ErrInvalid)
			assert.Contains(t, err.Error(), "UrgentReserve")
		})
	}
}

// grantCounter is a throttle.Observer that counts the permits granted.
type grantCounter struct {
	mu sync.Mutex
	n  int64
}

func (o *grantCounter) Acquired(_ string, n int64, _ time.Duration, err error) {
	if err == nil {
		o.mu.Lock()
		o.n += n
		o.mu.Unlock()
	}
}
func (o *grantCounter) BucketCall(string, throttle.Decision, time.Duration, error) {}
func (o *grantCounter) Degraded(string, string, bool, error)                       {}
func (o *grantCounter) count() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}

// observed returns a Limiter of limit permits per interval that tells o.
func observed(t *testing.T, limit int64, interval time.Duration, o throttle.Observer) *throttle.Limiter {
	t.Helper()
	b, err := throttle.NewLocal(limit, interval)
	require.NoError(t, err)
	return throttle.New(b, throttle.WithObserver(o), throttle.WithLogger(testLogger()))
}

// UrgentReserve: an urgent record the reserve serves takes no permit of
// the shared limiter besides: one permit per record, even when no other
// record is there to take a shared permit asked for it.
func TestFairnessUrgentRecordServedByTheReserveTakesNoSharedPermit(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	var sharedGrants, reserveGrants grantCounter
	shared, reserve := observed(t, 100, time.Hour, &sharedGrants), observed(t, 100, time.Hour, &reserveGrants)
	var mu sync.Mutex
	handled := 0
	handle := func(context.Context, *kgo.Record) error {
		mu.Lock()
		handled++
		mu.Unlock()
		return nil
	}
	c, err := consumer.New(handle, shared, append(base(kc, "g", "in"),
		consumer.WithFairness(tenantOfKey, consumer.Urgent(func(*kgo.Record) bool { return true }, 0.5), consumer.UrgentReserve(reserve)))...)
	require.NoError(t, err)
	r := start(t, c)
	const n = 5
	for i := range n {
		produce(t, kc, "in", 1, 1, func(int32, int) string { return fmt.Sprintf("U-%d", i) })
		waitFor(t, 20*time.Second, "the urgent record handled", func() bool { mu.Lock(); defer mu.Unlock(); return handled == i+1 })
	}
	require.NoError(t, r.stop(t))
	assert.Equal(t, int64(n), reserveGrants.count(), "the reserve served every urgent record")
	assert.Zero(t, sharedGrants.count(), "no shared permit was taken for a record the reserve served")
}

// UrgentReserve: a reserve that refuses every time (its part spent) loses
// no urgent record: each one, refused, takes a shared permit, also when
// it is the only record there.
func TestFairnessUrgentRecordsTakeSharedPermitsWhileTheReserveRefuses(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	var sharedGrants, reserveGrants grantCounter
	shared, reserve := observed(t, 100, time.Hour, &sharedGrants), observed(t, 1, time.Hour, &reserveGrants)
	require.NoError(t, reserve.Acquire(context.Background(), 0)) // the reserve's part is spent
	h := newHandled(0)
	c, err := consumer.New(h.handler("c"), shared, append(base(kc, "g", "in"),
		consumer.WithFairness(tenantOfKey, consumer.Urgent(func(*kgo.Record) bool { return true }, 0.5), consumer.UrgentReserve(reserve)))...)
	require.NoError(t, err)
	r := start(t, c)
	const n = 3
	for i := range n {
		produce(t, kc, "in", 1, 1, func(int32, int) string { return fmt.Sprintf("U-%d", i) })
		waitFor(t, 20*time.Second, "the urgent record handled", func() bool { return len(h.snapshot()) == i+1 })
	}
	require.NoError(t, r.stop(t))
	assert.Equal(t, int64(n), sharedGrants.count(), "each record took a shared permit")
	assert.Equal(t, int64(1), reserveGrants.count(), "the reserve granted none but the one taken before")
}

// UrgentReserve with no Limiter given to New is refused: the urgent
// records would take no permit but the reserve's (none at all without
// WithConcurrency), and the handler's calls, taking their own, would be
// charged twice for each reserve permit.
func TestUrgentReserveRefusesANilLimiterGivenToNew(t *testing.T) {
	isUrgent := func(*kgo.Record) bool { return true }
	slots, err := throttle.NewLocalSlots(1)
	require.NoError(t, err)
	for name, opts := range map[string][]consumer.Option{
		"alone":                nil,
		"with WithConcurrency": {consumer.WithConcurrency(slots)},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := consumer.New(func(context.Context, *kgo.Record) error { return nil }, nil,
				append(opts, consumer.WithFairness(tenantOfKey, consumer.Urgent(isUrgent, 0.5), consumer.UrgentReserve(limiter(t, 1, time.Second))),
					consumer.WithKafka(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("in")))...)
			require.ErrorIs(t, err, throttle.ErrInvalid)
			assert.Contains(t, err.Error(), "UrgentReserve")
		})
	}
}

// hungBucket is a bucket whose store never answers: Take returns a store
// failure only when its context ends.
type hungBucket struct{}

func (hungBucket) Take(ctx context.Context, _ string, _ int64, _ time.Duration) (throttle.Decision, error) {
	<-ctx.Done()
	return throttle.Decision{}, &throttle.BackendError{Op: "take", Err: ctx.Err()}
}

// UrgentReserve: a reserve whose store hangs (each answer cut by its
// store timeout, then refused by its failure policy) holds up the
// urgent records for no longer than its answers: each takes a shared
// permit, and the consumer stops with no goroutine left (goleak).
func TestFairnessUrgentRecordsTakeSharedPermitsWhileTheReservesStoreHangs(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 2))
	var sharedGrants grantCounter
	shared := observed(t, 100, time.Hour, &sharedGrants)
	reserve := throttle.New(hungBucket{}, throttle.WithFailurePolicy(throttle.FailClosed), throttle.WithLogger(testLogger()))
	h := newHandled(20)
	isUrgent := func(r *kgo.Record) bool { return tenantOfKey(r) == "U" }
	c, err := consumer.New(h.handler("c"), shared, append(base(kc, "g", "in"),
		consumer.WithFairness(tenantOfKey, consumer.Urgent(isUrgent, 0.5), consumer.UrgentReserve(reserve)))...)
	require.NoError(t, err)
	r := start(t, c)
	produce(t, kc, "in", 2, 10, func(p int32, i int) string { return fmt.Sprintf("%s-%d-%d", []string{"U", "A"}[i%2], p, i) })
	h.waitFull(t, 30*time.Second)
	require.NoError(t, r.stop(t))
	assert.Equal(t, int64(20), sharedGrants.count(), "each record took a shared permit")
}

// warnCounter is a slog.Handler that counts the warnings whose message
// holds a word.
type warnCounter struct {
	word string
	mu   *sync.Mutex
	n    *int
}

func (w warnCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w warnCounter) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, w.word) {
		w.mu.Lock()
		*w.n++
		w.mu.Unlock()
	}
	return nil
}
func (w warnCounter) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w warnCounter) WithGroup(string) slog.Handler      { return w }

// UrgentReserve: a reserve that fails (here a Limiter misconfigured, whose
// every call is refused as invalid) is no silent loss of the urgent
// records' part: the consumer warns, once while it keeps failing, and the
// urgent records take shared permits.
func TestFairnessWarnsOnceWhileTheReserveFails(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	var mu sync.Mutex
	warned := 0
	log := slog.New(warnCounter{word: "UrgentReserve", mu: &mu, n: &warned})
	b, err := throttle.NewLocal(100, time.Hour)
	require.NoError(t, err)
	reserve := throttle.New(b, throttle.WithFailurePolicy(throttle.FailurePolicy(99)), throttle.WithLogger(testLogger()))
	h := newHandled(10)
	c, err := consumer.New(h.handler("c"), limiter(t, 100, time.Hour), append(base(kc, "g", "in"), consumer.WithLogger(log),
		consumer.WithFairness(tenantOfKey, consumer.Urgent(func(*kgo.Record) bool { return true }, 0.5), consumer.UrgentReserve(reserve)))...)
	require.NoError(t, err)
	r := start(t, c)
	produce(t, kc, "in", 1, 10, func(_ int32, i int) string { return fmt.Sprintf("U-%d", i) })
	h.waitFull(t, 20*time.Second)
	require.NoError(t, r.stop(t))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 1, warned, "one warning while the reserve fails")
}

// WithFairness shares permits or calls in flight among tenants: with
// neither (a nil Limiter, no WithLimiterFor, no WithConcurrency) it would
// do nothing, and New says so rather than run every record at once.
func TestFairnessWithNothingToShareIsRefused(t *testing.T) {
	kafka := consumer.WithKafka(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("in"))
	h := func(context.Context, *kgo.Record) error { return nil }
	_, err := consumer.New(h, nil, kafka, consumer.WithFairness(tenantOfKey))
	require.ErrorIs(t, err, throttle.ErrInvalid)
	assert.Contains(t, err.Error(), "WithFairness")

	slots, err := throttle.NewLocalSlots(1)
	require.NoError(t, err)
	c, err := consumer.New(h, nil, kafka, consumer.WithFairness(tenantOfKey), consumer.WithConcurrency(slots))
	require.NoError(t, err, "calls in flight are shared")
	require.NotNil(t, c)
	c, err = consumer.New(h, nil, kafka, consumer.WithFairness(tenantOfKey),
		consumer.WithLimiterFor(func(r *kgo.Record) throttle.Keyed { return limiter(t, 10, time.Second).Key("") }))
	require.NoError(t, err, "permits of WithLimiterFor's budgets are shared")
	require.NotNil(t, c)
}
