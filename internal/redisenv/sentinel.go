package redisenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the master name a [Sentinel] set monitors.
const SentinelMaster = "headway"

// Sentinel is a real master, one replica of it and one Sentinel watching
// them, each a redis-server on a free loopback port. Kill the master
// ([Sentinel.Master], then Close) and the Sentinel promotes the replica
// within about a second. It needs the redis-server binary: there is no
// stand-in.
type Sentinel struct {
	master, replica *Server
	dir             string
	addr            string
	proc            *proc
}

// StartSentinel starts the master, the replica (replicating the master)
// and the Sentinel, and waits until the Sentinel knows the replica. The
// Sentinel declares the master down after 300 ms without an answer.
func StartSentinel(opts ...Option) (*Sentinel, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	bin, err := findBinary()
	if err != nil {
		return nil, err
	}
	master, err := startReal(bin, cfg, FreePort)
	if err != nil {
		return nil, err
	}
	s := &Sentinel{master: master}
	host, port, _ := net.SplitHostPort(master.Addr())
	rcfg := cfg
	rcfg.args = append(append([]string(nil), cfg.args...), "--replicaof", host, port)
	if s.replica, err = startReal(bin, rcfg, FreePort); err != nil {
		s.Close()
		return nil, err
	}
	if s.dir, err = os.MkdirTemp("", "redisenv-sentinel-*"); err != nil {
		s.Close()
		return nil, fmt.Errorf("redisenv: temporary directory: %w", err)
	}
	sport, err := FreePort()
	if err != nil {
		s.Close()
		return nil, err
	}
	conf := fmt.Sprintf(`port %d
bind 127.0.0.1
protected-mode no
daemonize no
dir %s
logfile %s
sentinel monitor %s %s %s 1
sentinel down-after-milliseconds %s 300
sentinel failover-timeout %s 3000
`, sport, s.dir, filepath.Join(s.dir, logName), SentinelMaster, host, port, SentinelMaster, SentinelMaster)
	cf := filepath.Join(s.dir, "sentinel.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o600); err != nil {
		s.Close()
		return nil, fmt.Errorf("redisenv: sentinel config: %w", err)
	}
	cmd := exec.Command(bin, cf, "--sentinel")
	cmd.Dir = s.dir
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		s.Close()
		return nil, fmt.Errorf("redisenv: starting the sentinel: %w", err)
	}
	s.proc = &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		s.proc.err = cmd.Wait()
		close(s.proc.done)
	}()
	if _, err := waitReady(s.proc, sport, cfg.startTimeout); err != nil {
		tail := logTail(s.dir)
		s.Close()
		return nil, fmt.Errorf("redisenv: sentinel on 127.0.0.1:%d: %w\n--- log tail ---\n%s", sport, err, tail)
	}
	s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(sport))
	if err := s.waitReplica(10 * time.Second); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// waitReplica waits until the replica has synced and the Sentinel lists it.
func (s *Sentinel) waitReplica(timeout time.Duration) error {
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.addr})
	defer sc.Close()
	rc := redis.NewClient(&redis.Options{Addr: s.replica.Addr()})
	defer rc.Close()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		replicas, err := sc.Replicas(ctx, SentinelMaster).Result()
		info, ierr := rc.Info(ctx, "replication").Result()
		cancel()
		if err == nil && ierr == nil && len(replicas) > 0 && infoField(info, "master_link_status") == "up" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redisenv: the sentinel does not list a synced replica after %v (replicas %v, %v; link %q)\n--- sentinel log ---\n%s", timeout, replicas, err, infoField(info, "master_link_status"), logTail(s.dir))
		}
		time.Sleep(50 * time.Millisecond) // polls an outcome, bounded
	}
}

// Master is the server that was master at the start.
func (s *Sentinel) Master() *Server { return s.master }

// Replica is the server that replicates the master at the start.
func (s *Sentinel) Replica() *Server { return s.replica }

// Addr is the Sentinel's "127.0.0.1:port".
func (s *Sentinel) Addr() string { return s.addr }

// FailoverOptions are options for a go-redis failover client that finds
// the master through the Sentinel.
func (s *Sentinel) FailoverOptions() *redis.FailoverOptions {
	return &redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: []string{s.addr}}
}

// KillMaster stops the master (SIGKILL), for the Sentinel to promote the
// replica.
func (s *Sentinel) KillMaster() error { return s.master.Close() }

// ReplicaAddr is the replica's "127.0.0.1:port".
func (s *Sentinel) ReplicaAddr() string { return s.replica.Addr() }

// Close stops the Sentinel and both servers and removes their files.
func (s *Sentinel) Close() {
	if s.proc != nil {
		s.proc.kill()
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
	if s.replica != nil {
		s.replica.Close()
	}
	if s.master != nil {
		s.master.Close()
	}
}

// NewSentinel starts a [Sentinel] set for t and closes it when t ends. It
// fails t (under HEADWAY_REQUIRE_REDIS=1) or skips it without a
// redis-server binary.
func NewSentinel(t testing.TB, opts ...Option) *Sentinel {
	t.Helper()
	quietClientLog()
	if _, err := findBinary(); err != nil {
		needBinary(t, "a Sentinel failover")
	}
	s, err := StartSentinel(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}
