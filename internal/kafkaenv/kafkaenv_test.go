package kafkaenv

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func records(n int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Key: []byte("key-" + strconv.Itoa(i%4)), Value: []byte(strconv.Itoa(i))}
	}
	return recs
}

func TestProduceConsume(t *testing.T) {
	t.Parallel()
	c := New(t, Topic("events", 3))
	ctx := ctxT(t)
	const n = 20
	if err := c.Produce(ctx, "events", records(n)...); err != nil {
		t.Fatalf("Produce: %v", err)
	}

	cl, err := c.Client(kgo.ConsumeTopics("events"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	lastByKey := map[string]int{}
	partByKey := map[string]int32{}
	got := 0
	for got < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records: %v", got, n, err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			got++
			v, _ := strconv.Atoi(string(r.Value))
			k := string(r.Key)
			if last, ok := lastByKey[k]; ok && v <= last {
				t.Errorf("key %s: value %d after %d, order lost", k, v, last)
			}
			if p, ok := partByKey[k]; ok && p != r.Partition {
				t.Errorf("key %s in partitions %d and %d", k, p, r.Partition)
			}
			lastByKey[k], partByKey[k] = v, r.Partition
		})
	}
	if got != n || len(lastByKey) != 4 {
		t.Fatalf("consumed %d records with %d keys, want %d with 4", got, len(lastByKey), n)
	}
	var hw int64
	for _, p := range c.Fake().PartitionInfos("events") {
		hw += p.HighWatermark
	}
	if hw != n {
		t.Fatalf("high watermarks sum to %d, want %d", hw, n)
	}
}

// TestGroup runs two members of one group with FastClientOpts: together they
// consume everything, and when one leaves the other takes over its
// partitions quickly.
func TestGroup(t *testing.T) {
	t.Parallel()
	const (
		topic = "jobs"
		group = "workers"
		parts = 4
		n     = 40
	)
	c := New(t, Topic(topic, parts))
	ctx := ctxT(t)

	var mu sync.Mutex
	seen := map[string]int{}
	member := func() (*kgo.Client, chan struct{}) {
		cl, err := c.Client(append(FastClientOpts(),
			kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				fs := cl.PollFetches(ctx)
				if fs.IsClientClosed() || ctx.Err() != nil {
					return
				}
				fs.EachRecord(func(r *kgo.Record) {
					mu.Lock()
					seen[string(r.Value)]++
					mu.Unlock()
				})
			}
		}()
		return cl, done
	}
	a, aDone := member()
	b, bDone := member()
	defer func() { b.Close(); <-bDone }()

	start := time.Now()
	info, err := c.WaitGroupBalanced(ctx, group, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range info.Members {
		if m.NumAssigned() != parts/2 {
			t.Fatalf("assignment %v, want %d partitions each", info.Members, parts/2)
		}
	}
	t.Logf("group of 2 balanced after %v", time.Since(start))

	if err := c.Produce(ctx, topic, records(n)...); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == n
	}, "all records consumed")

	start = time.Now()
	a.Close()
	<-aDone
	info, err = c.WaitGroupBalanced(ctx, group, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Members) != 1 || info.NumAssigned() != parts {
		t.Fatalf("after a left: %d members holding %d partitions, want 1 holding %d", len(info.Members), info.NumAssigned(), parts)
	}
	t.Logf("rebalance to 1 member took %v", time.Since(start))

	if err := c.Produce(ctx, topic, &kgo.Record{Value: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen["after"] == 1
	}, "the remaining member consumed a new record")
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(t *testing.T, ctx context.Context, cond func() bool, what string) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

func TestBrokers(t *testing.T) {
	t.Parallel()
	c := New(t, Brokers(3), Topic("t", 6))
	addrs := c.Addrs()
	if len(addrs) != 3 {
		t.Fatalf("Addrs() = %v, want 3", addrs)
	}
	leaders := map[int32]bool{}
	for _, p := range c.Fake().PartitionInfos("t") {
		if want := p.Partition % 3; p.Leader != want {
			t.Errorf("partition %d led by broker %d, want %d", p.Partition, p.Leader, want)
		}
		leaders[p.Leader] = true
	}
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("broker address %q is not on 127.0.0.1", a)
		}
	}
	if len(leaders) != 3 {
		t.Fatalf("partitions led by %v, want them spread over the 3 brokers", leaders)
	}
	if err := c.Produce(ctxT(t), "t", records(12)...); err != nil {
		t.Fatal(err)
	}
}

func TestFaultInjection(t *testing.T) {
	t.Parallel()
	c := New(t, Topic("t", 1))
	h := c.Fake().Fault(kfake.Fault{
		Keys:  []kmsg.Key{kmsg.Produce},
		Topic: "t",
		Err:   kerr.NotLeaderForPartition, // retriable: kgo tries again
	})
	if err := c.Produce(ctxT(t), "t", records(3)...); err != nil {
		t.Fatalf("Produce through a retriable fault: %v", err)
	}
	if h.Hits() != 1 {
		t.Fatalf("fault answered %d requests, want 1", h.Hits())
	}
	if hw := c.Fake().PartitionInfo("t", 0).HighWatermark; hw != 3 {
		t.Fatalf("high watermark %d, want 3", hw)
	}
}

func TestProduceUnknownTopic(t *testing.T) {
	t.Parallel()
	c := New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	// kgo retries UNKNOWN_TOPIC_OR_PARTITION a few times, in case the topic
	// is on its way (kgo.UnknownTopicRetries, default 4), then gives up.
	if err := c.Produce(ctx, "missing", records(1)...); !errors.Is(err, kerr.UnknownTopicOrPartition) {
		t.Fatalf("Produce to a missing topic = %v, want UNKNOWN_TOPIC_OR_PARTITION", err)
	}
}

func TestCloseClosesClients(t *testing.T) {
	t.Parallel()
	c, err := Start(Topic("t", 1))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	cl, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Produce(ctx, "t", records(1)...); err != nil {
		t.Fatal(err)
	}
	mine, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	mine.Close() // closing one's own client first is fine
	c.Close()
	c.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "t"}).FirstErr(); !errors.Is(err, kgo.ErrClientClosed) {
		t.Fatalf("client after Close: %v, want kgo.ErrClientClosed", err)
	}
	if _, err := c.Client(); err == nil {
		t.Fatal("Client after Close succeeded")
	}
	if err := c.Produce(ctx, "t", records(1)...); err == nil {
		t.Fatal("Produce after Close succeeded")
	}
}

func TestOptionsValidated(t *testing.T) {
	for _, tc := range []struct {
		opt  Option
		want string
	}{
		{Brokers(0), "Brokers"},
		{Topic("", 1), "Topic"},
		{Topic("t", 0), "partitions"},
	} {
		c, err := Start(tc.opt)
		if err == nil {
			c.Close()
			t.Errorf("Start accepted a bad option; want an error naming %s", tc.want)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %q does not name %s", err, tc.want)
		}
	}
}
