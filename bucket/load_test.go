package bucket

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
)

// bucketCase is one bucket as the shared runner drives it.
type bucketCase struct {
	name string
	// build makes one instance on rdb; background, if any, runs beside
	// the load until its ctx ends (a Counter's Resetter).
	build func(rdb redis.UniversalClient, key string) (b throttle.Bucket, background func(context.Context) error, err error)
	// check is the bucket's guarantee, checked on the grants alone.
	check checker
	// rate is the sustained permits per second the guarantee allows.
	rate float64
}

const (
	loadClients    = 4
	loadGoroutines = 16
	// loadRun is 10.3 windows of 100 ms (5.15 periods of 200 ms): the
	// utilization figure does not hinge on whether one more period began
	// just before the end.
	loadRun = 1030 * time.Millisecond
	// tol is the measuring tolerance for refill spacing (our clock reads
	// the time on our side of the network).
	tol = 3 * time.Millisecond
)

func bucketCases() []bucketCase {
	// The period buckets (TokenBucket, Counter) start each period when the
	// first caller after its end arrives; under -race on a loaded 2-CPU
	// machine that can be 10 ms late, so they get 200 ms periods (a run
	// of 5.15 periods holds 5 whole ones even when each is 50 ms late).
	const ms100, ms200 = 100 * time.Millisecond, 200 * time.Millisecond
	tiers := []throttle.Tier{{Limit: 10, Period: ms100}, {Limit: 40, Period: 500 * time.Millisecond}}
	windows := []throttle.Tier{{Limit: 20, Period: ms100}, {Limit: 50, Period: 300 * time.Millisecond}}
	return []bucketCase{
		{
			name: "TokenBucket",
			build: func(rdb redis.UniversalClient, key string) (throttle.Bucket, func(context.Context) error, error) {
				b, err := NewTokenBucket(rdb, key, 40, ms200)
				return b, nil, err
			},
			check: checkSliding([]throttle.Tier{{Limit: 40, Period: ms200}}),
			rate:  200,
		},
		{
			name: "GCRA",
			build: func(rdb redis.UniversalClient, key string) (throttle.Bucket, func(context.Context) error, error) {
				b, err := NewGCRA(rdb, key, 20, ms100, WithBurst(5))
				return b, nil, err
			},
			check: checkGCRA(20, ms100, 5),
			rate:  200,
		},
		{
			name: "FixedWindow",
			build: func(rdb redis.UniversalClient, key string) (throttle.Bucket, func(context.Context) error, error) {
				b, err := NewFixedWindow(rdb, key, 20, ms100)
				return b, nil, err
			},
			check: checkWindows([]throttle.Tier{{Limit: 20, Period: ms100}}),
			rate:  200,
		},
		{
			name: "SlidingLog",
			build: func(rdb redis.UniversalClient, key string) (throttle.Bucket, func(context.Context) error, error) {
				b, err := NewSlidingLog(rdb, key, windows)
				return b, nil, err
			},
			check: checkSliding(windows),
			rate:  50.0 / 0.3,
		},
		{
			name: "Tiers",
			build: func(rdb redis.UniversalClient, key string) (throttle.Bucket, func(context.Context) error, error) {
				b, err := NewTiers(rdb, key, tiers)
				return b, nil, err
			},
			check: checkWindows(tiers),
			rate:  80,
		},
		{
			name: "Counter",
			build: func(rdb redis.UniversalClient, key string) (throttle.Bucket, func(context.Context) error, error) {
				b, err := NewCounter(rdb, key, 40, ms200, WithLeaderLease(300*time.Millisecond))
				if err != nil {
					return nil, nil, err
				}
				r, err := b.NewResetter("")
				if err != nil {
					return nil, nil, err
				}
				return b, r.Run, nil
			},
			check: checkPeriods(40, ms200, tol),
			rate:  200,
		},
	}
}

// recorder wraps a bucket and notes, on the test's clock, when each
// granted permit was decided, and which were given back (Decision.Cancel:
// their callers left before their time, and sent nothing).
type recorder struct {
	throttle.Bucket
	mu       sync.Mutex
	grants   []grant
	back     map[int]bool // indexes in grants given back
	errs     atomic.Int64
	firstErr atomic.Value
}

// sent returns the grants not given back.
func (r *recorder) sent() []grant {
	r.mu.Lock()
	defer r.mu.Unlock()
	var gs []grant
	for i, g := range r.grants {
		if !r.back[i] {
			gs = append(gs, g)
		}
	}
	return gs
}

