package consumer_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
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
)

// killSwitch is a kgo dialer whose connections can all be cut at once,
// after which it refuses to dial: to Kafka, the client's process has died
// (no LeaveGroup, no commit, no heartbeat).
type killSwitch struct {
	mu     sync.Mutex
	dead   bool
	conns  []net.Conn
	dialer net.Dialer
}

var errKilled = errors.New("test: the process was killed")

func (k *killSwitch) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dead {
		return nil, errKilled
	}
	c, err := k.dialer.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	k.conns = append(k.conns, c)
	return c, nil
}

func (k *killSwitch) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dead = true
	for _, c := range k.conns {
		_ = c.Close()
	}
	k.conns = nil
}

// A member that dies without committing (its connections cut, no
// LeaveGroup, no final commit) after handling some records: the group
// evicts it when its session times out, the member that takes over reads
// from the last commit, and so handles again every record the dead member
// handled. Nothing is lost.
func TestKilledMemberRecordsRedelivered(t *testing.T) {
	t.Parallel()
	const parts, perPart, firstBatch = 3, 50, 30
	kc := kafkaenv.New(t, kafkaenv.Topic("killed", parts))
	produce(t, kc, "killed", parts, perPart, nil)
	h := newHandled(parts * perPart)

	// A: firstBatch permits, then none for an hour; its client dials
	// through the kill switch and gives up on requests quickly once dead.
	ks := &killSwitch{}
	a, err := consumer.New(h.handler("a"), limiter(t, firstBatch, time.Hour),
		append(base(kc, "g", "killed"), consumer.WithKafka(
			kgo.Dialer(ks.DialContext),
			kgo.RetryTimeout(time.Second),
			kgo.RequestRetries(1),
		))...)
	require.NoError(t, err)
	ra := start(t, a)
	waitFor(t, 15*time.Second, "a handles its permits' worth", func() bool {
		return a.Stats().Handled == firstBatch && a.Stats().Waiting > 0
	})
	ks.kill()

	// B takes over once the group has evicted A (A's session: 1.5 s).
	b, err := consumer.New(h.handler("b"), limiter(t, 1000, 100*time.Millisecond), base(kc, "g", "killed")...)
	require.NoError(t, err)
	rb := start(t, b)
	h.waitFull(t, 30*time.Second)
	// B has handled every record, the dead member's included.
	waitFor(t, 10*time.Second, "b handles every record", func() bool {
		return b.Stats().Handled == parts*perPart
	})
	require.NoError(t, rb.stop(t))
	// A learns that its session is over and drops its partitions, with
	// their marks: its shutdown has nothing to commit, or fails to.
	t.Logf("the dead member's Run: %v", ra.stop(t))
	assert.EqualValues(t, firstBatch, a.Stats().Handled)

	byA, byB := map[[2]int64]bool{}, map[[2]int64]int{}
	for _, x := range h.snapshot() {
		k := [2]int64{int64(x.partition), x.offset}
		if x.who == "a" {
			byA[k] = true
		} else {
			byB[k]++
		}
	}
	assert.Len(t, byA, firstBatch, "a handled its permits' worth, once each")
	for k := range byA {
		assert.Equal(t, 1, byB[k], "record %v handled by the dead member is handled again by b, once", k)
	}
	assert.Len(t, byB, parts*perPart, "b handled every record")
	assert.Equal(t, []int64{perPart, perPart, perPart}, committed(t, kc, "g", "killed", parts))
}

