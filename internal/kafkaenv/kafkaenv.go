package kafkaenv

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Option configures [Start] and [New].
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	brokers int
	topics  []topic
	fake    []kfake.Opt
}

type topic struct {
	name       string
	partitions int32
}

// Brokers sets how many brokers the cluster runs, each on its own port.
// The default is 1; n must be at least 1.
func Brokers(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 {
			return fmt.Errorf("kafkaenv: Brokers: must be at least 1, got %d", n)
		}
		c.brokers = n
		return nil
	})
}

// Topic creates a topic with the given number of partitions when the
// cluster starts. It may be repeated; for a repeated name the last one wins.
// By default there are no topics, and producing to a missing topic fails
// (unless kfake.AllowAutoTopicCreation is passed through [FakeOpts]).
// partitions must be at least 1.
func Topic(name string, partitions int32) Option {
	return optionFunc(func(c *config) error {
		if name == "" {
			return errors.New("kafkaenv: Topic: empty name")
		}
		if partitions < 1 {
			return fmt.Errorf("kafkaenv: Topic %q: partitions must be at least 1, got %d", name, partitions)
		}
		c.topics = append(c.topics, topic{name, partitions})
		return nil
	})
}

// FakeOpts passes options to kfake.NewCluster after the package's own, so
// they override them.
func FakeOpts(opts ...kfake.Opt) Option {
	return optionFunc(func(c *config) error {
		c.fake = append(c.fake, opts...)
		return nil
	})
}

// groupSessionMin is the shortest session timeout the cluster accepts from a
// group member; kfake's default, like Kafka's, is 6 seconds.
const groupSessionMin = 100 * time.Millisecond

// Cluster is a running kfake cluster. Its methods are safe for concurrent
// use.
type Cluster struct {
	fake  *kfake.Cluster
	addrs []string

	mu       sync.Mutex
	closed   bool
	producer *kgo.Client
	clients  []*kgo.Client
}

// Start starts a kfake cluster whose brokers listen on free 127.0.0.1
// ports, with the topics from [Topic] created; with several brokers,
// partition p of each topic is led by broker p mod [Brokers]. Group
// members may ask for session timeouts down to 100 ms (Kafka's floor is
// 6 s), and KIP-848 consumer groups heartbeat every 100 ms (Kafka's
// default is 5 s). The caller must call [Cluster.Close].
func Start(opts ...Option) (*Cluster, error) {
	cfg := config{brokers: 1}
	for _, o := range opts {
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	fopts := []kfake.Opt{
		kfake.NumBrokers(cfg.brokers),
		kfake.GroupMinSessionTimeout(groupSessionMin),
		kfake.BrokerConfigs(map[string]string{
			"group.consumer.heartbeat.interval.ms": "100",
		}),
	}
	for _, t := range cfg.topics {
		fopts = append(fopts, kfake.SeedTopics(t.partitions, t.name))
	}
	fopts = append(fopts, cfg.fake...)
	fake, err := kfake.NewCluster(fopts...)
	if err != nil {
		return nil, fmt.Errorf("kafkaenv: starting kfake: %w", err)
	}
	// kfake picks each partition's leader at random, so all partitions of a
	// small topic sometimes land on one broker; place partition p on broker
	// p mod n instead, so a test of several brokers always has leaders to
	// move between.
	if cfg.brokers > 1 {
		for _, t := range cfg.topics {
			for p := range t.partitions {
				if err := fake.MoveTopicPartition(t.name, p, p%int32(cfg.brokers)); err != nil {
					fake.Close()
					return nil, fmt.Errorf("kafkaenv: placing %s/%d: %w", t.name, p, err)
				}
			}
		}
	}
	return &Cluster{fake: fake, addrs: fake.ListenAddrs()}, nil
}

// New starts a cluster with [Start] for the test, closes it in t.Cleanup and
// fails the test if it cannot start.
func New(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	c, err := Start(opts...)
	if err != nil {
		t.Fatalf("kafkaenv: %v", err)
		return nil
	}
	t.Cleanup(c.Close)
	return c
}

// Addrs returns the brokers' "127.0.0.1:port" addresses, to use as seed
// brokers.
func (c *Cluster) Addrs() []string { return slices.Clone(c.addrs) }

// Fake returns the kfake cluster, for fault injection (Control, Fault,
// RemoveNode, ...) and inspection (GroupInfo, PartitionInfo, ...). Do not
// close it directly, and do not call its methods after [Cluster.Close]:
// many of them then block forever.
func (c *Cluster) Fake() *kfake.Cluster { return c.fake }

// Client returns a new kgo client seeded with the cluster's brokers, with
// opts applied after the seeds. The caller may close it; [Cluster.Close]
// closes it in any case.
func (c *Cluster) Client(opts ...kgo.Opt) (*kgo.Client, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.addrs...)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafkaenv: client: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		cl.Close()
		return nil, errClosed
	}
	c.clients = append(c.clients, cl)
	return cl, nil
}

