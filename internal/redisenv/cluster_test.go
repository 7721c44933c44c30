package redisenv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestCluster(t *testing.T) {
	t.Parallel()
	c := NewCluster(t)
	ctx := ctxT(t)

	if n := len(c.Addrs()); n != 3 {
		t.Fatalf("%d addresses, want 3", n)
	}
	for _, n := range c.Nodes() {
		info, err := n.Client().ClusterInfo(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := infoField(info, "cluster_state"); got != "ok" {
			t.Fatalf("%s: cluster_state:%s", n.Addr(), got)
		}
	}

	cc := c.Client()
	const keys = 60
	for i := range keys {
		if err := cc.Set(ctx, fmt.Sprintf("key-%d", i), i, 0).Err(); err != nil {
			t.Fatalf("SET key-%d: %v", i, err)
		}
	}
	for i := range keys {
		got, err := cc.Get(ctx, fmt.Sprintf("key-%d", i)).Int()
		if err != nil || got != i {
			t.Fatalf("GET key-%d = %d, %v", i, got, err)
		}
	}

	// Every master holds some of the keys, so all three served writes.
	var mu sync.Mutex
	sizes := map[string]int64{}
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		mu.Lock()
		sizes[m.Options().Addr] = n
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for addr, n := range sizes {
		if n == 0 {
			t.Errorf("master %s holds no keys", addr)
		}
		total += n
	}
	if len(sizes) != 3 || total != keys {
		t.Fatalf("masters hold %v, want 3 masters holding %d keys in all", sizes, keys)
	}
}

func TestClusterClose(t *testing.T) {
	t.Parallel()
	c := NewCluster(t)
	cc := c.Client()
	nodes := c.Nodes()
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := cc.Ping(context.Background()).Err(); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("client after Close: %v, want closed", err)
	}
	for _, n := range nodes {
		select {
		case <-n.proc.done:
		default:
			t.Errorf("node %s not reaped", n.Addr())
		}
	}
}

// TestClusterNodeRestart restarts one master: it comes back as the same node,
// owning the same slots, empty, and the cluster serves every slot again.
func TestClusterNodeRestart(t *testing.T) {
	t.Parallel()
	c := NewCluster(t)
	ctx := ctxT(t)
	cc := c.Client()
	const keys = 30
	for i := range keys {
		if err := cc.Set(ctx, fmt.Sprintf("key-%d", i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	node := c.Nodes()[1]
	id, err := node.Client().ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	held, err := node.Client().DBSize(ctx).Result()
	if err != nil || held == 0 {
		t.Fatalf("node holds %d keys (%v); the test needs some", held, err)
	}

	start := time.Now()
	if err := node.Restart(); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	nc := node.Client()
	if got, err := nc.ClusterMyID(ctx).Result(); err != nil || got != id {
		t.Fatalf("node id after Restart = %q, %v; want %q", got, err, id)
	}
	if n, err := nc.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE after Restart = %d, %v; want 0", n, err)
	}

	// Poll until every key reads back or reads as missing: the restarted
	// master waits before it serves, and the others reconnect to it.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		missing, err := readAll(ctx, cc, keys)
		if err == nil {
			if missing != held {
				t.Fatalf("%d keys lost, want the %d the node held", missing, held)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("cluster not serving again: %v", err)
		case <-tick.C:
		}
	}
	t.Logf("cluster serving again %v after Restart", time.Since(start))
}

// readAll reads key-0 ... key-(n-1) and counts the missing ones.
func readAll(ctx context.Context, cc *redis.ClusterClient, n int) (missing int64, err error) {
	for i := range n {
		err := cc.Get(ctx, fmt.Sprintf("key-%d", i)).Err()
		switch {
		case errors.Is(err, redis.Nil):
			missing++
		case err != nil:
			return 0, err
		}
	}
	return missing, nil
}
