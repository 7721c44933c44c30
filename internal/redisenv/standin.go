package redisenv

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// standIn is the in-process stand-in: a miniredis reached through a
// listener of its own (front), which moves the miniredis's clock when a
// command arrives.
//
// Why: Redis judges a key's expiry, for a whole command or script, at the
// time it started, so a key a script sees alive stays alive until the
// script ends. miniredis with ClockTTL moves its clock on every key access
// instead, even within a script: a script that read TIME just before a
// key's deadline could find the key gone a moment later, which Redis never
// does (window.lua then started a full window afresh). So the stand-in's
// clock is set (miniredis SetTime, which TIME, PEXPIREAT and ClockTTL
// follow) to the wall clock each time bytes of a command arrive, never
// backwards; SetTime waits for miniredis's lock, so the clock stands still
// while a command or script runs. TIME in a command is thus the time it
// arrived, at most the time it runs.
type standIn struct {
	mini  *miniredis.Miniredis
	front net.Listener
	done  chan struct{} // closed when the accept loop has ended

	mu   sync.Mutex
	last time.Time     // the clock last set, wall time only
	gate chan struct{} // non-nil while paused: see hold
}

// newStandIn starts a stand-in answering on addr ("127.0.0.1:0" for a free
// port).
func newStandIn(addr string) (*standIn, error) {
	m := miniredis.NewMiniRedis()
	// Keys expire as the clock set by tick moves; without ClockTTL they
	// would expire only when told to, and a token bucket's period would
	// never end.
	m.ClockTTL(true)
	// miniredis's own listener: never handed out, every client comes
	// through front.
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("redisenv: starting the stand-in: %w", err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("redisenv: starting the stand-in on %s: %w", addr, err)
	}
	s := &standIn{mini: m, front: l, done: make(chan struct{})}
	s.tick()
	go s.accept()
	return s, nil
}

// accept hands each connection to miniredis until front is closed.
func (s *standIn) accept() {
	defer close(s.done)
	for {
		c, err := s.front.Accept()
		if err != nil {
			return
		}
		s.mini.Server().ServeConn(&clockConn{Conn: c, s: s})
	}
}

// tick sets the stand-in's clock to the wall clock, unless that would move
// it back.
func (s *standIn) tick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := time.Now().Round(0); now.After(s.last) {
		s.last = now
	}
	s.mini.SetTime(s.last)
}

// hold makes commands that arrive wait until gate is closed before they
// read the clock (nil: no longer paused), as a stopped server reads them
// only once it runs again: their TIME is after the pause.
func (s *standIn) hold(gate chan struct{}) {
	s.mu.Lock()
	s.gate = gate
	s.mu.Unlock()
}

// arrived is called as bytes of a command arrive: it waits out a pause,
// then sets the clock.
func (s *standIn) arrived() {
	s.mu.Lock()
	gate := s.gate
	s.mu.Unlock()
	if gate != nil {
		<-gate
	}
	s.tick()
}

// close stops accepting, then closes miniredis and with it every
// connection it serves.
func (s *standIn) close() {
	_ = s.front.Close()
	<-s.done
	s.mini.Close()
}

// clockConn is a client's connection to the stand-in: what it reads is a
// command arriving, which sets the clock.
type clockConn struct {
	net.Conn
	s *standIn
}

func (c *clockConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.s.arrived()
	}
	return n, err
}
