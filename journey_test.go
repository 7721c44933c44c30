package headway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"sync"
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
	"github.com/headway-go/headway/throttle/httpclient"
)

// The Kafka → API journey as a user writes it: consumer instances in one
// group, each calling the provider through an httpclient.Transport, one
// Redis token bucket, library defaults, and a provider that counts a
// sliding window and answers 429 with Retry-After above it. Each call
// costs one permit: the bucket's grants are the provider's arrivals (the
// Transport's retries after a pause included) and the permits the
// consumers took that no call used (consumer.Stats.PermitsUnused: past
// their margin, or given up for a provider's pause), exactly; the
// handlers' attempts agree with the arrivals.
//
// The provider allows a third of the bucket's limit, so that it refuses
// the first period's calls for certain and the Transport's pause, retry
// and report all run.
//
// Each instance keeps one record in flight (WithMaxInFlight(1)), so that
// the count is exact: with more, a request that finds its instance's
// Transport paused by another request's 429 gives up the permit it holds
// or was just granted (taken before the pause, for a time the provider
// refused) and takes a new one, a grant no call matches, as many as the
// instance had requests between their grant and the pause.
func TestJourneyChargesOnePermitPerCall(t *testing.T) {
	// The same Limiter to the consumer and the Transport: the consumer's
	// permit, passed in the handler's context, serves its request.
	t.Run("same Limiter", func(t *testing.T) { journey(t, true) })
	// The consumer without a Limiter: the Transport takes every permit.
	t.Run("Transport only", func(t *testing.T) { journey(t, false) })
}

func journey(t *testing.T, shared bool) {
	const (
		topic      = "journey"
		partitions = 6
		records    = 36
		keys       = 12
		instances  = 3
		limit      = 30 // the bucket's, per interval
		provLimit  = 10 // the provider's, per interval
		interval   = 200 * time.Millisecond
		latency    = 10 * time.Millisecond
	)
	rs := redisenv.New(t)
	kc := kafkaenv.New(t, kafkaenv.Topic(topic, partitions))
	prov := newSlidingProvider(t, provLimit, interval, latency)

	var (
		attempts atomic.Int64 // handler calls
		// cut counts handler calls that wrote no request and whose wait
		// for a permit in the Transport was stopped: their partition was
		// revoked as the group formed, or Run stopped (the consumer stops
		// the permit waits of a partition it gives up; the handler's
		// context itself runs on). They took no permit and reached no
		// provider.
		cut    atomic.Int64
		grants grantCounter // permits the Limiters' callers got
		mu     sync.Mutex
		tries  = map[string]int{} // record → handler calls so far
	)
	handler := func(client *http.Client) consumer.Handler {
		return func(ctx context.Context, rec *kgo.Record) error {
			attempts.Add(1)
			id := fmt.Sprintf("%d/%d", rec.Partition, rec.Offset)
			mu.Lock()
			tries[id]++
			try := tries[id]
			mu.Unlock()
			q := url.Values{"record": {id}, "try": {strconv.Itoa(try)}}
			var wrote atomic.Int64
			ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
				WroteRequest: func(httptrace.WroteRequestInfo) { wrote.Add(1) },
			})
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, prov.URL+"/call?"+q.Encode(), nil)
			if err != nil {
				return err
			}
			resp, err := client.Do(req)
			if err != nil {
				if wrote.Load() == 0 && errors.Is(err, context.Canceled) {
					cut.Add(1)
				}
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("provider answered %s", resp.Status)
			}
			return nil
		}
	}

	recs := make([]*kgo.Record, records)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Partition: int32(i % partitions), Key: []byte("k" + strconv.Itoa(i%keys)), Value: []byte(strconv.Itoa(i))}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, kc.Produce(ctx, topic, recs...))

	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, instances)
	var fleet []*consumer.Consumer
	for i := range instances {
		// Each instance has its own Redis client, bucket, Limiter and
		// Transport, as separate processes would.
		b, err := bucket.NewTokenBucket(rs.Client(), "journey", limit, interval)
		require.NoError(t, err)
		lim := throttle.New(b, throttle.WithObserver(&grants))
		tr, err := httpclient.NewTransport(lim)
		require.NoError(t, err)
		t.Cleanup(tr.CloseIdleConnections)
		consLim := lim
		if !shared {
			consLim = nil
		}
		c, err := consumer.New(handler(&http.Client{Transport: tr}), consLim,
			consumer.WithKafka(
				kgo.SeedBrokers(kc.Addrs()...),
				kgo.ConsumerGroup("journey"),
				kgo.ConsumeTopics(topic),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
				kgo.ClientID("instance-"+strconv.Itoa(i)),
			),
			consumer.WithMaxInFlight(1),
			consumer.WithLogger(slog.New(slog.DiscardHandler)),
		)
		require.NoError(t, err)
		fleet = append(fleet, c)
		go func() { done <- c.Run(runCtx) }()
	}
	began := time.Now()
	deadline := time.Now().Add(30 * time.Second)
	for prov.records() < records {
		require.True(t, time.Now().Before(deadline), "only %d of %d records accepted after 30 s", prov.records(), records)
		time.Sleep(10 * time.Millisecond) // a poll of the outcome, not synchronisation
	}
	t.Logf("first arrival after %v, all accepted after %v", prov.first().Sub(began), time.Since(began))
	stop()
	for range instances {
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("a consumer stopped with %v", err)
		}
	}

	arrivals, refused, retries := prov.counts()
	var unused int64 // permits the consumers took that no call used
	for _, c := range fleet {
		unused += c.Stats().PermitsUnused
	}
	t.Logf("provider: %d arrivals, %d refused, %d Transport retries; %d handler calls, %d of them cut before they sent; %d permits granted, %d of the consumers' unused", arrivals, refused, retries, attempts.Load(), cut.Load(), grants.n.Load(), unused)
	assert.Equal(t, records, prov.records(), "every record accepted by the provider: none lost")
	assert.Positive(t, refused, "a provider at a third of the bucket's limit refuses")
	assert.EqualValues(t, arrivals, attempts.Load()-cut.Load()+int64(retries), "each handler call not cut before it sent sent one request, each Transport retry one more")
	assert.EqualValues(t, int64(arrivals)+unused, grants.n.Load(), "one permit per call at the provider, and those the consumers took that no call used (past their margin, given up for a provider's pause)")
	assert.LessOrEqual(t, int64(arrivals), grants.granted.Load(), "no call without a permit the bucket granted")
}

