package consumer_test

import (
	"context"
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

// inFlight counts, by itself, the handler calls running at once.
type inFlight struct{ now, most, calls atomic.Int64 }

func (f *inFlight) handler(work time.Duration, h *handled, who string) consumer.Handler {
	return func(ctx context.Context, rec *kgo.Record) error {
		n := f.now.Add(1)
		for m := f.most.Load(); n > m && !f.most.CompareAndSwap(m, n); m = f.most.Load() {
		}
		time.Sleep(work) // the provider's call
		f.calls.Add(1)
		f.now.Add(-1)
		h.add(who, rec)
		return nil
	}
}

// Two consumer instances of one group, each with its own Redis client and
// Concurrency, never run more handler calls at once than the cap, counted
// in the handler; every record is handled.
func TestConcurrencyCapsTheFleetsHandlerCalls(t *testing.T) {
	t.Parallel()
	const parts, perPart, capacity = 4, 25, 3
	kc := kafkaenv.New(t, kafkaenv.Topic("calls", parts))
	rs := redisenv.New(t)
	produce(t, kc, "calls", parts, perPart, nil)

	h := newHandled(parts * perPart)
	var f inFlight
	for _, who := range []string{"a", "b"} {
		slots, err := bucket.NewConcurrency(rs.Client(), "provider", capacity)
		require.NoError(t, err)
		t.Cleanup(func() { _ = slots.Close() })
		opts := append(base(kc, "g", "calls"), consumer.WithOrdering(consumer.Unordered), consumer.WithConcurrency(slots))
		c, err := consumer.New(f.handler(2*time.Millisecond, h, who), limiter(t, 100000, time.Second), opts...)
		require.NoError(t, err)
		start(t, c)
	}
	h.waitFull(t, 15*time.Second)
	assert.GreaterOrEqual(t, f.calls.Load(), int64(parts*perPart))
	m := f.most.Load()
	assert.LessOrEqual(t, m, int64(capacity), "most handler calls at once")
	assert.GreaterOrEqual(t, m, int64(1))
}

// A record takes its slot before its permit: while every slot is held
// elsewhere its permit stays unspent; once it holds the slot and waits for
// a permit, stopping the consumer gives the slot back. (The fleet test
// above shows the slot coming back when the handler returns: its records
// outnumber the slots.)
func TestConcurrencySlotBeforePermitAndBackWhenThePermitFails(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("one", 1))
	produce(t, kc, "one", 1, 1, nil)
	slots, err := throttle.NewLocalSlots(1)
	require.NoError(t, err)
	ctx := context.Background()
	taken, err := slots.Hold(ctx, "", 0)
	require.NoError(t, err)

	lim := limiter(t, 1, time.Hour, throttle.WithLocalBurst(1)) // a single permit
	h := newHandled(1)
	c, err := consumer.New(h.handler("a"), lim, append(base(kc, "g", "one"), consumer.WithConcurrency(slots))...)
	require.NoError(t, err)
	r := start(t, c)
	require.Eventually(t, func() bool { return c.Stats().Waiting > 0 }, 10*time.Second, time.Millisecond, "the record waits for its slot")
	require.NoError(t, lim.Acquire(ctx, 0), "the permit was spent while the record waited for its slot")
	taken()
	// The record now holds the slot and waits for a permit that does not come.
	require.Eventually(t, func() bool {
		rel, err := slots.Hold(ctx, "", 0)
		if err != nil {
			return true
		}
		rel()
		return false
	}, 10*time.Second, time.Millisecond, "the record takes the slot")
	require.NoError(t, r.stop(t))
	assert.Empty(t, h.snapshot(), "handled without a permit")
	rel, err := slots.Hold(ctx, "", 0)
	require.NoError(t, err, "the slot of a record whose permit wait ended")
	rel()
}
