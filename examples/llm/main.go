// Command llm runs a fleet of Kafka consumer instances that send each
// record to an LLM-like API limited in requests per minute (RPM), tokens
// per minute (TPM) and calls in flight, the way OpenAI's and Anthropic's
// APIs are, and prints what the provider counted.
//
//	go run ./examples/llm
//
// Each call's token cost is known only after the call (the provider's
// answer carries it in its usage). The handler is a plain client.Do: the
// client's Transport (httpclient.NewTransport) does the accounting, with
//
//   - httpclient.WithConcurrency: a slot of a fleet-wide cap
//     (bucket.NewConcurrency), held from before the call's cost until its
//     answer's body is closed;
//   - httpclient.WithCost: an estimate of the call's cost, one request and
//     -estimate tokens, taken from a budget of two dimensions
//     (bucket.NewBudget), both or none, before the send, at most the
//     limits in any span of one window at send time; settled with the
//     usage the answer reports when its body is closed (an estimate too
//     high is given back to the grant's place while it still counts; one
//     too low is charged there, and later calls wait for it); a refusal
//     settled at once, its tokens given back;
//   - httpclient.WithCallTime: no slot or cost is taken when less than
//     -call-time is left before the handler's deadline (the consumer
//     calls the handler again), and a call abandoned after its send keeps
//     its slot that long, the provider still running it;
//   - the answer's rate-limit headers and 429s reported to the fleet (a
//     dimension with nothing left is held back until its own reset, the
//     others not).
//
// A non-2xx answer is an error of the handler: the consumer calls it
// again after a back-off, and that call takes a new estimate.
//
// By default everything runs in the process: an embedded Kafka (kfake), a
// redis-server on a free port (or an in-process stand-in, saying so), and a
// built-in provider that enforces the three limits, counting by arrival
// (-provider: buckets refilled continuously, a sliding window, or fixed
// windows), takes
// -latency ± -jitter per call, and runs a call its caller abandoned to
// its end. The last line sums the run up: calls accepted and refused,
// most in flight, the binding limit's share used in each full window
// after the first, calls cut after their permit, made twice, lost. -target sends the calls to
// another provider instead (OpenAI-style headers and usage expected).
// -kill-instance-at kills one instance in the middle of its calls (its
// Redis connections cut first, so it releases nothing): its slots come
// back when their lease ends.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/internal/llmprovider"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	os.Exit(command(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

type config struct {
	instances, partitions, records int
	rpm, tpm                       int64
	concurrency                    int64
	window, latency, lease         time.Duration
	jitter                         time.Duration
	minTokens, maxTokens, estimate int64
	target, redisAddr, provider    string
	headers                        string
	killAt, timeout                time.Duration
	handlerTimeout, callTime       time.Duration
	seed                           uint64
}

