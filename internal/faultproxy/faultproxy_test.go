package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo is a line server that answers each line with "ok <line>" and counts
// the lines it got.
type echo struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	lines int
	conns []net.Conn
}

func newEcho(t *testing.T) *echo {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echo{ln: ln}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.conns = append(e.conns, c)
			e.mu.Unlock()
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				r := bufio.NewReader(c)
				for {
					l, err := r.ReadString('\n')
					if err != nil {
						return
					}
					e.mu.Lock()
					e.lines++
					e.mu.Unlock()
					if _, err := io.WriteString(c, "ok "+l); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		e.mu.Lock()
		for _, c := range e.conns {
			c.Close()
		}
		e.mu.Unlock()
		e.wg.Wait()
	})
	return e
}

func (e *echo) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lines
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, p *Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func roundTrip(c net.Conn, r *bufio.Reader, line string, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

func TestForwards(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	got, err := roundTrip(c, r, "a", time.Second)
	if err != nil || got != "ok a\n" {
		t.Fatalf("round trip = %q, %v; want \"ok a\\n\"", got, err)
	}
}

func TestStallHoldsBytesUntilResume(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	if _, err := roundTrip(c, r, "warm", time.Second); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	if _, err := roundTrip(c, r, "held", 100*time.Millisecond); !isTimeout(err) {
		t.Fatalf("round trip while stalled = %v, want a timeout", err)
	}
	if n := e.count(); n != 1 {
		t.Fatalf("server got %d lines while stalled, want 1 (the warm-up)", n)
	}
	p.Resume()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	got, err := r.ReadString('\n')
	if err != nil || got != "ok held\n" {
		t.Fatalf("after Resume: %q, %v; want the held reply", got, err)
	}
}

func TestLatency(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	p.SetLatency(50 * time.Millisecond)
	start := time.Now()
	if _, err := roundTrip(c, r, "slow", time.Second); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Fatalf("round trip took %v, want ≥ 100ms (50ms each way)", took)
	}
}

func TestResetAndRefuse(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	if _, err := roundTrip(c, r, "a", time.Second); err != nil {
		t.Fatal(err)
	}
	if n := p.Reset(); n != 1 {
		t.Fatalf("Reset closed %d connections, want 1", n)
	}
	if _, err := roundTrip(c, r, "b", time.Second); err == nil {
		t.Fatal("round trip on a reset connection succeeded")
	}
	p.Refuse(true)
	c2, r2 := dial(t, p)
	if _, err := roundTrip(c2, r2, "c", time.Second); err == nil {
		t.Fatal("round trip through a refusing proxy succeeded")
	}
	p.Refuse(false)
	c3, r3 := dial(t, p)
	if _, err := roundTrip(c3, r3, "d", time.Second); err != nil {
		t.Fatalf("after Refuse(false): %v", err)
	}
}

func TestCutReplyAfterTheServerGotTheRequest(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	p.CutReply([]byte("charge"), 1)
	if _, err := roundTrip(c, r, "charge 1", time.Second); err == nil {
		t.Fatal("the cut reply arrived")
	}
	deadline := time.Now().Add(2 * time.Second)
	for e.count() < 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := e.count(); n != 1 {
		t.Fatalf("server got %d requests, want 1: it must see the request whose reply is cut", n)
	}
	if p.Cuts() != 1 {
		t.Fatalf("Cuts = %d, want 1", p.Cuts())
	}
	c2, r2 := dial(t, p)
	if got, err := roundTrip(c2, r2, "charge 2", time.Second); err != nil || got != "ok charge 2\n" {
		t.Fatalf("the next request = %q, %v; want its reply (armed for 1 only)", got, err)
	}
}

func TestCloseEndsStalledConnections(t *testing.T) {
	e := newEcho(t)
	p, err := New(e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, r := dial(t, p)
	if _, err := roundTrip(c, r, "a", time.Second); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	_, _ = io.WriteString(c, "held\n")
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return with a stalled connection")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
