// Package faultproxy is a loopback TCP proxy for tests that puts faults
// between a client and a server (redis-server): it can stall connections,
// slow them, reset them, refuse new ones, and drop a reply after the server
// has received the request, the fault that makes a client resend a command
// that already ran.
//
//	p, err := faultproxy.New(srv.Addr())
//	defer p.Close()
//	rdb := redis.NewClient(&redis.Options{Addr: p.Addr()})
//	p.CutReply([]byte("evalsha"), 1) // the next EVALSHA runs, its reply is lost
//
// Faults apply to open connections and to new ones until changed. The proxy
// forwards bytes in chunks as they are read; "a request" is a chunk from
// the client, which for a client that waits for each reply (go-redis
// outside pipelines) is one command.
//
// Every goroutine belongs to the Proxy and ends in Close. A Proxy is safe
// for concurrent use.
package faultproxy

import (
	"bytes"
	"fmt"
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections from its address to a target, with faults.
// Build it with [New].
type Proxy struct {
	target string
	ln     net.Listener
	done   chan struct{}
	wg     sync.WaitGroup

	mu       sync.Mutex
	conns    map[*pair]struct{}
	stalled  chan struct{} // closed when not stalled; nil = not stalled
	latency  time.Duration
	refuse   bool
	cutMatch []byte
	cutLeft  int
	cuts     int
	accepted int
}

// pair is one proxied connection: client side and server side.
type pair struct {
	client, server net.Conn
	dropReply      bool // under Proxy.mu: drop the next server chunk and reset
}

// New starts a proxy on 127.0.0.1 (a free port) to target ("host:port").
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen on 127.0.0.1: %w", err)
	}
	p := &Proxy{target: target, ln: ln, done: make(chan struct{}), conns: map[*pair]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients dial: "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops the proxy: it closes the listener and every connection and
// waits for its goroutines to end. It returns nil; a second Close does
// nothing.
func (p *Proxy) Close() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	close(p.done)
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.close(false)
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// Stall stops forwarding in both directions, on every connection, until
// [Proxy.Resume]: bytes wait in the proxy, as on a network that stopped
// delivering. New connections are accepted but stall too.
func (p *Proxy) Stall() {
	p.mu.Lock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
	p.mu.Unlock()
}

// Resume ends a [Proxy.Stall]: held bytes flow again.
func (p *Proxy) Resume() {
	p.mu.Lock()
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
	p.mu.Unlock()
}

// SetLatency delays every chunk forwarded, in either direction, by d.
// 0 ends the delay.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// Refuse makes the proxy close new connections at once (on) or accept them
// again (off). Open connections are not touched.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

// Reset resets every open connection (a TCP RST to the client) and returns
// how many there were. New connections are accepted as usual.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns)
	for c := range p.conns {
		c.close(true)
	}
	return n
}

// CutReply arms the proxy for the next times requests whose bytes contain
// match: each is forwarded to the server, and the server's reply is
// dropped and the client's connection reset instead of answered. The
// server has run the command; the client cannot tell.
func (p *Proxy) CutReply(match []byte, times int) {
	p.mu.Lock()
	p.cutMatch, p.cutLeft = bytes.Clone(match), times
	p.mu.Unlock()
}

// Cuts returns how many replies CutReply has dropped.
func (p *Proxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// Conns returns how many connections are open through the proxy.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Accepted returns how many connections the proxy has accepted.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		p.accepted++
		refuse := p.refuse
		p.mu.Unlock()
		if refuse {
			_ = c.Close()
			continue
		}
		s, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		pr := &pair{client: c, server: s}
		p.mu.Lock()
		select {
		case <-p.done:
			p.mu.Unlock()
			pr.close(false)
			return
		default:
		}
		p.conns[pr] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(pr, true)
		go p.pipe(pr, false)
	}
}

// close closes both sides; rst makes the client see a reset.
func (c *pair) close(rst bool) {
	if tc, ok := c.client.(*net.TCPConn); ok && rst {
		_ = tc.SetLinger(0)
	}
	_ = c.client.Close()
	_ = c.server.Close()
}

// wait holds a chunk while the proxy is stalled or slowed; false when the
// proxy closes.
func (p *Proxy) wait() bool {
	for {
		p.mu.Lock()
		st, lat := p.stalled, p.latency
		p.mu.Unlock()
		if st != nil {
			select {
			case <-st:
				continue
			case <-p.done:
				return false
			}
		}
		if lat > 0 {
			t := time.NewTimer(lat)
			select {
			case <-t.C:
			case <-p.done:
				t.Stop()
				return false
			}
		}
		return true
	}
}

// pipe forwards one direction of c until either side closes.
func (p *Proxy) pipe(c *pair, up bool) {
	defer p.wg.Done()
	defer func() {
		c.close(false)
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()
	src, dst := c.server, c.client
	if up {
		src, dst = c.client, c.server
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait() {
				return
			}
			chunk := buf[:n]
			p.mu.Lock()
			if up && p.cutLeft > 0 && bytes.Contains(chunk, p.cutMatch) {
				p.cutLeft--
				c.dropReply = true
			}
			drop := !up && c.dropReply
			if drop {
				p.cuts++
			}
			p.mu.Unlock()
			if drop {
				c.close(true)
				return
			}
			if _, werr := dst.Write(chunk); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF, reset or closed: the connection is over either way
		}
	}
}
