// Command pipeline is headway's whole flow in one process: a producer fills
// a Kafka topic, several consumer instances in one consumer group handle
// its records, and every handler call goes to a rate-limited HTTP provider.
// The instances share one limit through a Redis token bucket, so together
// they never call the provider faster than it allows.
//
// Each instance gives one Limiter to its consumer and to the
// httpclient.Transport its handler calls the provider through: the
// consumer takes a permit per attempt and passes it in the handler's
// context, and the Transport uses it for the handler's request, so each
// call costs one permit; the Transport also pauses the fleet on a 429
// with Retry-After and retries the call after the pause. The summary
// counts the permits the Limiters' callers got next to the calls the
// provider saw. -permits transport gives the consumer no Limiter instead: the
// Transport alone takes the permits.
//
// The built-in provider takes -latency (50 ms by default) to answer each
// call, as a real API does; the consumers keep many calls in flight
// (records with different keys run concurrently, -ordering and -inflight
// say how) so that the fleet still uses the whole limit. The summary
// counts, at the provider by arrival time, the calls of each full second
// of steady state and their share of the limit.
//
// -provider sliding makes the built-in provider count a sliding window
// (at most the limit in any span of one interval, and 429 with
// Retry-After above it) instead of the token bucket's own guarantee.
//
// -tenants replaces -records with the records of several tenants, keyed
// <tenant>-<entity> (partitioned by key), and gives the consumers
// consumer.WithFairness: name:count produces count records at once,
// name:count@R/s one every 1/R s once the group has settled, *W weighs
// the tenant W, a trailing ! marks its records urgent. The summary then
// prints each tenant's wait from produce to handler (p50, p90, max), its
// calls per second while every tenant had records, and the calls of a
// key that came behind one of its offsets handled already (the order per
// key). -fair=false shows the same without fairness.
//
//	go run ./examples/pipeline -tenants A:2000,B:20@2/s -keys 300 -limit 100 -interval 1s -instances 2 -partitions 6 -latency 10ms
//	go run ./examples/pipeline -tenants 'A:400*1,B:800*2,C:1600*4' -limit 100 -interval 1s -instances 2 -partitions 6 -latency 10ms
//
// With no flags it needs nothing but Go: Kafka is embedded (kfake), Redis is
// a real redis-server on a free port if one is on PATH (otherwise an
// in-process stand-in, and it says so), and the provider is built in.
//
//	go run ./examples/pipeline
//	go run ./examples/pipeline -records 5000 -limit 200 -interval 500ms -instances 4
//	go run ./examples/pipeline -records 6000 -limit 500 -interval 1s -instances 3 -partitions 6 -latency 100ms
//	go run ./examples/pipeline -records 2000 -keys 200 -limit 100 -interval 1s -latency 30ms -provider sliding
//	go run ./examples/pipeline -brokers 127.0.0.1:9092 -redis 127.0.0.1:6379   # docker compose up -d
//
// While it runs it prints one line per second; at the end, a summary of
// records produced, handled, lost and handled twice, the provider's 429s,
// the most requests the provider saw in one window, and, by arrival, in
// any span of one interval and in the first interval of the run (run it
// twice on one -redis to see a fleet start on a key used within the last
// interval: docs/buckets.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/internal/provider"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

// config is the command line.
type config struct {
	records    int
	limit      int64
	interval   time.Duration
	instances  int
	partitions int
	brokers    string
	redisAddr  string
	target     string
	timeout    time.Duration
	topic      string
	latency    time.Duration // the built-in provider's time to answer
	ordering   string        // key, partition or none
	inFlight   int           // per instance; 0: the consumer's default
	keys       int           // distinct record keys
	policy     string        // the built-in provider's: periods or sliding
	permits    string        // who takes permits: both or transport
	tenants    string        // -tenants: records of several tenants instead of -records
	fair       bool          // with -tenants: WithFairness
	share      float64       // with -tenants: the urgent records' share
	reserve    int64         // with -tenants: the urgent records' own part of the limit
}

