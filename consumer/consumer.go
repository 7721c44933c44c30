package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/throttle"
)

// Handler handles one record. It is called only once a permit has been
// acquired for the attempt, and concurrently for records the ordering
// ([WithOrdering]) lets run together: by default, calls for records with
// the same key never overlap and come in offset order, and calls for
// different keys or partitions run concurrently, up to [WithMaxInFlight]
// at once. A Handler must therefore be safe for concurrent use.
//
// ctx carries the attempt's permit and the values of Run's ctx, and ends
// when the call has run for the handler timeout ([WithHandlerTimeout]). It
// does not end when the partition is revoked or the consumer shuts down:
// the call is allowed to finish (up to that timeout) and its record may
// then be committed. A nil error finishes the record; an error, or a
// panic (see [PanicError]), is retried under [WithRetry]. rec must not be
// kept after the call returns: the consumer clears it.
type Handler func(ctx context.Context, rec *kgo.Record) error

// Consumer consumes Kafka records as a group member and hands each one to
// a [Handler] once a permit from a [throttle.Limiter] allows it. See the
// package documentation for what it guarantees.
//
// Build one with [New], start it with [Consumer.Run], watch it with
// [Consumer.Stats]. Its methods are safe for concurrent use.
type Consumer struct {
	handler Handler
	cfg     config
	log     *slog.Logger

	started atomic.Bool
	// fetchPartBytes, when positive, lowers kgo.FetchMaxPartitionBytes
	// to a quarter of the queue bytes.
	fetchPartBytes int32
	// excludeDeadLetter: WithKafka consumes by pattern, and the
	// dead-letter topic is left out of what the patterns match.
	excludeDeadLetter bool

	// Set by Run before the Kafka client exists, read by callbacks and
	// partition goroutines.
	base    context.Context // Run's ctx, without its cancellation
	runCtx  context.Context // Run's ctx, ended by stopRun too
	stopRun context.CancelCauseFunc

	// sched hands ready records to at most WithMaxInFlight workers.
	sched sched
	// fair chooses the record each permit goes to (WithFairness); nil
	// without it.
	fair *fair
	// prod writes dead letters and parked records; nil without them.
	prod *producer
	// group is the consumer group; topics what the client consumes: the
	// user's topics (or patterns), and the shaping topic.
	group       string
	topics      []string
	shapingView shapingView

	// commitTimeout bounds each commit: at least the handler timeout and
	// defaultCommitTimeout, at most what a rebalance leaves after waiting
	// for handlers (set by check, which may race with a callback). In ns.
	commitTimeout atomic.Int64

	mu    sync.Mutex
	parts map[topicPartition]*partition // owned, running
	// stopping holds, per partition, the earlier ownerships being stopped
	// or abandoned until their goroutines exit: a new ownership waits for
	// all of them, and a revocation that races with a shutdown waits for
	// those not yet fenced.
	stopping map[topicPartition][]*partition
	closing  bool           // Run is shutting down: assign nothing more
	wg       sync.WaitGroup // partition goroutines
	// restored holds the offset maps read with the committed offsets, per
	// partition, until its first records come (offsetmap.go).
	restored map[topicPartition]offsetMap
	// userOnFetched is WithKafka's kgo.OnOffsetsFetched, if any: the
	// consumer's own callback calls it.
	userOnFetched onFetchedFn

	failure atomic.Pointer[error] // first error that stops the consumer

	handled, retried, deadLettered atomic.Int64
	parked                         atomic.Int64
	permitTimeouts, limiterErrors  atomic.Int64
	permitsStale                   atomic.Int64
	permitsUnused                  atomic.Int64 // stale ones included
	refused, restoredSkips         atomic.Int64
	waitingRecords, inFlight       atomic.Int64
	active                         atomic.Int64
	permitWait                     atomic.Int64 // ns
	peakBuffered, peakInFlight     atomic.Int64
	peakBufferedBytes              atomic.Int64
}

type topicPartition struct {
	topic     string
	partition int32
}

