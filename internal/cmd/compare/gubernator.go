package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gubernator-io/gubernator/v2"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// gubernatorOpts says how a Gubernator contender is run: how many daemons
// form its cluster, which algorithm, which behaviour.
type gubernatorOpts struct {
	nodes     int
	algorithm gubernator.Algorithm
	behavior  gubernator.Behavior
}

// gubernatorContender builds a contender that runs Gubernator daemons in
// this process, with their default settings, and asks them through their
// gRPC client, as a service written in any language would.
func gubernatorContender(name, note string, o gubernatorOpts) contender {
	g := periods
	if o.algorithm == gubernator.Algorithm_LEAKY_BUCKET {
		g = gcra // burst = limit, its default
	}
	return contender{
		name: name, note: note, guarantee: g,
		build: func(s setup) (acquirer, error) {
			c, err := startGubernator(context.Background(), o.nodes)
			if err != nil {
				return nil, err
			}
			return &gubernatorAcq{
				cluster: c,
				calls:   s.calls,
				key:     s.key,
				limit:   s.limit,
				period:  s.interval,
				opts:    o,
			}, nil
		},
	}
}

// gubernatorCluster is n Gubernator daemons on loopback ports that know
// each other as peers, and one gRPC client to each.
type gubernatorCluster struct {
	daemons []*gubernator.Daemon
	conns   []*grpc.ClientConn
	clients []gubernator.V1Client
}

// startGubernator spawns n daemons with Gubernator's default behaviours
// (peer discovery "none": this program hands each the peer list), each
// listening on 127.0.0.1, and dials each. Their logs are dropped: a
// warning that discovery is "none" at every start, and an error for each
// forwarded call the end of a run cancels; what a caller is told is
// counted as refused or failed like any contender's.
func startGubernator(ctx context.Context, n int) (*gubernatorCluster, error) {
	log := logrus.New()
	log.SetOutput(io.Discard)
	c := &gubernatorCluster{}
	var peers []gubernator.PeerInfo
	for i := range n {
		d, err := spawnDaemon(ctx, log, i)
		if err != nil {
			c.close(daemonCloseWait)
			return nil, err
		}
		c.daemons = append(c.daemons, d)
		peers = append(peers, d.PeerInfo)
	}
	for _, d := range c.daemons {
		d.SetPeers(peers)
	}
	for _, d := range c.daemons {
		// The options of gubernator.DialV1Server, the client its users
		// are pointed to, with a connection this program can close.
		conn, err := grpc.NewClient(d.PeerInfo.GRPCAddress,
			grpc.WithStatsHandler(otelgrpc.NewClientHandler()),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			c.close(daemonCloseWait)
			return nil, fmt.Errorf("gubernator: dialing %s: %w", d.PeerInfo.GRPCAddress, err)
		}
		c.conns = append(c.conns, conn)
		c.clients = append(c.clients, gubernator.NewV1Client(conn))
	}
	return c, nil
}

// spawnDaemon starts daemon i on a free loopback port. The port is found
// by listening on port 0 and closing; another process may take it before
// the daemon binds it, so a failed start is tried again, three times.
func spawnDaemon(ctx context.Context, log *logrus.Logger, i int) (*gubernator.Daemon, error) {
	var err error
	for range 3 {
		var addr string
		if addr, err = freeAddr(); err != nil {
			return nil, err
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var d *gubernator.Daemon
		d, err = gubernator.SpawnDaemon(sctx, gubernator.DaemonConfig{
			GRPCListenAddress: addr,
			HTTPListenAddress: "127.0.0.1:0",
			AdvertiseAddress:  addr,
			PeerDiscoveryType: "none",
			InstanceID:        fmt.Sprintf("compare-%d", i),
			Logger:            log.WithField("daemon", i),
		})
		cancel()
		if err == nil {
			d.PeerInfo = gubernator.PeerInfo{GRPCAddress: addr, HTTPAddress: d.HTTPListener.Addr().String()}
			return d, nil
		}
		if d != nil {
			closeWithin(daemonCloseWait, d.Close)
		}
	}
	return nil, fmt.Errorf("gubernator: starting daemon %d: %w", i, err)
}

// freeAddr returns a loopback address with a port the kernel just had free.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// daemonCloseWait bounds the close of one run's daemons.
const daemonCloseWait = 5 * time.Second

// errCloseTimeout reports a close that did not return in time.
var errCloseTimeout = errors.New("did not return in time; left running")

// closeWithin runs fn and waits at most d for it to return.
//
// Gubernator v2.13.0's Daemon.Close can block forever after GLOBAL
// traffic: closing stops its global manager, whose loop stops its sync
// timer (an Interval) and waits for the timer's goroutine, and that
// goroutine can be stuck sending a tick into a full channel that only the
// stopped loop reads. A harness that waited would hang; this one gives up
// after d and reports it, leaving that goroutine and whatever it holds
// behind (a leak until the process exits, which it then does).
func closeWithin(d time.Duration, fn func()) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return fmt.Errorf("%w (%v)", errCloseTimeout, d)
	}
}