func command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c config
	cmd := cli.New("llm", "llm runs a fleet of Kafka consumers calling an LLM-style provider through one\nshared Redis budget of requests, tokens and calls in flight, checks that no\nrecord is lost, and prints what the provider counted in each window.")
	fs := cmd.Flags
	fs.IntVar(&c.instances, "instances", 3, "consumer instances in one group")
	fs.IntVar(&c.partitions, "partitions", 6, "partitions of the topic")
	fs.IntVar(&c.records, "records", 900, "records to send, one call each")
	fs.Int64Var(&c.rpm, "rpm", 600, "the provider's requests per window, and the fleet's")
	fs.Int64Var(&c.tpm, "tpm", 40_000, "the provider's tokens per window, and the fleet's")
	fs.Int64Var(&c.concurrency, "concurrency", 8, "the provider's calls in flight, and the fleet's cap")
	fs.DurationVar(&c.window, "window", time.Minute, "the window of -rpm and -tpm")
	fs.DurationVar(&c.latency, "latency", 300*time.Millisecond, "how long the built-in provider takes per call, give or take -jitter")
	fs.DurationVar(&c.jitter, "jitter", 100*time.Millisecond, "each call's latency is drawn from -latency less this to -latency plus this (built-in provider)")
	fs.Int64Var(&c.minTokens, "min-tokens", 20, "the least tokens a call costs (built-in provider)")
	fs.Int64Var(&c.maxTokens, "max-tokens", 100, "the most tokens a call costs (built-in provider)")
	fs.Int64Var(&c.estimate, "estimate", 0, "tokens taken before each call, settled after it (0: -max-tokens, the most a call can cost)")
	fs.DurationVar(&c.lease, "lease", 2*time.Second, "how long a dead instance's slot outlives it (bucket.WithLease)")
	fs.DurationVar(&c.killAt, "kill-instance-at", 0, "kill one instance this long after the start, in the middle of its calls (0: none)")
	fs.StringVar(&c.target, "target", "", "call this URL instead of the built-in provider (POST, OpenAI-style usage in the answer)")
	fs.StringVar(&c.redisAddr, "redis", "", "Redis address (default: start redis-server on a free port, or an in-process stand-in)")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Minute, "give up after this long")
	fs.DurationVar(&c.handlerTimeout, "handler-timeout", 10*time.Second, "each handler call's deadline (consumer.WithHandlerTimeout)")
	fs.DurationVar(&c.callTime, "call-time", time.Second, "how long a call takes: a call waits for its slot and cost at most -handler-timeout less this, and one abandoned after its send keeps its slot this long (httpclient.WithCallTime; 0: neither)")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of the built-in provider's token costs")
	fs.StringVar(&c.headers, "headers", "openai", "whose rate-limit headers the built-in provider answers with: openai (x-ratelimit-*, the reset a duration until the limit is fully restored) or anthropic (anthropic-ratelimit-*, the reset the time at which it is)")
	fs.StringVar(&c.provider, "provider", "continuous", "how the built-in provider counts -rpm and -tpm: continuous (buckets refilled continuously, as Anthropic documents), sliding (at most the limits in any span of one window) or fixed (at most the limits in each window from the provider's start)")
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	validate := func() error {
		if c.estimate == 0 {
			c.estimate = c.maxTokens
		}
		return c.check()
	}
	return cmd.Run(ctx, args, stdout, stderr, validate, func(ctx context.Context) error {
		s, err := run(ctx, c, stdout, log)
		switch {
		case err != nil:
			return err
		case s.lost > 0:
			return cli.Failedf("%d records lost", s.lost)
		}
		return nil
	})
}

func (c config) check() error {
	switch {
	case c.instances < 1 || c.partitions < 1 || c.records < 1:
		return errors.New("-instances, -partitions and -records must be at least 1")
	case c.rpm < 1 || c.tpm < 1 || c.concurrency < 1:
		return errors.New("-rpm, -tpm and -concurrency must be at least 1")
	case c.window <= 0 || c.latency < 0 || c.lease <= 0:
		return errors.New("-window and -lease must be positive, -latency not negative")
	case c.jitter < 0 || c.jitter > c.latency:
		return errors.New("-jitter must be between 0 and -latency")
	case c.minTokens < 1 || c.maxTokens < c.minTokens:
		return errors.New("-min-tokens must be at least 1 and at most -max-tokens")
	case c.estimate < 1 || c.estimate > c.tpm:
		return fmt.Errorf("-estimate must be between 1 and -tpm (%d)", c.tpm)
	case c.killAt < 0:
		return errors.New("-kill-instance-at must not be negative")
	case c.killAt > 0 && c.instances < 2:
		return errors.New("-kill-instance-at needs at least 2 instances")
	case c.handlerTimeout <= 0 || c.callTime < 0 || c.callTime >= c.handlerTimeout:
		return errors.New("-handler-timeout must be positive, and -call-time at least 0 and less than it")
	case c.headers != "openai" && c.headers != "anthropic":
		return fmt.Errorf("-headers %q: must be openai or anthropic", c.headers)
	case c.provider != "continuous" && c.provider != "sliding" && c.provider != "fixed":
		return fmt.Errorf("-provider %q: must be continuous, sliding or fixed", c.provider)
	}
	return nil
}

// summary is what a run counted.
type summary struct {
	handled, lost int
	twice         int64 // records whose handler returned nil more than once
	cut           int64 // calls sent whose caller's context ended before the answer was read (the fleet's count)
	cutShort      int64 // of them, those sent with less than -call-time left: the Transport's to prevent
	permitWaits   int64 // handler calls with no slot or cost in time (consumer.Stats.PermitTimeouts)
	stats         llmprovider.Stats
	windows       []llmprovider.Tally
	full          []float64 // the binding dimension's share of its limit in each full window, in %
	steadyMin     float64   // the lowest of full[1:], when there are two or more
	killedHeld    int64
	slotsBack     time.Duration // after the kill, once seen (back)
	back          bool
}