// New returns a Consumer that hands records to h at the pace of lim (or of
// the limiter chosen per record by [WithLimiterFor]). The Kafka client is
// described by [WithKafka], which is required; New checks its options
// without connecting, and [Consumer.Run] builds it.
//
// The permit taken for an attempt is passed to h in its context
// ([throttle.Keyed.ContextWithPermit]): a Transport of package
// throttle/httpclient built on the same Limiter uses it for the
// handler's first request, so the call is charged once. Give the same
// Limiter to both. A nil lim (without WithLimiterFor) takes no permits
// here: the handler's own calls take them.
//
// New refuses a nil h, a missing WithKafka, Kafka options without
// brokers, group or topics, WithFairness with nothing to share (a nil lim
// without WithLimiterFor or WithConcurrency), and bad option values with
// an error matching [throttle.ErrInvalid] that names the culprit. A Consumer
// holds no resources until Run.
func New(h Handler, lim *throttle.Limiter, opts ...Option) (*Consumer, error) {
	cfg := newConfig(opts)
	switch {
	case cfg.err != nil:
		return nil, cfg.err
	case h == nil:
		return nil, errs.Invalid("consumer", "Handler", nil, "must not be nil")
	case len(cfg.kafka) == 0:
		return nil, errs.Invalid("consumer", "WithKafka", "none", "must give the brokers, the group and the topics")
	}
	if fc := cfg.fair; fc != nil && fc.reserve != nil {
		switch {
		case lim == nil:
			return nil, fmt.Errorf("consumer: WithFairness UrgentReserve with a nil Limiter given to New: %w: a reserve permit stands for a permit of New's Limiter, which the handler's calls would take again: give New the Limiter over the rest of the provider's limit", throttle.ErrInvalid)
		case fc.reserve == lim:
			return nil, fmt.Errorf("consumer: WithFairness UrgentReserve is the Limiter given to New: %w: give it a Limiter of its own, over a part of the provider's limit, and New's the rest", throttle.ErrInvalid)
		case cfg.limiterFor != nil:
			return nil, fmt.Errorf("consumer: WithFairness UrgentReserve with WithLimiterFor: %w: with a budget per record, give urgent records a budget of their own in WithLimiterFor's function instead", throttle.ErrInvalid)
		}
	}
	if cfg.fair != nil && lim == nil && cfg.limiterFor == nil && cfg.slots == nil {
		return nil, fmt.Errorf("consumer: WithFairness with a nil Limiter given to New: %w: the tenants share permits or calls in flight, and with neither every record goes at once, in its order; give New the Limiter of the provider's limit (or WithLimiterFor, or WithConcurrency)", throttle.ErrInvalid)
	}
	if cfg.limiterFor == nil {
		root := lim.Key("") // the zero Keyed for a nil lim: no permits
		cfg.limiterFor = func(*kgo.Record) throttle.Keyed { return root }
	}
	c := &Consumer{
		handler:  h,
		cfg:      cfg,
		log:      cfg.logger,
		parts:    make(map[topicPartition]*partition),
		stopping: make(map[topicPartition][]*partition),
		restored: make(map[topicPartition]offsetMap),
	}
	c.sched.init(c)
	if cfg.fair != nil {
		c.fair = newFair(c, cfg.fair)
	}
	c.commitTimeout.Store(int64(max(cfg.handlerTimeout, defaultCommitTimeout))) // check caps it
	if err := c.checkKafka(); err != nil {
		return nil, err
	}
	return c, nil
}

// readUserCallbacks keeps the callbacks of WithKafka, read from cl, that
// the consumer replaces with its own, which call them.
func (c *Consumer) readUserCallbacks(cl *kgo.Client) {
	v := cl.OptValue(kgo.OnOffsetsFetched)
	fn, ok := asFunc[onFetchedFn](v)
	if !ok {
		// Not refused (the consumer works without it), but not silent:
		// the user's callback will not be called.
		c.log.Warn("consumer: cannot read kgo.OnOffsetsFetched back from this franz-go release; the callback given in WithKafka will not be called (please report it)", "form", fmt.Sprintf("%T", v))
	}
	c.userOnFetched = fn
}