// close closes the clients, then every daemon at once, waiting at most d
// in all; it names the daemons whose Close did not return.
func (c *gubernatorCluster) close(d time.Duration) error {
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	closes := make([]func(), len(c.daemons))
	for i, dm := range c.daemons {
		closes[i] = dm.Close
	}
	return closeAll(d, closes)
}

// closeAll runs every close at once, each bounded by d (see closeWithin),
// and names, by index, those that did not return.
func closeAll(d time.Duration, closes []func()) error {
	errs := make([]error, len(closes))
	var wg sync.WaitGroup
	for i, fn := range closes {
		wg.Go(func() {
			if err := closeWithin(d, fn); err != nil {
				errs[i] = fmt.Errorf("gubernator daemon %d: Close %w", i, err)
			}
		})
	}
	wg.Wait()
	var msgs []string
	for _, err := range errs {
		if err != nil {
			msgs = append(msgs, err.Error())
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return errors.New(strings.Join(msgs, "; "))
}

// gubernatorAcq asks Gubernator for one hit at a time. Gubernator has no
// wait of its own: a refused caller sleeps until the reset_time it was
// told (at least 1 ms, so that a reset already past does not spin) and
// asks again, and gives up at once when that is beyond its wait. Calls go
// round robin over the cluster's daemons, as behind a load balancer.
type gubernatorAcq struct {
	cluster *gubernatorCluster
	key     string
	limit   int64
	period  time.Duration
	opts    gubernatorOpts
	calls   *counter
	next    atomic.Uint32
}

func (g *gubernatorAcq) acquire(ctx context.Context, maxWait time.Duration, decided *decision) (bool, error) {
	deadline := time.Now().Add(maxWait)
	for {
		cl := g.cluster.clients[int(g.next.Add(1))%len(g.cluster.clients)]
		req := &gubernator.RateLimitReq{
			Name:      "compare",
			UniqueKey: g.key,
			Hits:      1,
			Limit:     g.limit,
			Duration:  g.period.Milliseconds(),
			Algorithm: g.opts.algorithm,
			Behavior:  g.opts.behavior,
		}
		at := time.Now()
		g.calls.n.Add(1)
		resp, err := cl.GetRateLimits(ctx, &gubernator.GetRateLimitsReq{Requests: []*gubernator.RateLimitReq{req}})
		if err != nil {
			return false, err
		}
		if len(resp.Responses) != 1 {
			return false, fmt.Errorf("gubernator: %d responses to one request", len(resp.Responses))
		}
		r := resp.Responses[0]
		if r.Error != "" {
			return false, fmt.Errorf("gubernator: %s", r.Error)
		}
		if r.Status == gubernator.Status_UNDER_LIMIT {
			decided.at = at
			return true, nil
		}
		wait := max(time.Until(time.UnixMilli(r.ResetTime)), time.Millisecond)
		if time.Now().Add(wait).After(deadline) {
			return false, nil
		}
		if !sleep(ctx, wait) {
			return false, ctx.Err()
		}
	}
}

func (g *gubernatorAcq) close() error { return g.cluster.close(daemonCloseWait) }
