package redisenv

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"
)

// ErrNoRedisServer reports that no redis-server binary is installed: it was
// looked for on PATH, then at /usr/bin and /usr/local/bin.
var ErrNoRedisServer = errors.New("redisenv: no redis-server binary found on PATH, /usr/bin or /usr/local/bin (install it: apt-get install -y redis-server)")

// ErrClosed is returned by the methods of a [Server] that has been closed.
var ErrClosed = errors.New("redisenv: server closed")

// errStateUnknown reports that this OS does not let us observe whether a
// process is stopped.
var errStateUnknown = errors.New("redisenv: process state unknown")

// KindStandIn is what [Server.Kind] returns for the in-process stand-in.
const KindStandIn = "in-process stand-in (miniredis)"

// fallbackWarning is logged once per process when Start falls back.
var fallbackWarning sync.Once

// Server is one Redis server: a real redis-server child process, or, when
// none is installed, an in-process miniredis stand-in. Its methods are safe
// for concurrent use.
type Server struct {
	cfg  config
	addr string // fixed for the server's life, across Restart
	port int
	kind string

	mu      sync.Mutex
	closed  bool
	clients []*redis.Client

	// A real server.
	bin    string
	dir    string
	proc   *proc
	paused bool

	// The stand-in.
	stand *standIn
	mini  *miniredis.Miniredis // stand.mini
	gate  chan struct{}        // non-nil while the stand-in is paused
}

// Start starts a Redis server on a free 127.0.0.1 port and waits until it
// answers. It runs a real redis-server when one is installed: in a fresh
// temporary directory, bound to 127.0.0.1 only, with protected mode,
// snapshots and the append-only file off, the DEBUG command allowed from
// loopback and the log in the directory. It tries five ports before giving
// up on ports taken meanwhile; a server that does not answer within
// [StartTimeout] is killed and the error carries its log's tail.
//
// When no binary is installed, Start logs a warning through log/slog once
// per process and starts the miniredis stand-in instead, unless
// [RequireReal] or [RequireEnv] forbid it; the error then wraps
// [ErrNoRedisServer]. [Server.Kind] says which one runs. The caller must
// call [Server.Close].
func Start(opts ...Option) (*Server, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	bin, err := binary(cfg)
	if err != nil {
		if cfg.requireReal {
			return nil, fmt.Errorf("%w; the in-process stand-in is forbidden (%s=1 or RequireReal)", err, RequireEnv)
		}
		s, err := startStandIn(cfg)
		if err != nil {
			return nil, err
		}
		fallbackWarning.Do(func() {
			if cfg.standIn {
				slog.Warn("redisenv: using the in-process stand-in (miniredis) because "+StandInEnv+"=1, although redis-server may be installed",
					"addr", s.Addr())
				return
			}
			slog.Warn("redisenv: redis-server is NOT installed; tests and examples are running against an in-process stand-in (miniredis), NOT a real Redis. Install it: apt-get install -y redis-server",
				"addr", s.Addr(), "require_with", RequireEnv+"=1")
		})
		return s, nil
	}
	return startReal(bin, cfg, FreePort)
}

// StartStandIn starts the in-process miniredis stand-in on a free 127.0.0.1
// port, whether or not redis-server is installed and regardless of
// [RequireEnv] and [StandInEnv]. The stand-in implements most commands and
// Lua, and keeps real time: keys expire as the wall clock passes and TIME
// is the wall clock, read when a command arrives and standing still while
// it runs, so that, as in Redis, a key a script sees alive stays alive
// until the script ends. It cannot be stopped or killed like a process (see
// [Server.Pause]) and has no Cluster. The caller must call [Server.Close].
func StartStandIn(opts ...Option) (*Server, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return startStandIn(cfg)
}

func startStandIn(cfg config) (*Server, error) {
	st, err := newStandIn("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := st.front.Addr().(*net.TCPAddr)
	return &Server{cfg: cfg, addr: addr.String(), port: addr.Port, kind: KindStandIn, mini: st.mini, stand: st}, nil
}

// startReal starts bin in a new temporary directory on a port from pick,
// picking again when the port turns out to be taken.
func startReal(bin string, cfg config, pick func() (int, error)) (*Server, error) {
	dir, err := os.MkdirTemp("", "redisenv-*")
	if err != nil {
		return nil, fmt.Errorf("redisenv: temporary directory: %w", err)
	}
	const attempts = 5
	for attempt := 1; ; attempt++ {
		port, err := pick()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		p, version, err := launch(bin, dir, port, cfg.args, cfg.startTimeout)
		if err == nil {
			return &Server{
				cfg:  cfg,
				addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
				port: port,
				kind: "redis-server " + version,
				bin:  bin,
				dir:  dir,
				proc: p,
			}, nil
		}
		if !errors.Is(err, errAddrInUse) || attempt == attempts {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

// Addr returns the server's "127.0.0.1:port" address, which stays the same
// across [Server.Restart].
func (s *Server) Addr() string { return s.addr }

// Kind describes the server: "redis-server 7.0.15" (with the version that
// runs) for a real server, or [KindStandIn].
func (s *Server) Kind() string { return s.kind }

// Real reports whether the server is a real redis-server process.
func (s *Server) Real() bool { return s.bin != "" }

// ClientOptions returns new go-redis options for the server, to adjust
// (timeouts, retries) before calling redis.NewClient. The caller owns the
// resulting client.
func (s *Server) ClientOptions() *redis.Options {
	return &redis.Options{Addr: s.addr}
}

// Client returns a new go-redis client for the server with default options.
// The caller may close it; [Server.Close] closes it in any case.
func (s *Server) Client() *redis.Client {
	return s.track(redis.NewClient(s.ClientOptions()))
}

// track registers c to be closed by Close, or closes it if s is closed.
func (s *Server) track(c *redis.Client) *redis.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return c // every command fails with redis.ErrClosed
	}
	s.clients = append(s.clients, c)
	return c
}

// Close closes the clients made by [Server.Client], kills the server (even
// while paused), waits for it to exit and removes its directory. It may be
// called more than once; later calls return nil.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for _, c := range s.clients {
		_ = c.Close() // the caller may have closed it already
	}
	s.clients = nil
	if s.mini != nil {
		s.openGateLocked()
		s.stand.close()
		return nil
	}
	s.proc.kill()
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("redisenv: removing %s: %w", s.dir, err)
	}
	return nil
}