// clientOpts returns the options of the Kafka client Run builds: the
// consumer's defaults, the user's, then the consumer's own.
func (c *Consumer) clientOpts() []kgo.Opt {
	opts := make([]kgo.Opt, 0, len(c.cfg.kafka)+6)
	opts = append(opts, kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	opts = append(opts, c.cfg.kafka...)
	if c.fetchPartBytes > 0 {
		opts = append(opts, kgo.FetchMaxPartitionBytes(c.fetchPartBytes))
	}
	if c.topics != nil {
		opts = append(opts, kgo.ConsumeTopics(c.topics...))
	}
	if c.excludeDeadLetter {
		opts = append(opts, kgo.ConsumeExcludeTopics("^"+regexp.QuoteMeta(c.cfg.deadLetter)+"$"))
	}
	return append(opts,
		kgo.AutoCommitMarks(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
		kgo.OnOffsetsFetched(c.onOffsetsFetched),
	)
}

// noSeeds stands for the seed brokers when WithKafka names none: kgo's
// own default (127.0.0.1:9092) would hide the omission.
const noSeeds = "headway.no-seed-brokers.invalid:9092"

var errInert = errors.New("consumer: checking options, not connecting")

// checkKafka builds clients from the options, without letting them
// connect, and refuses what the consumer cannot work with: first the
// user's options alone, for what they must name, then with the consumer's
// own, for conflicts; then it keeps the user's callbacks it replaces.
func (c *Consumer) checkKafka() error {
	cl, err := inertClient(append([]kgo.Opt{kgo.SeedBrokers(noSeeds)}, c.cfg.kafka...))
	if err != nil {
		return err
	}
	defer cl.Close()
	seeds, _ := asStrings(cl.OptValue(kgo.SeedBrokers))
	if len(seeds) == 1 && seeds[0] == noSeeds {
		return errs.Invalid("consumer", "kgo.SeedBrokers", "none", "WithKafka must name the brokers")
	}
	// kgo reads an empty address as its default, 127.0.0.1:9092: an unset
	// variable in kgo.SeedBrokers(os.Getenv(...)) would hide there.
	for _, s := range seeds {
		if strings.TrimSpace(s) == "" {
			return errs.Invalid("consumer", "kgo.SeedBrokers", fmt.Sprintf("%q", seeds), "an address is empty: name each broker as host:port")
		}
	}
	if err := c.check(cl); err != nil {
		return err
	}
	c.group, _ = asString(cl.OptValue(kgo.ConsumerGroup))
	// Dead letters consumed again would go round for ever: a topic named
	// is refused, and patterns are told to leave the dead-letter topic
	// out. A setting that cannot be read is not checked.
	if dl := c.cfg.deadLetter; dl != "" {
		topics, ok := asStrings(cl.OptValue(kgo.ConsumeTopics))
		regex, okRegex := asBool(cl.OptValue(kgo.ConsumeRegex))
		if ok && okRegex && !regex && slices.Contains(topics, dl) {
			return errs.Invalid("consumer", "WithDeadLetter topic", dl, "must not be a topic WithKafka consumes: dead letters would come back to the handler")
		}
		c.excludeDeadLetter = okRegex && regex
	}
	if sh := c.cfg.shaping; sh != "" {
		topics, ok := asStrings(cl.OptValue(kgo.ConsumeTopics))
		regex, okRegex := asBool(cl.OptValue(kgo.ConsumeRegex))
		if !ok || !okRegex {
			return fmt.Errorf("consumer: WithShaping: cannot read the consumed topics back from this franz-go release (kgo.ConsumeTopics is %T, kgo.ConsumeRegex %T); please report it, and leave WithShaping out meanwhile",
				cl.OptValue(kgo.ConsumeTopics), cl.OptValue(kgo.ConsumeRegex))
		}
		if slices.Contains(topics, sh) && !regex || sh == c.cfg.deadLetter {
			return errs.Invalid("consumer", "WithShaping topic", sh, "must be a topic of its own: not one WithKafka consumes, nor the dead-letter topic")
		}
		c.topics = append(topics, sh)
		if regex {
			c.topics[len(topics)] = "^" + regexp.QuoteMeta(sh) + "$"
		}
	}
	// A partition's fetch must fit in a quarter of the byte bound; when
	// the setting cannot be read, set it anyway.
	if b, ok := asInt(cl.OptValue(kgo.FetchMaxPartitionBytes)); !ok || b > c.cfg.queueBytes/4 {
		c.fetchPartBytes = int32(min(c.cfg.queueBytes/4, math.MaxInt32))
	}
	full, err := inertClient(c.clientOpts())
	if err != nil {
		return err
	}
	full.Close()
	c.readUserCallbacks(cl)
	return nil
}

// inertClient builds a kgo client that never connects, to read and check
// options.
func inertClient(opts []kgo.Opt) (*kgo.Client, error) {
	opts = append(opts,
		kgo.DialTLSConfig(nil),
		kgo.Dialer(func(context.Context, string, string) (net.Conn, error) { return nil, errInert }),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, errs.Invalid("consumer", "WithKafka", "options", err.Error())
	}
	return cl, nil
}

// Run joins the group, consumes and handles records until ctx ends or a
// record stops the consumer, then shuts down: waits for permits are
// cancelled, in-flight handler calls finish (within the handler timeout),
// what was handled is committed, and the group is left. Run returns after
// every goroutine it started has ended.
//
// While the consumer owns no partition, Run logs a warning after 5 s and
// then at growing intervals (at most every 5 minutes), saying why: no
// broker answers, a topic does not exist, or none is assigned.
//
// Run returns nil after a shutdown caused by ctx; a [*HandlerError] when a
// record failed every attempt and no dead-letter topic is set; an error
// when the Kafka client cannot be built, the dead-letter topic cannot be
// written, the limiter is misconfigured (an error matching
// [throttle.ErrInvalid] that is no refusal of the record's own key), or
// the final commit fails (then the records handled since the last commit
// will be handled again). A record the limiter or the concurrency cap
// refuses for its own key or cost (an error matching
// [throttle.ErrInvalidKey] or [throttle.ErrExceedsLimit]) fails alone,
// at once and without retries, like a record whose attempts all failed:
// it goes to the dead-letter topic, and Run goes on. Run may be called
// only once.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("consumer: Run called twice; build a new Consumer")
	}
	runCtx, stop := c.prepare(ctx)
	defer stop(nil)

	if c.cfg.deadLetter != "" || c.cfg.shaping != "" {
		prod, err := c.newProducer()
		if err != nil {
			return err
		}
		c.prod = prod
	}
	cl, err := kgo.NewClient(c.clientOpts()...)
	if err != nil {
		c.prod.close()
		return fmt.Errorf("consumer: building the Kafka client from WithKafka: %w", err)
	}
	if c.fair != nil {
		// Started once nothing above can return early: shutdown stops it.
		c.fair.start(c.base)
	}
	if err := c.check(cl); err != nil {
		c.fail(err) // ends runCtx: straight to the shutdown below
	} else {
		c.log.Info("consumer: started", "group", cl.OptValue(kgo.ConsumerGroup))
	}

	var helpers sync.WaitGroup
	helpers.Go(func() { c.watchIdle(runCtx, cl) })
	helpers.Go(func() { c.markLoop(runCtx) })
	defer func() {
		stop(nil)
		helpers.Wait()
	}()

	c.poll(runCtx, cl)
	return c.shutdown(cl)
}

