package bucket

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/guarantee"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// TestSentinelFailover: 4 instances × 8 greedy goroutines on a
// token bucket, each instance on its own go-redis failover client; the
// master is killed and the Sentinel promotes the replica. Counted per
// interval from the first grant, the fleet stays within the limit (+1 %)
// except what asynchronous replication can lose: the takes of the period
// running at the kill that had not reached the replica, at most one
// period's limit, in the interval of the failover. After it, the token
// bucket's own guarantee is checked (at most the limit per refill).
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-time fault test")
	}
	sen := redisenv.NewSentinel(t)
	const (
		limit     = 100
		interval  = 500 * time.Millisecond
		instances = 4
		workers   = 8
		maxWait   = 100 * time.Millisecond
	)
	var lims []*throttle.Limiter
	var bs []*common
	obs := &degradedObs{} // when the last degraded decision was made
	for range instances {
		o := sen.FailoverOptions()
		o.ReadTimeout, o.WriteTimeout, o.DialTimeout, o.PoolTimeout = 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond
		rdb := redis.NewFailoverClient(o)
		t.Cleanup(func() { rdb.Close() })
		tb, err := NewTokenBucket(rdb, "failover", limit, interval, WithHeartbeat(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, &tb.common)
		lims = append(lims, throttle.New(tb, throttle.WithObserver(obs)))
	}
	log := &grantLog{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var errs sync.Map
	for _, lim := range lims {
		for range workers {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					err := lim.Acquire(context.Background(), maxWait)
					now := guarantee.Now()
					switch {
					case err == nil:
						log.mu.Lock()
						log.at = append(log.at, now)
						log.mu.Unlock()
					case errors.Is(err, throttle.ErrTimeout):
						time.Sleep(time.Millisecond)
					default:
						errs.Store(err.Error(), true)
						time.Sleep(5 * time.Millisecond)
					}
				}
			})
		}
	}
	time.Sleep(5 * interval / 2)
	killedAt := time.Now()
	sen.Master().Close()
	// Wait for the promotion: the replica answers as a master.
	rc := redis.NewClient(&redis.Options{Addr: sen.Replica().Addr()})
	defer rc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		role, err := rc.Do(context.Background(), "ROLE").Slice()
		if err == nil && len(role) > 0 && role[0] == "master" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica was not promoted within 10 s")
		}
		time.Sleep(20 * time.Millisecond) // polls an outcome, bounded
	}
	promotedAt := time.Now()
	time.Sleep(6 * interval) // the clients find the new master ~1 s later; then 2 periods

	close(stop)
	wg.Wait()
	waitInflight(t, bs...)

	counts := log.perWindow(interval)
	kill, promoted := log.windowOf(killedAt, interval), log.windowOf(promotedAt, interval)
	n := 0
	errs.Range(func(any, any) bool { n++; return true })
	t.Logf("master killed in window %d, replica promoted %v later (window %d); grants per %v from the first: %v; %d distinct errors", kill, promotedAt.Sub(killedAt).Round(time.Millisecond), promoted, interval, counts, n)
	// The failover lasts until the last instance's client has found the
	// new master and its store answers again: the last decision its
	// failure policy made. Until the interval after that, local shares
	// and the promoted master's first periods may overlap (bound: twice
	// the limit, one period lost by asynchronous replication or granted
	// locally on top).
	over := promotedAt
	if last := time.Unix(0, obs.last.Load()); obs.last.Load() != 0 && last.After(over) {
		over = last
	}
	end := log.windowOf(over, interval) + 1
	t.Logf("degraded decisions: %d granted, %d refused, the last %v after the promotion", obs.granted.Load(), obs.refused.Load(), over.Sub(promotedAt).Round(time.Millisecond))
	for i, c := range counts {
		if i > end {
			break // checked by periods below
		}
		bound := limit + limit/100
		if i >= kill {
			bound = 2 * limit
		}
		if i > 0 && c > bound {
			t.Errorf("window %d: %d grants, limit %d, bound %d", i, c, limit, bound)
		}
	}
	// From then on the promoted master's periods start at whatever phase
	// its first refill gave them, so a window counted from the run's first
	// grant may hold the tail of one period and the start of the next.
	// What the token bucket guarantees, and what is checked, is its own:
	// at most the limit per refill, refills at least an interval apart,
	// counted independently from the grant times.
	post := log.since(over.Add(interval))
	r := guarantee.Periods(post, limit, interval, 5*time.Millisecond)
	t.Logf("after the failover: %v", r)
	if r.Violations > 0 {
		t.Errorf("after the failover: %s", r.Detail)
	}
}
