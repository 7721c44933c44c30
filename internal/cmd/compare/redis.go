package main

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a redis-server this program started for its run.
type redisServer struct {
	addr string
	cmd  *exec.Cmd
}

// startRedis starts redis-server on a free loopback port, without
// persistence, and waits (at most 5 s) until it answers PING.
func startRedis(ctx context.Context) (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found (install it, or pass -redis host:port): %w", err)
	}
	// Ask the kernel for a free port. Another process could take it
	// before redis-server binds it; then PING fails and we say so.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--logfile", "")
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting redis-server: %w", err)
	}
	s := &redisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: cmd}
	rdb := redis.NewClient(&redis.Options{Addr: s.addr})
	defer rdb.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := rdb.Ping(ctx).Err()
		if err == nil {
			return s, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.close()
			return nil, fmt.Errorf("redis-server on %s did not answer within 5s: %w", s.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// close stops the server.
func (s *redisServer) close() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}