// poll fetches records and hands them to their partitions until ctx ends
// or the client is closed.
func (c *Consumer) poll(ctx context.Context, cl *kgo.Client) {
	for ctx.Err() == nil {
		fetches := cl.PollRecords(ctx, c.cfg.pollSize)
		if fetches.IsClientClosed() {
			cl.AllowRebalance()
			return
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			c.log.Warn("consumer: fetch error", "topic", topic, "partition", partition, "err", err)
		})
		// With BlockRebalanceOnPoll no partition callback runs between
		// the poll and AllowRebalance, so the records go to the workers
		// of the assignment they were fetched under. dispatch never
		// blocks: a full partition is paused instead.
		c.dispatch(cl, fetches)
		cl.AllowRebalance()
	}
}

// shutdown stops every partition, commits what they handled, leaves the
// group and waits for the goroutines Run started (but its helpers), and
// returns Run's error: the failure that stopped the consumer, if any,
// else the final commit's.
func (c *Consumer) shutdown(cl *kgo.Client) error {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	stopped := c.stopAll(cl)
	commitErr := c.commit(context.Background(), cl, "shutdown", mapsOf(stopped))
	cl.CloseAllowingRebalance() // leaves the group
	c.prod.close()              // fails the writes of abandoned records
	c.wg.Wait()
	if c.fair != nil {
		c.fair.stop()
	}
	c.sched.stop()
	c.log.Info("consumer: stopped", "handled", c.handled.Load(), "dead_lettered", c.deadLettered.Load())
	if errp := c.failure.Load(); errp != nil {
		return *errp
	}
	return commitErr
}

