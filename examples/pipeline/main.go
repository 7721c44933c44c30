// Command pipeline is headway's whole flow in one process: a producer fills
// a Kafka topic, several consumer instances in one consumer group handle
// its records, and every handler call goes to a rate-limited HTTP provider.
// The instances share one limit through a Redis token bucket, so together
// they never call the provider faster than it allows.
//
// With no flags it needs nothing but Go: Kafka is embedded (kfake), Redis is
// a real redis-server on a free port if one is on PATH (otherwise an
// in-process stand-in, and it says so), and the provider is built in.
//
//	go run ./examples/pipeline
//	go run ./examples/pipeline -records 5000 -limit 200 -interval 500ms -instances 4
//	go run ./examples/pipeline -brokers 127.0.0.1:9092 -redis 127.0.0.1:6379   # docker compose up -d
//
// While it runs it prints one line per second; at the end, a summary of
// records produced, handled, lost and handled twice, the provider's 429s,
// and the most requests the provider saw in one window.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
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
	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/internal/provider"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
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
}

func main() {
	var c config
	flag.IntVar(&c.records, "records", 3000, "records to produce and handle")
	flag.Int64Var(&c.limit, "limit", 100, "provider calls allowed per interval, for the whole fleet")
	flag.DurationVar(&c.interval, "interval", 250*time.Millisecond, "the limit's interval")
	flag.IntVar(&c.instances, "instances", 3, "consumer instances in the group, each with its own Redis and Kafka clients")
	flag.IntVar(&c.partitions, "partitions", 6, "partitions of the topic")
	flag.StringVar(&c.brokers, "brokers", "", "comma-separated Kafka seed brokers (default: an embedded Kafka)")
	flag.StringVar(&c.redisAddr, "redis", "", "Redis address (default: start redis-server on a free port, or an in-process stand-in)")
	flag.StringVar(&c.target, "target", "", "URL to call per record instead of the built-in provider; gets topic, partition and offset query parameters")
	flag.DurationVar(&c.timeout, "timeout", 2*time.Minute, "give up after this long")
	flag.StringVar(&c.topic, "topic", "headway-pipeline", "topic to use")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sum, err := run(ctx, c, os.Stdout, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pipeline:", err)
		os.Exit(1)
	}
	if sum.Lost > 0 {
		os.Exit(2)
	}
}

func (c config) check() error {
	switch {
	case c.records < 1:
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
	}
	if c.target != "" {
		if u, err := url.Parse(c.target); err != nil || (u.Scheme != "http" && u.Scheme != "https") {
			return fmt.Errorf("-target %q: want an http or https URL", c.target)
		}
	}
	return nil
}

// summary is what the run ends with.
type summary struct {
	Produced, Handled, Lost, Twice, Provider429 int64
	MaxInWindow                                 int64
	Elapsed                                     time.Duration
}

