package headway_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/provider"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// TestFleetStartingOnAUsedKeyStaysUnderTheLimit: two fleets,
// one after the other, on one token bucket key. The first trickles (two
// calls) and stops; the second starts halfway through the period the
// first began, with a crowd of callers. The provider counts arrivals: at
// most the limit in any span of one interval, as with a fresh key. Before,
// the second fleet took the period's eight tokens left at once, their
// places in the period passed, and the next period's first grants met
// them: 14 arrivals in one second.
func TestFleetStartingOnAUsedKeyStaysUnderTheLimit(t *testing.T) {
	const (
		limit    = 10
		interval = time.Second
		// jitter is how late a call may reach the provider after its
		// place (HTTP on loopback, a busy 2-core machine under -race: the
		// pipeline's provider allows 50 ms too): the windows counted are
		// this much shorter than the interval. The fault this test is
		// for puts 14 calls in one second.
		jitter = 50 * time.Millisecond
	)
	rs := redisenv.New(t)
	// The provider only counts: it accepts far more than the limit.
	prov, err := provider.Start(provider.Config{Limit: 100 * limit, Interval: interval, Policy: provider.Sliding})
	require.NoError(t, err)
	t.Cleanup(func() { _ = prov.Close() })
	hc := &http.Client{Timeout: 5 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	ctx := context.Background()

	// fleet runs calls calls through instances instances of 8 workers,
	// each instance with its own Redis client and bucket.
	fleet := func(calls int) {
		jobs := make(chan int, calls)
		for i := range calls {
			jobs <- i
		}
		close(jobs)
		var wg sync.WaitGroup
		for range 2 {
			rdb := redis.NewClient(rs.ClientOptions())
			b, err := bucket.NewTokenBucket(rdb, "restart", limit, interval)
			require.NoError(t, err)
			lim := throttle.New(b)
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range jobs {
						if err := lim.Acquire(ctx, throttle.Forever); err != nil {
							t.Error(err)
							return
						}
						resp, err := hc.Get(prov.URL() + "/call")
						if err != nil {
							t.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}()
			}
			defer rdb.Close()
			defer lim.Close()
		}
		wg.Wait()
	}

	fleet(2)
	// The second fleet starts halfway through the first one's period,
	// on the Redis server's clock.
	rdb := rs.Client()
	for {
		left, err := rdb.PTTL(ctx, "headway:{restart}:tb").Result()
		require.NoError(t, err)
		require.Positive(t, left, "the first fleet's period is over")
		if left <= interval/2 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	fleet(14)

	arr := prov.Arrivals()
	require.Len(t, arr, 16)
	most, at := 0, time.Duration(0)
	for lo, hi := 0, 0; hi < len(arr); hi++ {
		for arr[hi].Sub(arr[lo]) >= interval-jitter {
			lo++
		}
		if hi-lo+1 > most {
			most, at = hi-lo+1, arr[lo].Sub(arr[0])
		}
	}
	var times []string
	for _, a := range arr {
		times = append(times, fmt.Sprint(a.Sub(arr[0]).Milliseconds()))
	}
	t.Logf("most arrivals in %v: %d; ms after the first: %v", interval-jitter, most, times)
	require.LessOrEqual(t, most, limit, "arrivals in %v from %v (ms after the first: %v)", interval-jitter, at, times)
}