// markInterval is how often the watermarks of running partitions are
// marked for commit: marks lag finished records by at most this.
const markInterval = 50 * time.Millisecond

// markLoop marks the running partitions' watermarks every markInterval
// until ctx ends. A stopping partition marks its own as it exits.
func (c *Consumer) markLoop(ctx context.Context) {
	t := time.NewTicker(markInterval)
	defer t.Stop()
	var ps []*partition
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		for _, p := range c.parts {
			ps = append(ps, p)
		}
		c.mu.Unlock()
		for _, p := range ps {
			p.flush()
		}
		clear(ps)
		ps = ps[:0]
	}
}

// prepare sets what callbacks and partitions read, before the Kafka client
// exists, and returns Run's own context.
func (c *Consumer) prepare(ctx context.Context) (context.Context, context.CancelCauseFunc) {
	runCtx, stop := context.WithCancelCause(ctx)
	c.base = context.WithoutCancel(ctx)
	c.runCtx, c.stopRun = runCtx, stop
	return runCtx, stop
}

// check refuses client settings the consumer cannot keep its promises
// with.
func (c *Consumer) check(cl *kgo.Client) error {
	// A setting whose form this franz-go release returns differently is
	// not refused: what cannot be read is not checked.
	if g, ok := asString(cl.OptValue(kgo.ConsumerGroup)); ok && g == "" {
		return errs.Invalid("consumer", "kgo.ConsumerGroup", `""`, "WithKafka must name a consumer group: the consumer commits what it handled")
	}
	if topics, ok := asStrings(cl.OptValue(kgo.ConsumeTopics)); ok && len(topics) == 0 {
		return errs.Invalid("consumer", "kgo.ConsumeTopics", "none", "WithKafka must name the topics to consume (or kgo.ConsumeRegex patterns)")
	}
	if id, _ := asString(cl.OptValue(kgo.TransactionalID)); id != "" {
		return errs.Invalid("consumer", "kgo.TransactionalID", id, "transactional clients are not supported")
	}
	n, _ := asInt(cl.OptValue(kgo.RebalanceTimeout))
	rt := time.Duration(n)
	if rt > 0 && c.cfg.handlerTimeout > rt/2 { // not 2*timeout > rt: that overflows for throttle.Forever
		return errs.Invalid("consumer", "WithHandlerTimeout", c.cfg.handlerTimeout,
			fmt.Sprintf("must be at most half the group's rebalance timeout (%v): a rebalance waits for in-flight handlers, then commits", rt))
	}
	if rt > 0 {
		// A rebalance waits for handlers, then commits: the commit has
		// what is left, which is at least the handler timeout.
		c.commitTimeout.Store(min(c.commitTimeout.Load(), int64(rt-c.cfg.handlerTimeout)))
	}
	return nil
}

// fail stops the consumer with err; the first error wins.
func (c *Consumer) fail(err error) {
	if c.failure.CompareAndSwap(nil, &err) {
		c.log.Error("consumer: stopping", "err", err)
	}
	c.stopRun(err)
}

// dispatch hands polled records to their partitions' queues.
func (c *Consumer) dispatch(cl *kgo.Client, fetches kgo.Fetches) {
	fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
		if len(fp.Records) == 0 {
			return
		}
		tp := topicPartition{fp.Topic, fp.Partition}
		var skip []offRun
		c.mu.Lock()
		p := c.parts[tp]
		if p != nil && !p.skipChecked {
			// The first records of this ownership: after the committed
			// offsets were read, and their maps checked (kgo fetches
			// only then). A fetch that starts before the map's offset
			// (kgo.AdjustFetchOffsetsFn rewound it) reads records again
			// on purpose.
			p.skipChecked = true
			if m, ok := c.restored[tp]; ok && fp.Records[0].Offset >= m.base {
				skip = m.runs
			}
			delete(c.restored, tp)
		}
		c.mu.Unlock()
		if p == nil {
			// Not ours (any more): nothing was marked for these
			// records, so whoever owns the partition reads them.
			c.log.Debug("consumer: records for a partition without a worker", "topic", fp.Topic, "partition", fp.Partition, "records", len(fp.Records))
			return
		}
		if skip != nil {
			p.restore(skip)
		}
		p.push(fp.Records)
	})
}