const topic = "headway-llm"

func run(ctx context.Context, c config, out io.Writer, log *slog.Logger) (summary, error) {
	if err := c.check(); err != nil {
		return summary{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()

	redisAddr := c.redisAddr
	if redisAddr == "" {
		srv, err := redisenv.Start()
		if err != nil {
			return summary{}, fmt.Errorf("starting Redis: %w", err)
		}
		defer srv.Close()
		redisAddr = srv.Addr()
		fmt.Fprintf(out, "redis:    %s at %s\n", srv.Kind(), redisAddr)
	}
	kc, err := kafkaenv.Start(kafkaenv.Topic(topic, int32(c.partitions)))
	if err != nil {
		return summary{}, fmt.Errorf("starting the embedded Kafka: %w", err)
	}
	defer kc.Close()
	seeds := kc.Addrs()

	var prov *llmprovider.Provider
	target := c.target
	if target == "" {
		headers := llmprovider.OpenAI
		if c.headers == "anthropic" {
			headers = llmprovider.Anthropic
		}
		counting := llmprovider.Continuous
		switch c.provider {
		case "sliding":
			counting = llmprovider.Sliding
		case "fixed":
			counting = llmprovider.Fixed
		}
		prov, err = llmprovider.Start(llmprovider.Config{
			RPM: c.rpm, TPM: c.tpm, Concurrency: int(c.concurrency), Window: c.window, Counting: counting,
			MinTokens: c.minTokens, MaxTokens: c.maxTokens, Seed: c.seed, Latency: c.latency, Jitter: c.jitter,
			Headers: headers,
		})
		if err != nil {
			return summary{}, err
		}
		defer prov.Close()
		target = prov.URL() + "/v1/chat/completions"
		fmt.Fprintf(out, "provider: %s: %d requests and %d tokens per %v (%s, %s's headers), %d in flight; each call %v ± %v, %d–%d tokens, known after it\n",
			target, c.rpm, c.tpm, c.window, counting, headers, c.concurrency, c.latency, c.jitter, c.minTokens, c.maxTokens)
	} else {
		fmt.Fprintf(out, "provider: %s\n", target)
	}
	fmt.Fprintf(out, "fleet:    %d instances; one budget of %d requests and %d tokens per %v, %d slots (lease %v), in Redis; %d tokens taken per call, settled after it\n\n",
		c.instances, c.rpm, c.tpm, c.window, c.concurrency, c.lease, c.estimate)

	produced := make(chan error, 1)
	go func() { produced <- produce(ctx, seeds, c.records, c.partitions) }()

	var (
		handled   sync.Map // record id → struct{}
		nHandled  atomic.Int64
		nTwice    atomic.Int64
		cut       atomic.Int64
		cutShort  atomic.Int64
		inFlight  = make([]atomic.Int64, c.instances) // calls sent, answer not yet closed
		killed    atomic.Int32                        // 1 + the instance killed; 0: none
		base      = &http.Transport{MaxIdleConnsPerHost: 256}
		runErrs   = make(chan error, c.instances)
		stops     = make([]context.CancelFunc, c.instances)
		clients   = make([][]*redis.Client, c.instances)
		consumers = make([]*consumer.Consumer, c.instances)
	)
	defer base.CloseIdleConnections()
	fleetCtx, stopFleet := context.WithCancel(ctx)
	defer stopFleet()
	for i := range c.instances {
		// Each instance its own Redis connections, as separate processes
		// would have: killing one cuts only its own.
		budgetRDB := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
		slotsRDB := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
		clients[i] = []*redis.Client{budgetRDB, slotsRDB}
		defer budgetRDB.Close()
		defer slotsRDB.Close()
		budget, err := bucket.NewBudget(budgetRDB, "llm-demo", []bucket.Dimension{
			{Name: "requests", Limit: c.rpm, Interval: c.window},
			{Name: "tokens", Limit: c.tpm, Interval: c.window},
		})
		if err != nil {
			return summary{}, err
		}
		slots, err := bucket.NewConcurrency(slotsRDB, "llm-demo", c.concurrency, bucket.WithLease(c.lease))
		if err != nil {
			return summary{}, err
		}
		defer slots.Close()
		lim := throttle.New(budget, throttle.WithFailurePolicy(throttle.FailClosed), throttle.WithLogger(log))
		defer lim.Close()
		est := throttle.Cost{"requests": 1, "tokens": c.estimate}
		opts := []httpclient.Option{
			httpclient.WithCost(func(*http.Request) (throttle.Cost, error) { return est, nil }, nil), // nil: tokens = prompt + completion
			httpclient.WithConcurrency(slots),
			// A slot and cost that come too late to leave the call its
			// time before the handler's deadline are not taken (the call
			// would be cut while the provider runs it on), and a call
			// abandoned after its send keeps its slot for that time.
			httpclient.WithCallTime(c.callTime),
			httpclient.WithBase(&counted{base: base, inFlight: &inFlight[i], cut: &cut, cutShort: &cutShort, callTime: c.callTime}),
			httpclient.WithLogger(log),
		}
		if prov != nil {
			// The built-in provider's window is -window, not the minute
			// OpenAI's limit headers mean: take its pauses, not its
			// limits.
			opts = append(opts, httpclient.WithAnswer(func(_ *http.Response, a *throttle.Answer) { a.Limit, a.Window = 0, 0 }))
		}
		tr, err := httpclient.NewTransport(lim, opts...)
		if err != nil {
			return summary{}, err
		}
		h := handler(&http.Client{Transport: tr}, target, c.estimate, func(id string) {
			if _, dup := handled.LoadOrStore(id, struct{}{}); dup {
				nTwice.Add(1)
			} else {
				nHandled.Add(1)
			}
		})
		// No Limiter and no cap for the consumer: the Transport takes the
		// cost and holds the slot (given to both, each call would be
		// charged twice and hold two slots).
		cons, err := consumer.New(h, nil,
			consumer.WithHandlerTimeout(c.handlerTimeout),
			consumer.WithKafka(
				kgo.SeedBrokers(seeds...),
				kgo.ConsumerGroup("headway-llm-demo"),
				kgo.ConsumeTopics(topic),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			),
			consumer.WithRetry(1000, 50*time.Millisecond, 2*time.Second),
			consumer.WithLogger(log),
		)
		if err != nil {
			return summary{}, err
		}
		consumers[i] = cons
		ictx, stop := context.WithCancel(fleetCtx)
		stops[i] = stop
		go func() { runErrs <- cons.Run(ictx) }()
	}

	var s summary
	var runErr error // the run ended before every record was handled
	returned := 0    // consumers whose Run returned
	start := time.Now()
	var killTime time.Time
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	nextLine := start.Add(time.Second)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			// Print what was counted all the same.
			runErr = fmt.Errorf("%d of %d records handled when the run ended: %w", nHandled.Load(), c.records, ctx.Err())
			done = true
		case err := <-produced:
			if err != nil {
				return s, fmt.Errorf("producing: %w", err)
			}
			produced = nil
		case err := <-runErrs:
			returned++
			if killed.Load() == 0 && err != nil && !errors.Is(err, context.Canceled) {
				return s, fmt.Errorf("a consumer stopped: %w", err)
			}
		case now := <-tick.C:
			done = nHandled.Load() >= int64(c.records)
			if k := busiest(inFlight); c.killAt > 0 && killed.Load() == 0 && now.Sub(start) >= c.killAt && inFlight[k].Load() > 0 {
				// Kill the instance with the most calls in flight (once
				// one has a call: the kill comes mid-call): its Redis
				// connections first, so that it gives back nothing and
				// renews nothing.
				s.killedHeld = inFlight[k].Load()
				for _, rdb := range clients[k] {
					_ = rdb.Close()
				}
				stops[k]()
				killed.Store(int32(k + 1))
				killTime = now
				fmt.Fprintf(out, "%5.1fs  instance %d killed holding %d slots\n", now.Sub(start).Seconds(), k, s.killedHeld)
			}
			if !killTime.IsZero() && !s.back {
				var live int64
				for i := range inFlight {
					if i != int(killed.Load())-1 {
						live += inFlight[i].Load()
					}
				}
				if live >= c.concurrency {
					s.slotsBack, s.back = now.Sub(killTime), true
					fmt.Fprintf(out, "%5.1fs  the other instances hold all %d slots again, %.2fs after the kill\n", now.Sub(start).Seconds(), c.concurrency, s.slotsBack.Seconds())
				}
			}
			if now.After(nextLine) {
				nextLine = nextLine.Add(time.Second)
				var fl int64
				for i := range inFlight {
					fl += inFlight[i].Load()
				}
				fmt.Fprintf(out, "%5.1fs  %5d/%d handled, %2d calls in flight\n", now.Sub(start).Seconds(), nHandled.Load(), c.records, fl)
			}
		}
	}
	elapsed := time.Since(start)
	stopFleet()
	for ; returned < c.instances; returned++ {
		<-runErrs
	}
	s.handled = int(nHandled.Load())
	s.twice, s.cut, s.cutShort = nTwice.Load(), cut.Load(), cutShort.Load()
	for _, cons := range consumers {
		s.permitWaits += cons.Stats().PermitTimeouts
	}
	if prov != nil {
		s.handled = int(prov.Stats().Records) // counted where the calls land
	}
	s.lost = c.records - s.handled
	fmt.Fprintf(out, "\nhandled %d of %d records, lost %d, in %.1fs\n", s.handled, c.records, s.lost, elapsed.Seconds())
	fmt.Fprintf(out, "the fleet counted:\n")
	fmt.Fprintf(out, "  handled twice              %d records (the handler returned nil again)\n", s.twice)
	fmt.Fprintf(out, "  cut after their permit     %d calls (sent, then ended by the handler's deadline or the instance's stop)\n", s.cut)
	fmt.Fprintf(out, "  no slot or cost in time    %d handler calls (called again, no attempt used)\n", s.permitWaits)
	if prov == nil {
		return s, runErr
	}
	s.stats = prov.Stats()
	s.windows = prov.Tallies()
	st := s.stats
	fmt.Fprintf(out, "the provider counted, by arrival:\n")
	fmt.Fprintf(out, "  most calls in flight       %d (limit %d; abandoned calls count until they end)\n", st.MaxInFlight, c.concurrency)
	fmt.Fprintf(out, "  most requests in a window  %d (limit %d per %v, %s)\n", st.MaxRequestsInWindow, c.rpm, c.window, c.provider)
	fmt.Fprintf(out, "  most tokens in a window    %d (limit %d per %v, %s)\n", st.MaxTokensInWindow, c.tpm, c.window, c.provider)
	fmt.Fprintf(out, "  refused                    %d (requests %d, tokens %d, concurrency %d): %.1f%% of %d calls accepted\n",
		st.Refused, st.RefusedRequests, st.RefusedTokens, st.RefusedConcurrency, percent(st.Refused, st.Accepted), st.Accepted)
	fmt.Fprintf(out, "  cut after their permit     %d calls (accepted, their caller gone before the answer)\n", st.Cut)
	fmt.Fprintf(out, "  handled twice              %d calls for a record already accepted\n", st.Duplicates)
	if len(s.windows) > 0 {
		var parts []string
		for i, w := range s.windows {
			busy := w.Busy.Seconds() / (float64(c.concurrency) * c.window.Seconds())
			share := 100 * max(float64(w.Requests)/float64(c.rpm), float64(w.Tokens)/float64(c.tpm), busy)
			if i < len(s.windows)-1 {
				s.full = append(s.full, share)
			}
			parts = append(parts, fmt.Sprintf("%d req / %d tok / %.0f%% busy (%.0f%%)", w.Requests, w.Tokens, 100*busy, share))
		}
		fmt.Fprintf(out, "  per window from the first call: %s\n", strings.Join(parts, ", "))
		fmt.Fprintf(out, "  (the last window is partial; busy: the calls' running time over the concurrency limit's; the binding dimension's share of its limit in parentheses)\n")
	}
	// Steady state: the full windows after the first (the start-up's).
	steady := "none (fewer than two full windows)"
	if len(s.full) >= 2 {
		st := slices.Clone(s.full[1:])
		slices.Sort(st)
		s.steadyMin = st[0]
		steady = fmt.Sprintf("%.0f%% lowest, %.0f%% median over %d windows", st[0], st[len(st)/2], len(st))
	}
	fmt.Fprintf(out, "\nsummary: %d accepted, %d refused (%.1f%% of accepted), most in flight %d of %d, binding limit used in steady state %s, %d cut after their permit, %d made twice, %d lost\n",
		st.Accepted, st.Refused, percent(st.Refused, st.Accepted), st.MaxInFlight, c.concurrency, steady, st.Cut, st.Duplicates, s.lost)
	return s, runErr
}

