package redisenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	clusterMasters = 3
	clusterSlots   = 16384
	// busOffset is how far above its port a cluster node listens for the
	// cluster bus, Redis's default.
	busOffset = 10000
)

// Cluster is a real Redis Cluster of three masters without replicas, each a
// [Server] on 127.0.0.1. Its methods are safe for concurrent use.
type Cluster struct {
	nodes []*Server

	mu      sync.Mutex
	closed  bool
	clients []*redis.ClusterClient
}

// StartCluster starts three redis-server processes in cluster mode (node
// timeout 2 s), introduces them to each other with CLUSTER MEET, gives each
// a third of the slots with CLUSTER ADDSLOTSRANGE (Redis 7 or later) and
// waits, up to [StartTimeout], until every node reports cluster_state:ok and
// all three see the same three connected masters owning the same slots.
// Each node's port p has p+10000 free for the cluster bus.
//
// There is no stand-in: without a binary the error wraps [ErrNoRedisServer].
// The caller must call [Cluster.Close].
func StartCluster(opts ...Option) (*Cluster, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	bin, err := binary(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w; Redis Cluster has no in-process stand-in", err)
	}
	nodeCfg := cfg
	nodeCfg.args = append([]string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "2000",
		"--cluster-announce-ip", "127.0.0.1",
	}, cfg.args...)

	c := &Cluster{}
	for range clusterMasters {
		s, err := startReal(bin, nodeCfg, freeClusterPort)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.nodes = append(c.nodes, s)
	}
	if err := c.form(cfg.startTimeout); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// freeClusterPort returns a free port p no higher than 55535 with p+10000
// free too.
func freeClusterPort() (int, error) {
	for range 100 {
		p, err := FreePort()
		if err != nil {
			return 0, err
		}
		if p+busOffset > 65535 {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+busOffset)))
		if err != nil {
			continue
		}
		if err := l.Close(); err != nil {
			return 0, fmt.Errorf("redisenv: free port: %w", err)
		}
		return p, nil
	}
	return 0, errors.New("redisenv: no free port p with p+10000 also free after 100 tries")
}

// form joins the started nodes into one cluster and waits until they agree.
func (c *Cluster) form(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	admins := make([]*redis.Client, len(c.nodes))
	for i, n := range c.nodes {
		admins[i] = redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
	}
	defer func() {
		for _, a := range admins {
			a.Close()
		}
	}()

	// Distinct config epochs up front, as redis-cli --cluster create does,
	// spare the nodes resolving epoch collisions after they meet.
	for i, a := range admins {
		if err := a.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("redisenv: CLUSTER SET-CONFIG-EPOCH on %s: %w", c.nodes[i].Addr(), err)
		}
	}
	for i, a := range admins {
		for j, n := range c.nodes {
			if i == j {
				continue
			}
			if err := a.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(n.port)).Err(); err != nil {
				return fmt.Errorf("redisenv: CLUSTER MEET %s from %s: %w", n.Addr(), c.nodes[i].Addr(), err)
			}
		}
	}
	for i, a := range admins {
		lo, hi := i*clusterSlots/len(admins), (i+1)*clusterSlots/len(admins)-1
		if err := a.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return fmt.Errorf("redisenv: CLUSTER ADDSLOTSRANGE %d %d on %s: %w", lo, hi, c.nodes[i].Addr(), err)
		}
	}

	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		why := c.disagreement(ctx, admins)
		if why == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redisenv: cluster %v did not form within %v: %s", c.Addrs(), timeout, why)
		case <-tick.C:
		}
	}
}

// disagreement returns why the nodes do not yet form one healthy cluster,
// or "" when they do.
func (c *Cluster) disagreement(ctx context.Context, admins []*redis.Client) string {
	var first string
	for i, a := range admins {
		addr := c.nodes[i].Addr()
		info, err := a.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Sprintf("CLUSTER INFO on %s: %v", addr, err)
		}
		for _, want := range []string{
			"cluster_state:ok",
			"cluster_slots_assigned:" + strconv.Itoa(clusterSlots),
			"cluster_known_nodes:" + strconv.Itoa(len(admins)),
			"cluster_size:" + strconv.Itoa(len(admins)),
		} {
			name, _, _ := strings.Cut(want, ":")
			if got := infoField(info, name); name+":"+got != want {
				return fmt.Sprintf("%s says %s:%s, want %s", addr, name, got, want)
			}
		}
		nodes, err := a.ClusterNodes(ctx).Result()
		if err != nil {
			return fmt.Sprintf("CLUSTER NODES on %s: %v", addr, err)
		}
		view, err := slotView(nodes)
		if err != nil {
			return fmt.Sprintf("%s: %v", addr, err)
		}
		if i == 0 {
			first = view
		} else if view != first {
			return fmt.Sprintf("%s sees %q, %s sees %q", c.nodes[0].Addr(), first, addr, view)
		}
	}
	return ""
}

// slotView reduces CLUSTER NODES output to "address slots" lines, sorted,
// failing on any node that is not a connected, healthy master.
func slotView(nodes string) (string, error) {
	var lines []string
	for line := range strings.Lines(nodes) {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		// id addr flags master ping pong epoch link-state slot...
		addr, flags, link := f[1], f[2], f[7]
		fs := strings.Split(flags, ",")
		for _, bad := range []string{"handshake", "fail", "fail?", "noaddr"} {
			if slices.Contains(fs, bad) {
				return "", fmt.Errorf("node %s has flags %s", addr, flags)
			}
		}
		if !slices.Contains(fs, "master") || link != "connected" {
			return "", fmt.Errorf("node %s: flags %s, link %s", addr, flags, link)
		}
		addr, _, _ = strings.Cut(addr, "@")
		lines = append(lines, addr+" "+strings.Join(f[8:], " "))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n"), nil
}

// Addrs returns the masters' "127.0.0.1:port" addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Nodes returns the masters, to pause, resume or restart one of them. Close
// them only through [Cluster.Close].
func (c *Cluster) Nodes() []*Server { return slices.Clone(c.nodes) }

// ClusterOptions returns new go-redis cluster options seeded with every
// master, to adjust before calling redis.NewClusterClient. The caller owns
// the resulting client.
func (c *Cluster) ClusterOptions() *redis.ClusterOptions {
	return &redis.ClusterOptions{Addrs: c.Addrs()}
}

// Client returns a new go-redis cluster client with default options. The
// caller may close it; [Cluster.Close] closes it in any case.
func (c *Cluster) Client() *redis.ClusterClient {
	cl := redis.NewClusterClient(c.ClusterOptions())
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		cl.Close()
		return cl
	}
	c.clients = append(c.clients, cl)
	return cl
}

// Close closes the clients made by [Cluster.Client] and closes every node.
// It may be called more than once; later calls return nil.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	for _, cl := range c.clients {
		_ = cl.Close()
	}
	c.clients = nil
	var errs []error
	for _, n := range c.nodes {
		errs = append(errs, n.Close())
	}
	return errors.Join(errs...)
}
