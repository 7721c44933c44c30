package consumer_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
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

// A record whose key the budget refuses does not stop the consumer. One
// record in 1,000 has a 600-byte key (bucket.MaxKeyLen is 512); each
// record draws from its key's budget of a Redis token bucket, under a
// cap of handler calls in flight per key (bucket.Concurrency), or under
// the budget alone. Every other record is handled, each long-key record
// goes to the dead-letter topic with the refusal in its headers, Run
// keeps running, and everything is committed.
func TestRecordWithARefusedKeyIsDeadLettered(t *testing.T) {
	t.Parallel()
	for _, withCap := range []bool{true, false} {
		t.Run(fmt.Sprintf("concurrency=%v", withCap), func(t *testing.T) {
			t.Parallel()
			const parts = 2
			long := strings.Repeat("x", 600)
			kc := kafkaenv.New(t, kafkaenv.Topic("in", parts), kafkaenv.Topic("dlt", 1))
			rs := redisenv.New(t)
			// The in-process stand-in runs each script in a fresh Lua
			// interpreter (about 0.3 ms, several under -race): with the
			// cap's scripts, 2,000 records a partition took it the whole
			// 30 s. Half of them keep the test's point there.
			perPart := 2000
			if !rs.Real() {
				perPart = 1000
			}
			produce(t, kc, "in", parts, perPart, func(_ int32, i int) string {
				if i%1000 == 500 {
					return long
				}
				return fmt.Sprint("tenant-", i%20)
			})
			refused := parts * perPart / 1000

			tb, err := bucket.NewTokenBucket(rs.Client(), "tenants", 1_000_000, time.Second)
			require.NoError(t, err)
			lim := throttle.New(tb)
			t.Cleanup(func() { _ = lim.Close() })
			opts := append(base(kc, "g", "in"),
				consumer.WithDeadLetter("dlt"),
				consumer.WithLimiterFor(func(r *kgo.Record) throttle.Keyed { return lim.Key(string(r.Key)) }))
			if withCap {
				slots, err := bucket.NewConcurrency(rs.Client(), "calls", 8)
				require.NoError(t, err)
				t.Cleanup(func() { _ = slots.Close() })
				opts = append(opts, consumer.WithConcurrency(slots))
			}
			var mu sync.Mutex
			calls := map[string]int{}
			h := func(_ context.Context, rec *kgo.Record) error {
				mu.Lock()
				calls[fmt.Sprint(rec.Partition, "@", rec.Offset)]++
				mu.Unlock()
				return nil
			}
			c, err := consumer.New(h, nil, opts...)
			require.NoError(t, err)
			r := start(t, c)
			waitFor(t, 30*time.Second, "every record handled or dead-lettered", func() bool {
				s := c.Stats()
				return s.Handled+s.DeadLettered >= int64(parts*perPart)
			})
			select {
			case <-r.done:
				t.Fatalf("Run returned %v; want it running", r.err)
			default:
			}
			s := c.Stats()
			assert.EqualValues(t, parts*perPart-refused, s.Handled)
			assert.EqualValues(t, refused, s.DeadLettered)
			assert.EqualValues(t, refused, s.Refused)
			mu.Lock()
			for p := range parts {
				for o := range perPart {
					want := 1
					if o%1000 == 500 {
						want = 0
					}
					if n := calls[fmt.Sprint(p, "@", o)]; n != want {
						t.Errorf("record %d@%d handled %d times, want %d", p, o, n, want)
					}
				}
			}
			mu.Unlock()

			dead := readAll(t, kc, "dlt", refused)
			require.Len(t, dead, refused)
			for _, d := range dead {
				hd := headers(d)
				off, err := strconv.Atoi(hd[consumer.HeaderOffset])
				require.NoError(t, err)
				assert.Equal(t, 500, off%1000, "dead-lettered offset")
				assert.Equal(t, long, string(d.Key))
				assert.Contains(t, hd[consumer.HeaderError], "(600 bytes)", "the refusal's cause")
				assert.Contains(t, hd[consumer.HeaderError], "must be at most 512 bytes")
				assert.Equal(t, "1", hd[consumer.HeaderAttempts])
			}
			require.NoError(t, r.stop(t))
			assert.Equal(t, []int64{int64(perPart), int64(perPart)}, committed(t, kc, "g", "in", parts))
		})
	}
}
