//go:build gubernator

package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/gubernator-io/gubernator/v2"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// gubernatorBuilt: this program was built with -tags gubernator, and
// runs Gubernator's contenders itself.
const gubernatorBuilt = true

// buildGubernator starts the daemons of a contender run as o says, with
// their default settings, and returns an acquirer that asks them through
// their gRPC client, as a service written in any language would.
func buildGubernator(o gubernatorOpts, s setup) (acquirer, error) {
	c, err := startGubernator(context.Background(), o.nodes)
	if err != nil {
		return nil, err
	}
	algorithm, behavior := gubernator.Algorithm_TOKEN_BUCKET, gubernator.Behavior_BATCHING
	if o.leaky {
		algorithm = gubernator.Algorithm_LEAKY_BUCKET
	}
	if o.global {
		behavior = gubernator.Behavior_GLOBAL
	}
	return &gubernatorAcq{
		cluster:   c,
		calls:     s.calls,
		key:       s.key,
		limit:     s.limit,
		period:    s.interval,
		algorithm: algorithm,
		behavior:  behavior,
	}, nil
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

// gubernatorAcq asks Gubernator for one hit at a time. Gubernator has no
// wait of its own: a refused caller sleeps until the reset_time it was
// told (at least 1 ms, so that a reset already past does not spin) and
// asks again, and gives up at once when that is beyond its wait. Calls go
// round robin over the cluster's daemons, as behind a load balancer.
type gubernatorAcq struct {
	cluster   *gubernatorCluster
	key       string
	limit     int64
	period    time.Duration
	algorithm gubernator.Algorithm
	behavior  gubernator.Behavior
	calls     *counter
	next      atomic.Uint32
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
			Algorithm: g.algorithm,
			Behavior:  g.behavior,
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