// assigned is the OnPartitionsAssigned callback: one goroutine per new
// partition.
func (c *Consumer) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	if len(assigned) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return
	}
	c.log.Info("consumer: partitions assigned", "partitions", assigned)
	var parks []*partition // partitions that wait for a scan of the shaping topic
	for topic, ids := range assigned {
		for _, id := range ids {
			key := topicPartition{topic, id}
			if c.parts[key] != nil {
				continue
			}
			p := newPartition(c, cl, topic, id)
			// Goroutines of earlier ownerships of this partition may
			// still run (handlers that outlived the handler timeout and
			// were fenced), however many revocations ago: the new one
			// starts only once all have exited, so that calls for one
			// key never overlap.
			p.after = append([]*partition(nil), c.stopping[key]...)
			c.parts[key] = p
			c.wg.Add(1)
			if p.parks {
				parks = append(parks, p)
			} else {
				p.start(nil)
			}
		}
	}
	// One scan serves the partitions new to this member. A partition
	// whose earlier ownership here has not ended has a scan of its own,
	// which waits for that ownership: the others do not wait with it.
	var fresh []*partition
	for _, p := range parks {
		if len(p.after) == 0 {
			fresh = append(fresh, p)
		} else {
			c.startScan(cl, []*partition{p})
		}
	}
	if len(fresh) > 0 {
		c.startScan(cl, fresh)
	}
}

// startScan starts a scan of the shaping topic for ps, and ps behind it;
// c.mu is held.
func (c *Consumer) startScan(cl *kgo.Client, ps []*partition) {
	sc := c.newScan(cl, ps)
	c.wg.Add(1)
	go sc.run(c.runCtx)
	for _, p := range ps {
		p.start(sc)
	}
}

// revoked is the OnPartitionsRevoked callback. It returns only once the
// revoked partitions' goroutines have exited (or been fenced off) and what
// they handled is committed: a mark made after this would outlive the
// partition's ownership, since kgo's MarkCommitRecords does not check it.
// kgo also calls it, with nothing revoked, at the end of every session, and
// with everything when leaving the group.
func (c *Consumer) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	var maps map[topicPartition]offsetMap
	if len(revoked) > 0 {
		c.log.Info("consumer: partitions revoked", "partitions", revoked)
		ps := c.toStopping(revoked)
		c.stopPartitions(ps)
		maps = mapsOf(ps)
		cl.ResumeFetchPartitions(revoked)
	}
	_ = c.commit(ctx, cl, "revoke", maps)
}

// lost is the OnPartitionsLost callback: like revoked, but without a
// commit, which cannot succeed once the partitions belong to someone else.
func (c *Consumer) lost(_ context.Context, cl *kgo.Client, lost map[string][]int32) {
	if len(lost) == 0 {
		return
	}
	c.log.Warn("consumer: partitions lost", "partitions", lost)
	c.stopPartitions(c.toStopping(lost))
	cl.ResumeFetchPartitions(lost)
}

// toStopping moves the partitions named from the running set to the stopping
// set and returns them, with those of them still stopping and not fenced: an
// earlier revocation's, or the shutdown's when a rebalance arrives while Run
// shuts down. A fenced ownership can mark nothing more, so it need not be
// waited for again; the next ownership waits for it.
func (c *Consumer) toStopping(tps map[string][]int32) []*partition {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ps []*partition
	for topic, ids := range tps {
		for _, id := range ids {
			key := topicPartition{topic, id}
			for _, p := range c.stopping[key] {
				if !p.isFenced() {
					ps = append(ps, p)
				}
			}
			if p := c.parts[key]; p != nil {
				delete(c.parts, key)
				c.stopping[key] = append(c.stopping[key], p)
				ps = append(ps, p)
			}
		}
	}
	return ps
}