func main() {
	os.Exit(command(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// command is main, returning the exit code (see internal/cli): 1 when a
// record was not handled.
func command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := cli.New("pipeline", "pipeline runs producer, consumer group, shared Redis limit and a rate-limited\nprovider in one process, and checks that no record is lost and the limit holds.")
	fs := cmd.Flags
	var c config
	fs.IntVar(&c.records, "records", 3000, "records to produce and handle")
	fs.Int64Var(&c.limit, "limit", 100, "provider calls allowed per interval, for the whole fleet")
	fs.DurationVar(&c.interval, "interval", 250*time.Millisecond, "the limit's interval")
	fs.IntVar(&c.instances, "instances", 3, "consumer instances in the group, each with its own Redis and Kafka clients")
	fs.IntVar(&c.partitions, "partitions", 6, "partitions of the topic")
	fs.StringVar(&c.brokers, "brokers", "", "comma-separated Kafka seed brokers (default: an embedded Kafka)")
	fs.StringVar(&c.redisAddr, "redis", "", "Redis address (default: start redis-server on a free port, or an in-process stand-in; "+redisenv.StandInEnv+"=1 forces the stand-in)")
	fs.StringVar(&c.target, "target", "", "URL to call per record instead of the built-in provider; gets topic, partition and offset query parameters")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "give up after this long")
	fs.StringVar(&c.topic, "topic", "headway-pipeline", "topic to use")
	fs.DurationVar(&c.latency, "latency", 50*time.Millisecond, "how long the built-in provider takes to answer each call")
	fs.StringVar(&c.ordering, "ordering", "key", "which records are handled in order: key (records with one key, one at a time), partition, or none")
	fs.IntVar(&c.inFlight, "inflight", 0, "records each instance works on at once (0: the consumer's default, 128)")
	fs.IntVar(&c.keys, "keys", 1000, "distinct record keys (record i has key entity-<i mod keys>)")
	fs.StringVar(&c.policy, "provider", "periods", "how the built-in provider counts its limit: periods (the token bucket's own guarantee) or sliding (at most the limit in any span of one interval, 429 with Retry-After above it)")
	fs.StringVar(&c.tenants, "tenants", "", "records of several tenants instead of -records: name:count[@rate/s][*weight][!] separated by commas, e.g. A:2000,B:20@2/s (A's 2,000 at once, then B's 20 at 2 a second once the group has settled; '*2' weighs 2, '!' marks urgent); prints each tenant's wait from produce to handler")
	fs.BoolVar(&c.fair, "fair", true, "with -tenants: share the permits among tenants (consumer.WithFairness); false shows the wait without it")
	fs.Float64Var(&c.share, "urgent-share", 0.2, "with -tenants: the most of the permits urgent records take while others wait (consumer.Urgent)")
	fs.Int64Var(&c.reserve, "urgent-reserve", 0, "with -tenants, an urgent tenant, -fair and -permits both: this many of -limit's calls per interval are the urgent records' own, in a token bucket of their own (consumer.UrgentReserve); the shared bucket keeps the rest")
	fs.StringVar(&c.permits, "permits", "both", "who takes permits: both (one Limiter given to the consumer and the Transport: one permit per call, the consumer's) or transport (the consumer gets no Limiter)")

	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return cmd.Run(ctx, args, stdout, stderr, func() error { return c.check() }, func(ctx context.Context) error {
		sum, err := run(ctx, c, stdout, log)
		if ctx.Err() != nil && sum.Produced > 0 {
			return cli.Failedf("stopped by a signal with %d of %d records not handled yet", sum.Lost, sum.Produced)
		}
		if err != nil {
			return err
		}
		if sum.Lost > 0 {
			return cli.Failedf("%d records lost", sum.Lost)
		}
		return nil
	})
}

func (c config) check() error {
	switch {
	case c.records < 1 && c.tenants == "":
		return fmt.Errorf("-records %d: must be at least 1", c.records)
	case c.limit < 1:
		return fmt.Errorf("-limit %d: must be at least 1", c.limit)
	case c.interval < time.Millisecond:
		return fmt.Errorf("-interval %v: must be at least 1ms", c.interval)
	case c.instances < 1 || c.instances > 64:
		return fmt.Errorf("-instances %d: must be between 1 and 64", c.instances)
	case c.partitions < 1 || c.partitions > 1024:
		return fmt.Errorf("-partitions %d: must be between 1 and 1024", c.partitions)
	case c.timeout <= 0:
		return fmt.Errorf("-timeout %v: must be positive", c.timeout)
	case c.latency < 0:
		return fmt.Errorf("-latency %v: must not be negative", c.latency)
	case c.inFlight < 0:
		return fmt.Errorf("-inflight %d: must be 0 (the default) or positive", c.inFlight)
	case c.keys < 1:
		return fmt.Errorf("-keys %d: must be at least 1", c.keys)
	case c.policy != "" && c.policy != "periods" && c.policy != "sliding":
		return fmt.Errorf("-provider %q: want periods or sliding", c.policy)
	case c.permits != "" && c.permits != "both" && c.permits != "transport":
		return fmt.Errorf("-permits %q: want both or transport", c.permits)
	}
	if _, err := c.order(); err != nil {
		return err
	}
	if c.tenants != "" {
		ts, err := parseTenants(c.tenants)
		if err != nil {
			return err
		}
		if !(c.share > 0 && c.share < 1) {
			return fmt.Errorf("-urgent-share %v: must be above 0 and below 1", c.share)
		}
		if c.reserve != 0 && !slices.ContainsFunc(ts, func(t tenantSpec) bool { return t.urgent }) {
			return fmt.Errorf("-urgent-reserve %d: no tenant is urgent: mark one with '!' in -tenants", c.reserve)
		}
	}
	if c.reserve != 0 && (c.tenants == "" || c.reserve < 0 || c.reserve >= c.limit) {
		return fmt.Errorf("-urgent-reserve %d: want a part of -limit (%d), at least 1 and below it, with -tenants", c.reserve, c.limit)
	}
	switch {
	case c.reserve != 0 && c.permits == "transport":
		// The consumer would take no permit for a record: the reserve's
		// would go unused, and the shared bucket keep only the rest.
		return fmt.Errorf("-urgent-reserve %d with -permits transport: the urgent records take the reserve's permits in the consumer; use -permits both", c.reserve)
	case c.reserve != 0 && !c.fair:
		return fmt.Errorf("-urgent-reserve %d with -fair=false: the reserve is the fair scheduler's (consumer.WithFairness); the shared bucket would keep only the rest", c.reserve)
	case c.tenants != "" && c.fair && c.permits == "transport":
		// consumer.New refuses fairness with nothing to share.
		return errors.New("-tenants with -permits transport: the tenants share the consumer's permits (consumer.WithFairness), and with -permits transport it takes none; use -permits both, or -fair=false")
	}
	if c.target != "" {
		if u, err := url.Parse(c.target); err != nil || (u.Scheme != "http" && u.Scheme != "https") {
			return fmt.Errorf("-target %q: want an http or https URL", c.target)
		}
	}
	return nil
}

// order returns the consumer's ordering named by -ordering.
func (c config) order() (consumer.Ordering, error) {
	switch c.ordering {
	case "key", "":
		return consumer.ByKey, nil
	case "partition":
		return consumer.ByPartition, nil
	case "none":
		return consumer.Unordered, nil
	}
	return 0, fmt.Errorf("-ordering %q: want key, partition or none", c.ordering)
}

// summary is what the run ends with.
type summary struct {
	Produced, Handled, Lost, Twice, Provider429 int64
	MaxInWindow                                 int64
	// MaxInAnyInterval is the most calls the provider accepted in any
	// span of one interval, by arrival, whatever its policy; FirstInterval
	// how many of them came in the interval from the first one (a fleet
	// starting on a key used within the last interval: docs/buckets.md).
	MaxInAnyInterval, FirstInterval int64
	Elapsed                         time.Duration
	// Steady is the calls the provider accepted in each full second of
	// steady state (see steadySeconds); SteadyMin and SteadyMedian are
	// their lowest and median share of the limit (1 = the limit).
	Steady                  []int64
	SteadyMin, SteadyMedian float64
	// SteadyMean is the calls of all those seconds over the limit's
	// worth for as many seconds: unlike a single second's count, it does
	// not depend on where refills fall within the seconds.
	SteadyMean float64
	// PeakInFlight is the most handler calls one instance ran at once.
	PeakInFlight int
	// Settled is when, after the start, the group's assignment last
	// changed.
	Settled time.Duration
	// Permits is how many permits the Limiters' callers got (counted by
	// an Observer of each Limiter), Attempts how many times a handler was
	// called, and ProviderCalls how many requests reached the provider,
	// accepted or refused; Unused how many permits the consumers took
	// that no call used (consumer.Stats.PermitsUnused: past their margin,
	// their record or their call gone), Stale those of them past their
	// margin: one permit per call is Permits == ProviderCalls + Unused.
	Permits, Attempts, ProviderCalls, Unused, Stale int64
	// AcceptedPerSecond is the calls the provider accepted per second,
	// from the first accepted call to the last.
	AcceptedPerSecond float64
	// Tenants (with -tenants) is each tenant's waits and calls per second
	// over TenantSpan, while every tenant had records; BehindInKey counts
	// calls of a key for an offset before one handled already.
	Tenants     []tenantReport
	TenantSpan  time.Duration
	BehindInKey int
}

func run(ctx context.Context, c config, out io.Writer, log *slog.Logger) (summary, error) {
	if err := c.check(); err != nil {
		return summary{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var tenants []tenantSpec
	if c.tenants != "" {
		tenants, _ = parseTenants(c.tenants)
		c.records = 0
		for _, t := range tenants {
			c.records += t.count
		}
	}
	tlog := newTenantLog()
	goTimed := make(chan struct{}) // the timed tenants start producing
	timedStarted := false
	var atOnce int64 // records of the tenants produced at once
	for _, t := range tenants {
		if t.rate == 0 {
			atOnce += int64(t.count)
		}
	}

	// Redis.
	redisAddr := c.redisAddr
	if redisAddr == "" {
		srv, err := redisenv.Start()
		if err != nil {
			return summary{}, fmt.Errorf("starting Redis: %w", err)
		}
		defer srv.Close()
		redisAddr = srv.Addr()
		fmt.Fprintf(out, "redis:    %s at %s\n", srv.Kind(), redisAddr)
	} else {
		fmt.Fprintf(out, "redis:    %s\n", redisAddr)
	}

	// Kafka.
	var seeds []string
	if c.brokers == "" {
		kc, err := kafkaenv.Start(kafkaenv.Topic(c.topic, int32(c.partitions)))
		if err != nil {
			return summary{}, fmt.Errorf("starting the embedded Kafka: %w", err)
		}
		defer kc.Close()
		seeds = kc.Addrs()
		fmt.Fprintf(out, "kafka:    embedded (kfake) at %s, topic %s with %d partitions\n", strings.Join(seeds, ","), c.topic, c.partitions)
	} else {
		seeds = strings.Split(c.brokers, ",")
		if err := createTopic(ctx, seeds, c.topic, int32(c.partitions)); err != nil {
			return summary{}, err
		}
		fmt.Fprintf(out, "kafka:    %s, topic %s\n", c.brokers, c.topic)
	}

	// The provider.
	var prov *provider.Provider
	target := c.target
	if target == "" {
		var err error
		policy := provider.Periods
		if c.policy == "sliding" {
			policy = provider.Sliding
		}
		prov, err = provider.Start(provider.Config{
			Limit: c.limit, Interval: c.interval, Policy: policy,
			// Requests reach the provider a little after their grant:
			// allow a tenth of the interval, at least 50 ms (a busy
			// machine: with 30 ms, one CI run under -race out of many
			// had 15 calls refused on a 200 ms interval), at most half
			// of it.
			Tolerance: min(max(c.interval/10, 50*time.Millisecond), c.interval/2),
			Latency:   c.latency,
		})
		if err != nil {
			return summary{}, err
		}
		defer prov.Close()
		target = prov.URL() + "/call"
		fmt.Fprintf(out, "provider: %s, %d calls per %v (%s), answers 429 with Retry-After above that, each call takes %v\n", target, c.limit, c.interval, policy, c.latency)
	} else {
		fmt.Fprintf(out, "provider: %s\n", target)
	}
	ordering, _ := c.order()
	inFlight := []consumer.Option{consumer.WithOrdering(ordering)}
	inFlightText := "default"
	if c.inFlight > 0 {
		inFlight = append(inFlight, consumer.WithMaxInFlight(c.inFlight))
		inFlightText = strconv.Itoa(c.inFlight)
	}
	permitsText := "the consumer and the Transport share one Limiter: one permit per call"
	if c.permits == "transport" {
		permitsText = "the consumer has no Limiter: the Transport takes the permits"
	}
	bucketText := fmt.Sprintf("one token bucket of %d per %v", c.limit, c.interval)
	if c.reserve > 0 {
		bucketText = fmt.Sprintf("a token bucket of %d per %v, and one of %d for urgent records (consumer.UrgentReserve),", c.limit-c.reserve, c.interval, c.reserve)
	}
	fmt.Fprintf(out, "fleet:    %d instances share %s in Redis; ordering %s, records in flight per instance: %s; %s\n\n",
		c.instances, bucketText, ordering, inFlightText, permitsText)

	// The producer fills the topic while the consumers run.
	var produced atomic.Int64
	prodErr := make(chan error, 1)
	prodCtx, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	if tenants != nil {
		go func() { prodErr <- produceTenants(prodCtx, seeds, c, tenants, goTimed, &produced) }()
	} else {
		go func() { prodErr <- produce(ctx, seeds, c, &produced) }()
	}

	// The fleet. Each instance's handler calls the provider through an
	// httpclient.Transport on the instance's Limiter, with the handler's
	// context: the permit the consumer took for the attempt serves the
	// request.
	var seen sync.Map // record → *atomic.Int64: successful calls, for -target
	var got429, attempts atomic.Int64
	var grants grantCount
	handlerFor := func(hc *http.Client) consumer.Handler {
		return func(ctx context.Context, rec *kgo.Record) error {
			if tenants != nil {
				tlog.called(rec, time.Now())
			}
			attempts.Add(1)
			q := url.Values{"topic": {rec.Topic}, "partition": {strconv.Itoa(int(rec.Partition))}, "offset": {strconv.FormatInt(rec.Offset, 10)}}
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, target+"?"+q.Encode(), nil)
			if err != nil {
				return err
			}
			resp, err := hc.Do(req)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusTooManyRequests {
				// The Transport paused the fleet, told the Limiter, and
				// retried as often as it could: try the record again.
				got429.Add(1)
				return errors.New("provider answered 429")
			}
			if resp.StatusCode/100 != 2 {
				return fmt.Errorf("provider answered %s", resp.Status)
			}
			n, _ := seen.LoadOrStore(fmt.Sprintf("%d/%d", rec.Partition, rec.Offset), new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			return nil
		}
	}

	fleetCtx, stopFleet := context.WithCancel(ctx)
	defer stopFleet()
	consumers := make([]*consumer.Consumer, c.instances)
	runErr := make(chan error, c.instances)
	for i := range consumers {
		rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
		defer rdb.Close()
		b, err := bucket.NewTokenBucket(rdb, "pipeline-demo", c.limit-c.reserve, c.interval)
		if err != nil {
			return summary{}, err
		}
		var reserve *throttle.Limiter
		if c.reserve > 0 {
			rb, err := bucket.NewTokenBucket(rdb, "pipeline-demo:urgent", c.reserve, c.interval)
			if err != nil {
				return summary{}, err
			}
			reserve = throttle.New(rb, throttle.WithObserver(&grants))
		}
		lim := throttle.New(b, throttle.WithObserver(&grants))
		tr, err := httpclient.NewTransport(lim)
		if err != nil {
			return summary{}, err
		}
		hc := &http.Client{Transport: tr}
		defer hc.CloseIdleConnections()
		consLim := lim
		if c.permits == "transport" {
			consLim = nil
		}
		opts := inFlight
		if tenants != nil && c.fair {
			opts = append(slices.Clip(opts), fairOptions(tenants, c.share, reserve))
		}
		cons, err := consumer.New(handlerFor(hc), consLim, append(slices.Clip(opts),
			consumer.WithKafka(
				kgo.SeedBrokers(seeds...),
				kgo.ConsumerGroup("headway-pipeline-demo"),
				kgo.ConsumeTopics(c.topic),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			),
			consumer.WithLogger(log),
		)...)
		if err != nil {
			return summary{}, err
		}
		consumers[i] = cons
		go func() { runErr <- cons.Run(fleetCtx) }()
	}

	// Progress, once a second, until every record is handled.
	start := time.Now()
	handledNow := func() int64 {
		if prov != nil {
			return prov.Stats().Records
		}
		var n int64
		seen.Range(func(_, _ any) bool { n++; return true })
		return n
	}
	// Look often, so that the run ends when the last record is handled;
	// print once a second.
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	var last int64
	var rates []float64
	// settled is when the group's assignment last changed, as far as
	// polling every 20 ms can tell: the steady state starts after it.
	lastOwners, settled := "", start
	nextLine := start.Add(time.Second)
	perSecond := float64(c.limit) * float64(time.Second) / float64(c.interval)
	var firstErr error
	stopped := 0 // consumers whose Run returned
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case err := <-runErr:
			// A consumer stopped before its records were handled: say
			// why now, rather than wait for the timeout.
			stopped++
			done = true
			if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
				firstErr = cmpErr(err, errors.New("Run returned before the records were handled"))
			}
		case err := <-prodErr:
			if err != nil {
				return summary{}, fmt.Errorf("producing: %w", err)
			}
			prodErr = nil
		case now := <-poll.C:
			h := handledNow()
			done = h >= int64(c.records) && produced.Load() == int64(c.records)
			if o := owners(consumers); o != lastOwners {
				lastOwners, settled = o, now
			}
			if !timedStarted && (h > 0 || atOnce == 0) && !strings.Contains(","+lastOwners, ",0,") && now.Sub(settled) >= time.Second {
				// Every instance owns partitions and handles records:
				// the timed tenants start.
				timedStarted = true
				close(goTimed)
			}
			if now.Before(nextLine) || done {
				continue
			}
			nextLine = nextLine.Add(time.Second)
			waiting, inCalls := 0, 0
			for _, cons := range consumers {
				st := cons.Stats()
				waiting += st.WaitingRecords
				inCalls += st.InFlight
			}
			rate := float64(h - last)
			last = h
			if h < int64(c.records) {
				rates = append(rates, rate) // a full second with records left
			}
			fmt.Fprintf(out, "%5.1fs  %6d/%d handled  %6.0f/s of %.0f/s %s  %3d calls in flight, %3d records waiting for permits\n",
				now.Sub(start).Seconds(), h, c.records, rate, perSecond, bar(rate/perSecond, 20), inCalls, waiting)
		}
	}
	elapsed := time.Since(start)
	if tenants != nil && prodErr != nil {
		stopProducing() // the timed tenants may still wait for their start
	}
	if prodErr != nil {
		<-prodErr // stopped early: the producer ends with ctx; leave nothing running
	}
	stopFleet()
	for range len(consumers) - stopped {
		if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) && firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		return summary{}, fmt.Errorf("a consumer stopped: %w", firstErr)
	}

	s := summary{Produced: produced.Load(), Elapsed: elapsed, Provider429: got429.Load(), Permits: grants.n.Load(), Attempts: attempts.Load()}
	for _, cons := range consumers {
		st := cons.Stats()
		s.PeakInFlight = max(s.PeakInFlight, st.PeakInFlight)
		s.Stale += st.PermitsStale
		s.Unused += st.PermitsUnused
	}
	if prov != nil {
		ps := prov.Stats()
		s.Handled, s.Twice, s.Provider429, s.MaxInWindow = ps.Records, ps.Duplicates, ps.Rejected, ps.MaxInWindow
		s.MaxInAnyInterval = ps.MaxInAnyInterval
		s.FirstInterval = firstInterval(prov.Arrivals(), c.interval)
		s.ProviderCalls = ps.Accepted + ps.Rejected
		if arr := prov.Arrivals(); len(arr) > 1 {
			s.AcceptedPerSecond = float64(len(arr)-1) / arr[len(arr)-1].Sub(arr[0]).Seconds()
		}
		s.Steady = steadySeconds(prov.Arrivals(), settled)
		s.Settled = settled.Sub(start)
		s.SteadyMin, s.SteadyMedian = shares(s.Steady, perSecond)
		if len(s.Steady) > 0 {
			var sum int64
			for _, n := range s.Steady {
				sum += n
			}
			s.SteadyMean = float64(sum) / (perSecond * float64(len(s.Steady)))
		}
	} else {
		seen.Range(func(_, v any) bool {
			s.Handled++
			s.Twice += v.(*atomic.Int64).Load() - 1
			return true
		})
	}
	s.Lost = s.Produced - s.Handled
	fmt.Fprintf(out, "\nproduced %d, handled %d, lost %d, handled twice %d, provider 429s %d\n", s.Produced, s.Handled, s.Lost, s.Twice, s.Provider429)
	if prov != nil {
		fmt.Fprintf(out, "most calls the provider saw in one %s: %d (limit %d per %v)\n", map[bool]string{true: "sliding window", false: "period"}[c.policy == "sliding"], s.MaxInWindow, c.limit, c.interval)
		fmt.Fprintf(out, "most calls the provider saw in any span of %v, by arrival: %d; in the %v from the first call: %d\n", c.interval, s.MaxInAnyInterval, c.interval, s.FirstInterval)
		share := 0.0
		if accepted := s.ProviderCalls - s.Provider429; accepted > 0 {
			share = 100 * float64(s.Provider429) / float64(accepted)
		}
		fmt.Fprintf(out, "calls at the provider %d (429s %.1f%% of accepted calls), permits used %d (%d unused, %d of them past their margin), handler calls %d\n", s.ProviderCalls, share, s.Permits, s.Unused, s.Stale, s.Attempts)
		fmt.Fprintf(out, "accepted calls per second, first to last: %.1f (%.1f%% of the limit)\n", s.AcceptedPerSecond, 100*s.AcceptedPerSecond/perSecond)
		if len(s.Steady) > 0 {
			list := ""
			if len(s.Steady) <= 15 {
				list = fmt.Sprintf(" %v", s.Steady)
			}
			fmt.Fprintf(out, "steady state at the provider (%d full seconds from the first call after the last rebalance, at %.1fs, to the last second with calls):%s calls per second; lowest %.1f%%, median %.1f%%, all of them %.1f%% of the limit\n",
				len(s.Steady), s.Settled.Seconds(), list, 100*s.SteadyMin, 100*s.SteadyMedian, 100*s.SteadyMean)
		} else {
			fmt.Fprintf(out, "steady state at the provider: the run was shorter than two seconds\n")
		}
		fmt.Fprintf(out, "most handler calls in flight in one instance: %d\n", s.PeakInFlight)
	} else if len(rates) > 1 {
		// The first second includes joining the group; skip it.
		lo, hi := slices.Min(rates[1:]), slices.Max(rates[1:])
		fmt.Fprintf(out, "paced rate while records waited: %.0f to %.0f per second (%.0f%% to %.0f%% of the limit)\n",
			lo, hi, 100*lo/perSecond, 100*hi/perSecond)
	}
	if tenants != nil {
		s.Tenants, s.TenantSpan = tlog.report(out, tenants, perSecond)
		s.BehindInKey = tlog.behind
	}
	fmt.Fprintf(out, "%d records in %v\n", s.Handled, elapsed.Round(time.Millisecond))
	if ctx.Err() != nil && s.Lost > 0 {
		return s, fmt.Errorf("stopped after %v with %d records not handled yet", c.timeout, s.Lost)
	}
	return s, nil
}