func run(ctx context.Context, c config, out io.Writer, log *slog.Logger) (summary, error) {
	if err := c.check(); err != nil {
		return summary{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

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
		prov, err = provider.Start(provider.Config{
			Limit: c.limit, Interval: c.interval, Policy: provider.Periods,
			// Requests reach the provider a little after their grant:
			// allow a tenth of the interval, at least 30 ms (a busy
			// machine), at most half of it.
			Tolerance: min(max(c.interval/10, 30*time.Millisecond), c.interval/2),
		})
		if err != nil {
			return summary{}, err
		}
		defer prov.Close()
		target = prov.URL() + "/call"
		fmt.Fprintf(out, "provider: %s, %d calls per %v, answers 429 above that\n", target, c.limit, c.interval)
	} else {
		fmt.Fprintf(out, "provider: %s\n", target)
	}
	fmt.Fprintf(out, "fleet:    %d instances share one token bucket of %d per %v in Redis\n\n", c.instances, c.limit, c.interval)

	// The producer fills the topic while the consumers run.
	var produced atomic.Int64
	prodErr := make(chan error, 1)
	go func() { prodErr <- produce(ctx, seeds, c, &produced) }()

	// The fleet.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()
	var seen sync.Map // record → *atomic.Int64: successful calls, for -target
	var got429 atomic.Int64
	handler := func(ctx context.Context, rec *kgo.Record) error {
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

	fleetCtx, stopFleet := context.WithCancel(ctx)
	defer stopFleet()
	consumers := make([]*consumer.Consumer, c.instances)
	runErr := make(chan error, c.instances)
	for i := range consumers {
		rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
		defer rdb.Close()
		b, err := bucket.NewTokenBucket(rdb, "pipeline-demo", c.limit, c.interval)
		if err != nil {
			return summary{}, err
		}
		cons, err := consumer.New(handler, throttle.New(b),
			consumer.WithKafka(
				kgo.SeedBrokers(seeds...),
				kgo.ConsumerGroup("headway-pipeline-demo"),
				kgo.ConsumeTopics(c.topic),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
				kgo.HeartbeatInterval(200*time.Millisecond),
				kgo.SessionTimeout(3*time.Second),
				kgo.RebalanceTimeout(6*time.Second),
				kgo.FetchMaxWait(200*time.Millisecond),
			),
			consumer.WithRetry(10, 50*time.Millisecond, time.Second),
			consumer.WithHandlerTimeout(2*time.Second),
			consumer.WithLogger(log),
		)
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
	nextLine := start.Add(time.Second)
	perSecond := float64(c.limit) * float64(time.Second) / float64(c.interval)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case err := <-prodErr:
			if err != nil {
				return summary{}, fmt.Errorf("producing: %w", err)
			}
			prodErr = nil
		case now := <-poll.C:
			h := handledNow()
			done = h >= int64(c.records) && produced.Load() == int64(c.records)
			if now.Before(nextLine) || done {
				continue
			}
			nextLine = nextLine.Add(time.Second)
			waiting := 0
			for _, cons := range consumers {
				waiting += cons.Stats().Waiting
			}
			rate := float64(h - last)
			last = h
			if h < int64(c.records) {
				rates = append(rates, rate) // a full second with records left
			}
			fmt.Fprintf(out, "%5.1fs  %6d/%d handled  %6.0f/s of %.0f/s %s  %2d partitions waiting for permits\n",
				now.Sub(start).Seconds(), h, c.records, rate, perSecond, bar(rate/perSecond, 20), waiting)
		}
	}
	elapsed := time.Since(start)
	stopFleet()
	var firstErr error
	for range consumers {
		if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) && firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		return summary{}, fmt.Errorf("a consumer stopped: %w", firstErr)
	}

	s := summary{Produced: produced.Load(), Elapsed: elapsed, Provider429: got429.Load()}
	if prov != nil {
		ps := prov.Stats()
		s.Handled, s.Twice, s.Provider429, s.MaxInWindow = ps.Records, ps.Duplicates, ps.Rejected, ps.MaxInWindow
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
		fmt.Fprintf(out, "most calls the provider saw in one period: %d (limit %d per %v)\n", s.MaxInWindow, c.limit, c.interval)
	}
	if len(rates) > 1 {
		// The first second includes joining the group; skip it.
		lo, hi := slices.Min(rates[1:]), slices.Max(rates[1:])
		fmt.Fprintf(out, "paced rate while records waited: %.0f to %.0f per second (%.0f%% to %.0f%% of the limit)\n",
			lo, hi, 100*lo/perSecond, 100*hi/perSecond)
	}
	fmt.Fprintf(out, "%d records in %v\n", s.Handled, elapsed.Round(time.Millisecond))
	if ctx.Err() != nil && s.Lost > 0 {
		return s, fmt.Errorf("stopped after %v with %d records not handled yet", c.timeout, s.Lost)
	}
	return s, nil
}

// produce writes c.records records, spread evenly over the partitions.
func produce(ctx context.Context, seeds []string, c config, produced *atomic.Int64) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(c.topic))
	if err != nil {
		return err
	}
	defer cl.Close()
	var first error
	var mu sync.Mutex
	for i := range c.records {
		rec := &kgo.Record{Partition: int32(i % c.partitions), Value: []byte("record " + strconv.Itoa(i))}
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