// Broker faults while a consumer works: each is injected when part of the
// records is handled and lifted (or, for a removed broker, left) a while
// later. The consumer recovers by itself: every record is handled, each
// partition's first handlings in offset order, and the final commit covers
// everything.
func TestBrokerFaultsDuringConsumption(t *testing.T) {
	t.Parallel()
	const sessionOver = 2500 * time.Millisecond // > the 1.5 s session timeout
	tests := []struct {
		name string
		// inject starts the fault and returns how to lift it (nil: never)
		// and how many requests it has answered (nil: not counted).
		inject func(t *testing.T, fake *kfake.Cluster) (lift func(), hits func() int)
		hold   time.Duration
		// sameSession: the fault never ends the member's group session,
		// so no record may be handled twice.
		sameSession bool
	}{
		{
			name: "fetch fails with a storage error",
			inject: func(_ *testing.T, fake *kfake.Cluster) (func(), func() int) {
				h := fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Err: kerr.KafkaStorageError, Count: -1})
				return h.Remove, h.Hits
			},
			hold:        time.Second,
			sameSession: true,
		},
		{
			name: "commits fail while the coordinator is unavailable",
			inject: func(_ *testing.T, fake *kfake.Cluster) (func(), func() int) {
				h := fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: "g", Err: kerr.CoordinatorNotAvailable, Count: -1})
				return h.Remove, h.Hits
			},
			hold:        time.Second,
			sameSession: true,
		},
		{
			name: "heartbeats fail beyond the session timeout",
			inject: func(_ *testing.T, fake *kfake.Cluster) (func(), func() int) {
				h := fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Heartbeat}, Group: "g", Err: kerr.UnknownServerError, Count: -1})
				return h.Remove, h.Hits
			},
			hold: sessionOver,
		},
		{
			name: "connections to every broker dropped",
			inject: func(_ *testing.T, fake *kfake.Cluster) (func(), func() int) {
				var n atomic.Int64
				var lifted atomic.Bool
				fake.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
					if lifted.Load() {
						fake.DropControl()
						return nil, nil, false
					}
					fake.KeepControl()
					n.Add(1)
					return nil, errors.New("test: connection dropped"), true
				})
				return func() { lifted.Store(true) }, func() int { return int(n.Load()) }
			},
			hold: time.Second,
		},
		{
			name: "the group coordinator's broker is removed",
			inject: func(t *testing.T, fake *kfake.Cluster) (func(), func() int) {
				require.NoError(t, fake.RemoveNode(fake.CoordinatorFor("g")))
				return nil, nil
			},
			hold: sessionOver,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			const parts, perPart = 4, 100
			const total = parts * perPart
			kc := kafkaenv.New(t, kafkaenv.Brokers(3), kafkaenv.Topic("faults", parts))
			produce(t, kc, "faults", parts, perPart, nil)
			h := newHandled(total)
			// 200 records/s: the fault lands mid-way through the records.
			c, err := consumer.New(h.handler("c"), limiter(t, 20, 100*time.Millisecond),
				append(base(kc, "g", "faults"),
					consumer.WithQueueSize(16), consumer.WithPollSize(32),
					consumer.WithKafka(kgo.AutoCommitInterval(200*time.Millisecond)))...)
			require.NoError(t, err)
			r := start(t, c)

			waitFor(t, 15*time.Second, "a quarter of the records handled", func() bool {
				return c.Stats().Handled >= total/4
			})
			lift, hits := tt.inject(t, kc.Fake())
			time.Sleep(tt.hold)
			if lift != nil {
				lift()
			}
			if hits != nil {
				assert.Positive(t, hits(), "the fault answered no request: it tested nothing")
			}
			h.waitFull(t, 30*time.Second)
			require.NoError(t, r.stop(t), "Run after recovering")

			// First handlings per partition in offset order; duplicates
			// (redeliveries after a lost session) allowed and counted.
			next := map[int32]int64{}
			dups := 0
			for _, x := range h.snapshot() {
				switch {
				case x.offset == next[x.partition]:
					next[x.partition]++
				case x.offset < next[x.partition]:
					dups++
				default:
					t.Errorf("partition %d: offset %d handled before %d", x.partition, x.offset, next[x.partition])
				}
			}
			t.Logf("%s: %d records, %d handled twice", tt.name, total, dups)
			if tt.sameSession {
				assert.Zero(t, dups, "records handled twice though the session never ended")
			}
			assert.Equal(t, []int64{perPart, perPart, perPart, perPart}, committed(t, kc, "g", "faults", parts))
		})
	}
}

// waitFor polls cond every 10 ms until it holds, failing the test after d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