// grantCount is an Observer of the Limiters that counts the permits their
// callers got: each Acquire that returned nil (a caller that left while
// waiting for its permit's place in the period got none, though the bucket
// granted it). A permit passed down to the Transport in the handler's ctx
// counts once, when the consumer got it; a permit the Transport takes
// itself counts too: "one permit per call" is this count against the
// calls the provider saw.
type grantCount struct{ n atomic.Int64 }

func (g *grantCount) Acquired(_ string, n int64, _ time.Duration, err error) {
	if err == nil {
		g.n.Add(n)
	}
}

func (g *grantCount) BucketCall(string, throttle.Decision, time.Duration, error) {}

func (g *grantCount) Degraded(string, string, bool, error) {}

// owners describes how many partitions each consumer owns.
func owners(cs []*consumer.Consumer) string {
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "%d,", len(c.Stats().Partitions))
	}
	return b.String()
}

// steadySeconds counts arrivals in each full second from the first one at
// or after from (the group settled), leaving out the last second that has
// arrivals (the run ends inside it, when records run out): the steady
// state.
func steadySeconds(arrivals []time.Time, from time.Time) []int64 {
	i, _ := slices.BinarySearchFunc(arrivals, from, func(a, t time.Time) int { return a.Compare(t) })
	arrivals = arrivals[i:]
	if len(arrivals) == 0 {
		return nil
	}
	first := arrivals[0]
	last := int(arrivals[len(arrivals)-1].Sub(first) / time.Second)
	counts := make([]int64, last+1)
	for _, a := range arrivals {
		counts[int(a.Sub(first)/time.Second)]++
	}
	return counts[:last]
}