// Restart stops the server, even while paused, and starts a new one on the
// same port with no data; it also ends a pause. Connections open at the time
// break: go-redis clients reconnect on their next command, which may fail
// once. A cluster node keeps its nodes.conf, so it comes back as the same
// node owning the same slots, empty; like any restarted master it refuses
// commands for its slots (CLUSTERDOWN) for about two seconds.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.mini != nil {
		s.openGateLocked()
		s.stand.close()
		var st *standIn
		if err := retryAddrInUse(s.cfg.startTimeout, func() (err error) { st, err = newStandIn(s.addr); return err }); err != nil {
			return fmt.Errorf("redisenv: restarting the stand-in on %s: %w", s.addr, err)
		}
		s.stand, s.mini = st, st.mini
		return nil
	}
	s.proc.kill()
	s.paused = false
	return retryAddrInUse(s.cfg.startTimeout, func() error {
		p, _, err := launch(s.bin, s.dir, s.port, s.cfg.args, s.cfg.startTimeout)
		if err == nil {
			s.proc = p
		}
		return err
	})
}

// retryAddrInUse calls start until it returns an error other than "address
// already in use", or until timeout has passed.
func retryAddrInUse(timeout time.Duration, start func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := start()
		if err == nil || !isAddrInUse(err) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond) // back off before the port is tried again
	}
}

func isAddrInUse(err error) bool {
	if errors.Is(err, errAddrInUse) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "listen"
}

// Pause freezes the server: a real one gets SIGSTOP, so connections are
// still accepted by the kernel but nothing is answered, as with a server
// stuck in a long command or a stalled VM. Pause returns once the process
// is stopped. The stand-in emulates it by holding every command until
// [Server.Resume]. Pausing a paused server does nothing.
func (s *Server) Pause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.mini != nil {
		if s.gate == nil {
			gate := make(chan struct{})
			s.gate = gate
			s.stand.hold(gate)
			s.mini.Server().SetPreHook(func(*server.Peer, string, ...string) bool {
				<-gate
				return false // then run the command as usual
			})
		}
		return nil
	}
	if s.paused {
		return nil
	}
	if err := signalStop(s.proc.cmd.Process); err != nil {
		return fmt.Errorf("redisenv: pausing %s: %w", s.addr, err)
	}
	s.paused = true
	return s.waitStoppedLocked(true)
}

// Resume undoes [Server.Pause]: the server answers again, including the
// commands that waited. Resuming a server that is not paused does nothing.
func (s *Server) Resume() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.mini != nil {
		s.openGateLocked()
		return nil
	}
	if !s.paused {
		return nil
	}
	if err := signalCont(s.proc.cmd.Process); err != nil {
		return fmt.Errorf("redisenv: resuming %s: %w", s.addr, err)
	}
	s.paused = false
	return s.waitStoppedLocked(false)
}

// waitStoppedLocked polls until the process's stopped state is want.
func (s *Server) waitStoppedLocked(want bool) error {
	deadline := time.Now().Add(s.cfg.startTimeout)
	for {
		stopped, err := processStopped(s.proc.cmd.Process.Pid)
		if errors.Is(err, errStateUnknown) {
			return nil
		}
		if err == nil && stopped == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redisenv: %s: process stopped=%v after %v, want %v (err: %v)", s.addr, stopped, s.cfg.startTimeout, want, err)
		}
		time.Sleep(5 * time.Millisecond) // signal delivery is asynchronous; poll briefly
	}
}

// openGateLocked ends the stand-in's pause, if any.
func (s *Server) openGateLocked() {
	if s.gate == nil {
		return
	}
	s.mini.Server().SetPreHook(nil)
	s.stand.hold(nil)
	close(s.gate)
	s.gate = nil
}

// FreePort returns a TCP port that was free on 127.0.0.1 a moment ago: it
// listens on port 0 and closes the listener. Another process may take the
// port before the caller uses it, so callers retry on "address already in
// use", as [Start] does.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redisenv: free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("redisenv: free port: %w", err)
	}
	return port, nil
}