func (r *recorder) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	lo := time.Now().UnixMicro()
	d, err := r.Bucket.Take(ctx, key, n, maxWait)
	hi := time.Now().UnixMicro()
	// A call cut off by its own deadline (the Limiter bounds each store
	// call by the caller's wait; under -race on 2 cores a cluster round
	// trip now and then outlasts it) is the time bound at work, not a
	// bucket failure: the Limiter answers it by its policy.
	if err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
		if r.errs.Add(1) == 1 {
			r.firstErr.Store(err.Error())
		}
	}
	if err == nil && d.Granted {
		delay := d.Delay.Microseconds()
		r.mu.Lock()
		first := len(r.grants)
		for range n {
			r.grants = append(r.grants, grant{lo: lo + delay, hi: hi + delay, decided: hi})
		}
		r.mu.Unlock()
		if cancel := d.Cancel; cancel != nil {
			d.Cancel = func(ctx context.Context) error {
				r.mu.Lock()
				if r.back == nil {
					r.back = make(map[int]bool)
				}
				for i := first; i < first+int(n); i++ {
					r.back[i] = true
				}
				r.mu.Unlock()
				return cancel(ctx)
			}
		}
	}
	return d, err
}

// loadResult is what one run saw.
type loadResult struct {
	grants     []grant // those not given back: sent
	placed     int64   // every grant, given back or not
	start, end int64   // µs: the load's run, for utilization
	origin     int64   // µs: before any instance existed, for the checks
	errs       int64
}

// runLoad drives loadClients instances of c (one per client) with
// loadGoroutines goroutines each, asking for permits through a
// throttle.Limiter for loadRun, and returns every grant. during, if set,
// runs in the middle of the run (a restart).
func runLoad(t *testing.T, c bucketCase, clients []redis.UniversalClient, key string, during func()) loadResult {
	t.Helper()
	bgCtx, bgCancel := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	defer func() { bgCancel(); bg.Wait() }()

	origin := time.Now().UnixMicro()
	var recs []*recorder
	var lims []*throttle.Limiter
	for _, rdb := range clients {
		b, background, err := c.build(rdb, key)
		if err != nil {
			t.Fatalf("build: %v", err)
		}
		rec := &recorder{Bucket: b}
		recs = append(recs, rec)
		lims = append(lims, throttle.New(rec))
		if background != nil {
			bg.Add(1)
			go func() {
				defer bg.Done()
				if err := background(bgCtx); err != nil {
					t.Errorf("background: %v", err)
				}
			}()
		}
	}
	// Warm the clients up (a cluster client loads its slot map and dials
	// every master) so that start-up does not count against the bucket.
	for _, rdb := range clients {
		warm(t, rdb)
	}
	ctx, cancel := context.WithTimeout(context.Background(), loadRun)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for _, lim := range lims {
		for range loadGoroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					err := lim.Acquire(ctx, throttle.Forever)
					switch {
					case err == nil, errors.Is(err, context.DeadlineExceeded), errors.Is(err, throttle.ErrTimeout):
					default:
						// A backend error (during a restart): back off a
						// little, as a real caller would.
						time.Sleep(5 * time.Millisecond)
					}
				}
			}()
		}
	}
	if during != nil {
		time.Sleep(loadRun / 2)
		during()
	}
	wg.Wait()
	end := time.Now()
	for _, lim := range lims {
		_ = lim.Close() // its give-backs done
	}
	res := loadResult{origin: origin, start: start.UnixMicro(), end: min(end.UnixMicro(), start.Add(loadRun).UnixMicro())}
	for _, r := range recs {
		res.grants = append(res.grants, r.sent()...)
		r.mu.Lock()
		res.placed += int64(len(r.grants))
		r.mu.Unlock()
		res.errs += r.errs.Load()
		if e := r.firstErr.Load(); e != nil {
			t.Logf("first error: %v", e)
		}
	}
	return res
}

// utilization is the grants made in the run over what the rate allows.
func (r loadResult) utilization(rate float64) float64 {
	n := 0
	for _, g := range r.grants {
		if g.at() <= r.end {
			n++
		}
	}
	return float64(n) / (rate * float64(r.end-r.start) / 1e6)
}