// exited forgets p, whose goroutines have all exited.
func (c *Consumer) exited(p *partition) {
	key := topicPartition{p.topic, p.id}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.parts[key] == p {
		delete(c.parts, key)
	}
	rest := slices.DeleteFunc(c.stopping[key], func(q *partition) bool { return q == p })
	if len(rest) == 0 {
		delete(c.stopping, key)
	} else {
		c.stopping[key] = rest
	}
}

// stopAll stops every partition, for shutdown, and returns them.
func (c *Consumer) stopAll(cl *kgo.Client) []*partition {
	c.mu.Lock()
	ps := make([]*partition, 0, len(c.parts))
	tps := make(map[string][]int32)
	for key, p := range c.parts {
		ps = append(ps, p)
		tps[key.topic] = append(tps[key.topic], key.partition)
		delete(c.parts, key)
		c.stopping[key] = append(c.stopping[key], p)
	}
	c.mu.Unlock()
	c.stopPartitions(ps)
	if len(tps) > 0 {
		cl.ResumeFetchPartitions(tps)
	}
	return ps
}

// stopPartitions cancels the partitions' waits and waits for their
// goroutines to exit, at most the handler timeout in all. A partition with
// a handler (or dead-letter write) still running then is fenced: its
// handlers' contexts are cancelled and nothing it does will be marked.
func (c *Consumer) stopPartitions(ps []*partition) {
	if len(ps) == 0 {
		return
	}
	for _, p := range ps {
		p.close()
	}
	deadline := time.NewTimer(c.cfg.handlerTimeout)
	defer deadline.Stop()
	expired := false
	for _, p := range ps {
		if !expired {
			select {
			case <-p.done:
				continue
			case <-deadline.C:
				expired = true
			}
		}
		select {
		case <-p.done:
		default:
			p.fence()
			c.log.Warn("consumer: handler still running after the handler timeout; its result will not be committed",
				"topic", p.topic, "partition", p.id, "timeout", c.cfg.handlerTimeout)
		}
	}
}

// commit commits the marked offsets synchronously, within commitTimeout,
// with the offset maps of the partitions just stopped; again without
// them if a broker refuses one as too large.
func (c *Consumer) commit(ctx context.Context, cl *kgo.Client, why string, maps map[topicPartition]offsetMap) error {
	cctx, cancel := context.WithTimeout(ctx, time.Duration(c.commitTimeout.Load()))
	defer cancel()
	err := commitWithMaps(cctx, cl, maps)
	if mapTooLarge(err) {
		c.log.Warn("consumer: the broker refused the offset maps; committing without them (records finished past the watermark will be handled again)", "on", why, "err", err)
		err = cl.CommitMarkedOffsets(cctx)
	}
	if err != nil {
		c.log.Warn("consumer: commit failed; records handled since the last commit will be handled again", "on", why, "err", err)
		return fmt.Errorf("consumer: committing handled offsets on %s: %w", why, err)
	}
	return nil
}

// backoff is the delay before retry n (n ≥ 1): base·2^(n-1), at most max.
// The doubling stops at max, so it never overflows.
func (c *Consumer) backoff(n int) time.Duration {
	return doubling(c.cfg.backoffBase, c.cfg.backoffMax, n)
}

// permitBackoff is the delay before asking the limiter again after n
// failures or timeouts in a row: like backoff, but at most maxPermitDelay,
// so that the end of a store's outage is noticed soon.
func (c *Consumer) permitBackoff(n int) time.Duration {
	return doubling(min(c.cfg.backoffBase, maxPermitDelay), min(c.cfg.backoffMax, maxPermitDelay), n)
}

// doubling returns base·2^(n-1), at most max, for base ≤ max.
func doubling(base, max time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n; i++ {
		if d >= max/2 {
			return max
		}
		d *= 2
	}
	return min(d, max)
}

func (c *Consumer) notePeak(n, bytes int64) {
	raise(&c.peakBuffered, n)
	raise(&c.peakBufferedBytes, bytes)
}

func (c *Consumer) notePeakInFlight(n int64) { raise(&c.peakInFlight, n) }

// raise sets v to n if n is larger.
func raise(v *atomic.Int64, n int64) {
	for {
		old := v.Load()
		if n <= old || v.CompareAndSwap(old, n) {
			return
		}
	}
}