// percent is 100·n/of, 0 when of is 0.
func percent(n, of int64) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}

// handler is one instance's record handler: a plain client.Do, the
// client's Transport doing the accounting (see the package doc).
func handler(client *http.Client, target string, maxTokens int64, done func(id string)) consumer.Handler {
	return func(ctx context.Context, rec *kgo.Record) error {
		id := strconv.Itoa(int(rec.Partition)) + "/" + strconv.FormatInt(rec.Offset, 10)
		body, err := json.Marshal(map[string]any{"model": "demo", "max_tokens": maxTokens, "messages": []map[string]string{{"role": "user", "content": string(rec.Value)}}})
		if err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(llmprovider.RecordHeader, id)
		resp, err := client.Do(req) // ErrTimeout: no slot or cost in time, nothing sent
		if err != nil {
			return err
		}
		defer resp.Body.Close() // settles the cost, gives the slot back
		answer, err := io.ReadAll(resp.Body)
		if err != nil {
			return fmt.Errorf("reading the provider's answer: %w", err)
		}
		if resp.StatusCode/100 != 2 {
			// The consumer calls the handler again after a back-off.
			return fmt.Errorf("the provider answered %s: %.200s", resp.Status, answer)
		}
		done(id)
		return nil
	}
}

// counted is an instance's base RoundTripper: it counts the calls sent
// and not yet answered (their body not closed), and the calls sent that
// their context ended before the answer was read: cut, and cutShort when
// less than callTime was left at the send. A call cut with its time left
// at the send ran longer than callTime says; one sent short is the
// Transport's doing (WithCallTime).
type counted struct {
	base          http.RoundTripper
	inFlight      *atomic.Int64
	cut, cutShort *atomic.Int64
	callTime      time.Duration
}