// TestGuarantees drives every bucket through the same runner: 4 clients ×
// 16 goroutines, demand far above the limit, on a single node and on a
// three-master cluster. An independent check of the grant times finds no
// violation of the bucket's guarantee, and the bucket grants: how much of
// the limit it uses is a figure of the load harness
// (internal/cmd/loadtest), not of a test on a machine of any speed.
func TestGuarantees(t *testing.T) {
	srv := redisenv.New(t)
	var cl *redisenv.Cluster
	if srv.Real() { // the stand-in runs the single-node half; Cluster has none
		cl = redisenv.NewCluster(t)
	}
	topologies := []struct {
		name    string
		clients func() []redis.UniversalClient
	}{
		{"single", func() []redis.UniversalClient {
			var cs []redis.UniversalClient
			for range loadClients {
				cs = append(cs, srv.Client())
			}
			return cs
		}},
		{"cluster", func() []redis.UniversalClient {
			var cs []redis.UniversalClient
			for range loadClients {
				cs = append(cs, cl.Client())
			}
			return cs
		}},
	}
	for _, c := range bucketCases() {
		for _, topo := range topologies {
			t.Run(c.name+"/"+topo.name, func(t *testing.T) {
				if topo.name == "cluster" && cl == nil {
					redisenv.NeedReal(t, srv, "Redis Cluster")
				}
				res := runLoad(t, c, topo.clients(), "load-"+c.name+"-"+topo.name, nil)
				if res.errs > 0 {
					t.Errorf("%d Take errors", res.errs)
				}
				if err := c.check(res.grants, res.origin); err != nil {
					t.Errorf("guarantee violated: %v", err)
				}
				u := res.utilization(c.rate)
				t.Logf("%d grants in %v, utilization %.1f%%", len(res.grants), time.Duration(res.end-res.start)*time.Microsecond, 100*u)
				if len(res.grants) == 0 {
					t.Error("no grant in the run")
				}
			})
		}
	}
}

// TestRestart restarts Redis (its data gone) in the middle of a run: the
// scripts are loaded again after NOSCRIPT, every bucket recovers, and the
// grants after the restart keep the guarantee on their own: no more than
// one fresh window's worth.
func TestRestart(t *testing.T) {
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "restarting")
	for _, c := range bucketCases() {
		t.Run(c.name, func(t *testing.T) {
			var clients []redis.UniversalClient
			for range loadClients {
				clients = append(clients, srv.Client())
			}
			var before, after int64
			res := runLoad(t, c, clients, "restart-"+c.name, func() {
				before = time.Now().UnixMicro()
				if err := srv.Restart(); err != nil {
					t.Errorf("restart: %v", err)
				}
				after = time.Now().UnixMicro()
			})
			// Split by when the grant was decided: by the old server, or
			// by the new one, whose grants must keep the guarantee on
			// their own (its data started empty).
			var pre, post []grant
			inFlight, placedAfter := 0, 0
			for _, g := range res.grants {
				switch {
				case g.decided < before:
					pre = append(pre, g)
				case g.decided-(g.hi-g.lo) > after:
					post = append(post, g)
				default:
					inFlight++
				}
			}
			placedAfter = int(res.placed) - len(res.grants) + len(post) // those given back came after
			t.Logf("%d grants before the restart, %d after (%d with those given back at the run's end), %d in flight, %d errors; restart took %v",
				len(pre), len(post), placedAfter, inFlight, res.errs, time.Duration(after-before)*time.Microsecond)
			if err := c.check(pre, res.origin); err != nil {
				t.Errorf("before the restart: %v", err)
			}
			if err := c.check(post, before); err != nil {
				t.Errorf("after the restart: %v", err)
			}
			// A token bucket holds the key until an interval after the
			// latest end an instance knew of (its crowd placed ahead
			// before the restart sends then): its first grants after the
			// restart may come too late to be sent in the run, and are
			// given back when it ends; they count as recovery.
			if placedAfter == 0 {
				t.Errorf("no grant after the restart: the bucket did not recover")
			}
		})
	}
}

// warm opens a few connections of rdb to every server it talks to.
func warm(t testing.TB, rdb redis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	ping := func(ctx context.Context, c *redis.Client) error {
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() { defer wg.Done(); c.Ping(ctx) }()
		}
		wg.Wait()
		return c.Ping(ctx).Err()
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, ping)
	case *redis.Client:
		err = ping(ctx, c)
	}
	if err != nil {
		t.Fatalf("warm-up: %v", err)
	}
}