// firstInterval counts the arrivals within interval of the first one.
func firstInterval(arrivals []time.Time, interval time.Duration) int64 {
	if len(arrivals) == 0 {
		return 0
	}
	end := arrivals[0].Add(interval)
	i, _ := slices.BinarySearchFunc(arrivals, end, func(a, t time.Time) int { return a.Compare(t) })
	return int64(i)
}

// shares returns the lowest and the median of counts as shares of
// perSecond.
func shares(counts []int64, perSecond float64) (lowest, median float64) {
	if len(counts) == 0 {
		return 0, 0
	}
	sorted := slices.Clone(counts)
	slices.Sort(sorted)
	mid := float64(sorted[len(sorted)/2])
	if len(sorted)%2 == 0 {
		mid = float64(sorted[len(sorted)/2-1]+sorted[len(sorted)/2]) / 2
	}
	return float64(sorted[0]) / perSecond, mid / perSecond
}

// produce writes c.records records, spread evenly over the partitions,
// with keys spread over c.keys entities (record i has key entity-<i mod
// keys>), as an outbox of events about many customers would be.
func produce(ctx context.Context, seeds []string, c config, produced *atomic.Int64) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(c.topic))
	if err != nil {
		return err
	}
	defer cl.Close()
	var first error
	var mu sync.Mutex
	for i := range c.records {
		rec := &kgo.Record{Partition: int32(i % c.partitions), Key: []byte("entity-" + strconv.Itoa(i%max(c.keys, 1))), Value: []byte("record " + strconv.Itoa(i))}
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				first = cmpErr(first, err)
				mu.Unlock()
				return
			}
			produced.Add(1)
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	return first
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// createTopic creates the topic on a real Kafka; an existing topic is fine.
func createTopic(ctx context.Context, seeds []string, topic string, partitions int32) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return err
	}
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	t := kmsg.NewCreateTopicsRequestTopic()
	t.Topic, t.NumPartitions, t.ReplicationFactor = topic, partitions, 1
	req.Topics = append(req.Topics, t)
	req.TimeoutMillis = 10_000
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("creating topic %s: %w", topic, err)
	}
	for _, rt := range resp.Topics {
		if rt.ErrorCode != 0 && rt.ErrorCode != 36 { // 36: TOPIC_ALREADY_EXISTS
			msg := ""
			if rt.ErrorMessage != nil {
				msg = *rt.ErrorMessage
			}
			return fmt.Errorf("creating topic %s: Kafka error code %d %s", topic, rt.ErrorCode, msg)
		}
	}
	return nil
}

// bar draws a fraction (1 = the limit) as a bar of width cells.
func bar(frac float64, width int) string {
	n := int(frac*float64(width) + 0.5)
	n = max(0, min(n, width+2))
	return "[" + strings.Repeat("#", min(n, width)) + strings.Repeat(" ", max(0, width-n)) + "]" + strings.Repeat("!", max(0, n-width))
}