// slidingProvider is a provider on loopback that allows limit calls in
// any span of one interval, answers 429 with Retry-After (whole seconds,
// rounded up) above it, and counts every arrival, independently of the
// fleet: per record and handler try, so that a Transport's retry (the
// same try again) is told from a handler's (the next try).
type slidingProvider struct {
	URL string

	mu       sync.Mutex
	accepted []time.Time
	arrivals int
	refused  int
	retries  int            // arrivals of a (record, try) already seen
	seen     map[string]int // record/try → arrivals
	ok       map[string]bool
}

func newSlidingProvider(t *testing.T, limit int, interval, latency time.Duration) *slidingProvider {
	p := &slidingProvider{seen: map[string]int{}, ok: map[string]bool{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		p.mu.Lock()
		now := time.Now()
		p.arrivals++
		try := q.Get("record") + "#" + q.Get("try")
		if p.seen[try]++; p.seen[try] > 1 {
			p.retries++
		}
		from, _ := slices.BinarySearchFunc(p.accepted, now.Add(-interval), func(a, t time.Time) int { return a.Compare(t) })
		full := len(p.accepted)-from >= limit
		var retry time.Duration
		if full {
			p.refused++
			retry = p.accepted[len(p.accepted)-limit].Add(interval).Sub(now)
		} else {
			p.accepted = append(p.accepted, now)
			p.ok[q.Get("record")] = true
		}
		p.mu.Unlock()
		if full {
			w.Header().Set("Retry-After", strconv.Itoa(int((retry+time.Second-1)/time.Second)))
			http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
			return
		}
		time.Sleep(latency) // the call's work
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

func (p *slidingProvider) first() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted[0]
}

// records is how many distinct records the provider accepted.
func (p *slidingProvider) records() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ok)
}

func (p *slidingProvider) counts() (arrivals, refused, retries int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.arrivals, p.refused, p.retries
}

// grantCounter is a throttle.Observer that counts the permits the
// Limiters' callers got (an Acquire that returned nil; a permit a context
// held costs no Acquire, and is not counted again), and, apart, the
// permits the bucket (or the failure policy) granted: at least as many, a
// caller that left while waiting for its place in the period having spent
// one without a call.
type grantCounter struct{ n, granted atomic.Int64 }

func (g *grantCounter) Acquired(_ string, n int64, _ time.Duration, err error) {
	if err == nil {
		g.n.Add(n)
	}
}

func (g *grantCounter) BucketCall(_ string, d throttle.Decision, _ time.Duration, err error) {
	if err == nil && d.Granted {
		g.granted.Add(1) // every Acquire here asks for one permit
	}
}

func (g *grantCounter) Degraded(_, _ string, granted bool, _ error) {
	if granted {
		g.granted.Add(1)
	}
}