func (c *counted) RoundTrip(req *http.Request) (*http.Response, error) {
	short := false
	if dl, ok := req.Context().Deadline(); ok {
		short = time.Until(dl) < c.callTime
	}
	c.inFlight.Add(1)
	resp, err := c.base.RoundTrip(req)
	if err != nil {
		c.inFlight.Add(-1)
		if req.Context().Err() != nil {
			c.cutOne(short)
		}
		return nil, err
	}
	resp.Body = &countedBody{ReadCloser: resp.Body, ctx: req.Context(), c: c, short: short}
	return resp, nil
}

// cutOne counts a call cut, sent short or not.
func (c *counted) cutOne(short bool) {
	c.cut.Add(1)
	if short {
		c.cutShort.Add(1)
	}
}

// countedBody ends its call's count in flight when closed.
type countedBody struct {
	io.ReadCloser
	ctx       context.Context
	c         *counted
	short     bool // sent with less than callTime left
	cut, shut bool
	mu        sync.Mutex
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && b.ctx.Err() != nil {
		b.mu.Lock()
		if !b.cut {
			b.cut = true
			b.c.cutOne(b.short)
		}
		b.mu.Unlock()
	}
	return n, err
}

func (b *countedBody) Close() error {
	err := b.ReadCloser.Close()
	b.mu.Lock()
	if !b.shut {
		b.shut = true
		b.c.inFlight.Add(-1)
	}
	b.mu.Unlock()
	return err
}

func produce(ctx context.Context, seeds []string, records, partitions int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(topic))
	if err != nil {
		return err
	}
	defer cl.Close()
	var mu sync.Mutex
	var first error
	for i := range records {
		rec := &kgo.Record{Partition: int32(i % partitions), Key: []byte("doc-" + strconv.Itoa(i)), Value: []byte("summarise document " + strconv.Itoa(i))}
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	return first
}

// busiest returns the instance with the most calls in flight.
func busiest(inFlight []atomic.Int64) int {
	k := 0
	for i := range inFlight {
		if inFlight[i].Load() > inFlight[k].Load() {
			k = i
		}
	}
	return k
}