var errClosed = errors.New("kafkaenv: cluster closed")

// Produce writes recs to topic, setting each record's Topic, and returns
// once all are acknowledged or one has failed, with the first error. It uses
// one idempotent producer, created on first use, with [FastClientOpts] and
// kgo's default partitioner: records with the same key go to the same
// partition.
func (c *Cluster) Produce(ctx context.Context, topic string, recs ...*kgo.Record) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errClosed
	}
	if c.producer == nil {
		p, err := kgo.NewClient(append(FastClientOpts(), kgo.SeedBrokers(c.addrs...))...)
		if err != nil {
			c.mu.Unlock()
			return fmt.Errorf("kafkaenv: producer: %w", err)
		}
		c.producer = p
	}
	p := c.producer
	c.mu.Unlock()
	for _, r := range recs {
		r.Topic = topic
	}
	if err := p.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("kafkaenv: producing to %s: %w", topic, err)
	}
	return nil
}

// WaitGroupBalanced waits until group is stable with exactly members
// members and every partition of the topics they subscribe to is assigned to
// exactly one of them, then returns the group; it returns ctx's error with
// the last state seen if that does not happen first. It is stricter than
// kfake's WaitGroupStable, which a cooperative group (kgo's default
// balancer) satisfies half-way: after the round in which a member gives
// partitions up and before the round in which another takes them.
func (c *Cluster) WaitGroupBalanced(ctx context.Context, group string, members int) (*kfake.GroupInfo, error) {
	g, err := c.fake.WaitGroupInfo(ctx, group, func(g *kfake.GroupInfo) bool {
		return g != nil && g.State == "Stable" && len(g.Members) == members && c.balanced(g)
	})
	if err != nil {
		return g, fmt.Errorf("kafkaenv: group %s not balanced over %d members: %w", group, members, err)
	}
	return g, nil
}

// balanced reports whether every partition of the topics g's members
// subscribe to is assigned exactly once.
func (c *Cluster) balanced(g *kfake.GroupInfo) bool {
	owners := map[string]map[int32]int{}
	for _, m := range g.Members {
		for _, t := range m.SubscribedTopics {
			if owners[t] == nil {
				owners[t] = map[int32]int{}
			}
		}
		for t, ps := range m.Assignment {
			if owners[t] == nil {
				owners[t] = map[int32]int{}
			}
			for _, p := range ps {
				owners[t][p]++
			}
		}
	}
	for t, ps := range owners {
		infos := c.fake.PartitionInfos(t)
		if len(ps) != len(infos) {
			return false
		}
		for _, pi := range infos {
			if ps[pi.Partition] != 1 {
				return false
			}
		}
	}
	return true
}

// Close closes the clients made by [Cluster.Client] and [Cluster.Produce],
// then the cluster. It may be called more than once.
func (c *Cluster) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	clients := c.clients
	if c.producer != nil {
		clients = append(clients, c.producer)
	}
	c.clients, c.producer = nil, nil
	c.mu.Unlock()
	// Outside the lock: closing a group member talks to the cluster.
	for _, cl := range clients {
		cl.Close()
	}
	c.fake.Close()
}

// FastClientOpts returns kgo options that make a client react quickly, for
// tests: as a group member it heartbeats every 100 ms with a 1.5 s session
// timeout and a 3 s rebalance timeout (kgo's defaults are 3 s, 45 s and
// 60 s), so members join, leave and rebalance in well under a second; its
// fetches wait at most 200 ms for data (default 5 s); and it refreshes
// metadata as often as every 100 ms (default 5 s), so it recovers from a
// moved or failed partition at once. The group settings need a cluster from
// [Start], which accepts short sessions; outside a group they do nothing.
func FastClientOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.SessionTimeout(1500 * time.Millisecond),
		kgo.RebalanceTimeout(3 * time.Second),
		kgo.FetchMaxWait(200 * time.Millisecond),
		kgo.MetadataMinAge(100 * time.Millisecond),
	}
}
