package redisenv

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// kinds runs fn against a real server (skipped when none is installed and
// RequireEnv is unset) and against the stand-in, so both honour one contract.
func kinds(t *testing.T, fn func(t *testing.T, s *Server)) {
	t.Run("real", func(t *testing.T) {
		t.Parallel()
		s := New(t)
		NeedReal(t, s, "the real half of this test")
		fn(t, s)
	})
	t.Run("stand-in", func(t *testing.T) {
		t.Parallel()
		s, err := StartStandIn()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		fn(t, s)
	})
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestServerAnswers(t *testing.T) {
	kinds(t, func(t *testing.T, s *Server) {
		ctx := ctxT(t)
		if host, _, err := net.SplitHostPort(s.Addr()); err != nil || host != "127.0.0.1" {
			t.Fatalf("Addr() = %q, want 127.0.0.1:port", s.Addr())
		}
		c := s.Client()
		if got, err := c.Ping(ctx).Result(); err != nil || got != "PONG" {
			t.Fatalf("PING = %q, %v; want PONG", got, err)
		}
		if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatalf("SET: %v", err)
		}
		if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
			t.Fatalf("GET = %q, %v; want v", got, err)
		}
	})
}

func TestKind(t *testing.T) {
	kinds(t, func(t *testing.T, s *Server) {
		if s.Real() {
			if !strings.HasPrefix(s.Kind(), "redis-server ") || len(s.Kind()) <= len("redis-server ") {
				t.Fatalf("Kind() = %q, want redis-server VERSION", s.Kind())
			}
			// The version is the one the server itself reports.
			info, err := s.Client().Info(ctxT(t), "server").Result()
			if err != nil {
				t.Fatal(err)
			}
			if want := "redis-server " + infoField(info, "redis_version"); s.Kind() != want {
				t.Fatalf("Kind() = %q, server says %q", s.Kind(), want)
			}
		} else if s.Kind() != KindStandIn {
			t.Fatalf("Kind() = %q, want %q", s.Kind(), KindStandIn)
		}
	})
}

func TestRestartLosesDataKeepsPort(t *testing.T) {
	kinds(t, func(t *testing.T, s *Server) {
		ctx := ctxT(t)
		c := s.Client()
		addr := s.Addr()
		if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		var pidBefore string
		if s.Real() {
			pidBefore = pid(t, c)
		}
		if err := s.Restart(); err != nil {
			t.Fatalf("Restart: %v", err)
		}
		if s.Addr() != addr {
			t.Fatalf("Addr() = %s after Restart, was %s", s.Addr(), addr)
		}
		// A fresh client: the old one's pooled connection died with the
		// server.
		c2 := s.Client()
		if err := c2.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
			t.Fatalf("GET after Restart = %v, want redis.Nil", err)
		}
		if s.Real() {
			if after := pid(t, c2); after == pidBefore {
				t.Fatalf("process_id %s unchanged by Restart", after)
			}
		}
		// The old client recovers too, within its retries.
		if err := c.Set(ctx, "k2", "v2", 0).Err(); err != nil {
			t.Fatalf("old client after Restart: %v", err)
		}
	})
}

func pid(t *testing.T, c *redis.Client) string {
	t.Helper()
	info, err := c.Info(ctxT(t), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	p := infoField(info, "process_id")
	if p == "" {
		t.Fatalf("no process_id in INFO")
	}
	return p
}

func TestPauseResume(t *testing.T) {
	kinds(t, func(t *testing.T, s *Server) {
		ctx := ctxT(t)
		if err := s.Client().Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		patientOpts := s.ClientOptions()
		patientOpts.ReadTimeout = 10 * time.Second
		patient := redis.NewClient(patientOpts)
		defer patient.Close()
		impatientOpts := s.ClientOptions()
		impatientOpts.ReadTimeout = 200 * time.Millisecond
		impatientOpts.MaxRetries = -1
		impatient := redis.NewClient(impatientOpts)
		defer impatient.Close()
		timer := redis.NewClient(patientOpts)
		defer timer.Close()
		// Connect all before the pause, so what is tested is a stalled
		// server, not a stalled handshake.
		for _, c := range []*redis.Client{patient, impatient, timer} {
			if err := c.Ping(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}

		if err := s.Pause(); err != nil {
			t.Fatalf("Pause: %v", err)
		}
		if err := s.Pause(); err != nil {
			t.Fatalf("second Pause: %v", err)
		}
		type result struct {
			v   string
			err error
		}
		waited := make(chan result, 1)
		go func() {
			v, err := patient.Get(ctx, "k").Result()
			waited <- result{v, err}
		}()
		// A command held over the pause reads the clock when the server
		// runs again, as a stopped process reads it only then.
		timed := make(chan time.Time, 1)
		go func() {
			got, err := timer.Time(ctx).Result()
			if err != nil {
				t.Errorf("TIME held over the pause: %v", err)
			}
			timed <- got
		}()

		err := impatient.Get(ctx, "k").Err()
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("GET on a paused server = %v, want a timeout", err)
		}
		select {
		case r := <-waited:
			t.Fatalf("GET on a paused server answered %q, %v", r.v, r.err)
		default:
		}

		resumed := time.Now()
		if err := s.Resume(); err != nil {
			t.Fatalf("Resume: %v", err)
		}
		if err := s.Resume(); err != nil {
			t.Fatalf("second Resume: %v", err)
		}
		if r := <-waited; r.err != nil || r.v != "v" {
			t.Fatalf("GET held over the pause = %q, %v; want v", r.v, r.err)
		}
		// The impatient GET's timeout has passed since TIME was sent.
		if got := <-timed; got.Before(resumed.Truncate(time.Microsecond)) {
			t.Fatalf("TIME held over the pause = %v, %v before Resume was called; want the time the server ran again", got, resumed.Sub(got))
		}
		if got, err := impatient.Get(ctx, "k").Result(); err != nil || got != "v" {
			t.Fatalf("GET after Resume = %q, %v; want v", got, err)
		}
	})
}

func TestCloseWhilePaused(t *testing.T) {
	kinds(t, func(t *testing.T, s *Server) {
		c := s.Client()
		if err := s.Pause(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if err := c.Ping(context.Background()).Err(); !errors.Is(err, redis.ErrClosed) {
			t.Fatalf("client after Close: %v, want redis.ErrClosed", err)
		}
		for name, fn := range map[string]func() error{"Restart": s.Restart, "Pause": s.Pause, "Resume": s.Resume} {
			if err := fn(); !errors.Is(err, ErrClosed) {
				t.Errorf("%s after Close = %v, want ErrClosed", name, err)
			}
		}
		if s.Real() {
			if _, err := os.Stat(s.dir); !os.IsNotExist(err) {
				t.Errorf("directory %s left behind: %v", s.dir, err)
			}
			select {
			case <-s.proc.done:
			default:
				t.Errorf("process not reaped after Close")
			}
		} else if s.mini.Server() != nil {
			t.Errorf("stand-in still serving after Close")
		}
		// Not checked: that nothing accepts on the address any more. Parallel
		// tests reuse freed ports at once.
	})
}

func TestStartReportsLogTail(t *testing.T) {
	cfg, err := newConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := binary(cfg); err != nil {
		needBinary(t, "starting redis-server with a bad option")
	}
	_, err = Start(Args("--no-such-directive", "1"))
	if err == nil {
		t.Fatal("Start with a bad directive succeeded")
	}
	if msg := err.Error(); !strings.Contains(msg, "log tail") || !strings.Contains(msg, "no-such-directive") {
		t.Fatalf("error does not carry the server's complaint: %v", err)
	}
}

func TestStartRetriesTakenPort(t *testing.T) {
	bin, err := findBinary()
	if err != nil {
		needBinary(t, "a taken port")
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	picks := 0
	pick := func() (int, error) {
		picks++
		if picks == 1 {
			return takenPort, nil
		}
		return FreePort()
	}
	cfg, err := newConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := startReal(bin, cfg, pick)
	if err != nil {
		t.Fatalf("startReal: %v", err)
	}
	defer s.Close()
	if picks != 2 || s.port == takenPort {
		t.Fatalf("picked %d ports, runs on %d (taken: %d); want a second pick", picks, s.port, takenPort)
	}
	if err := s.Client().Ping(ctxT(t)).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestFreePort(t *testing.T) {
	p, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if p <= 0 || p > 65535 {
		t.Fatalf("FreePort() = %d", p)
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", itoa(p)))
	if err != nil {
		t.Fatalf("port %d from FreePort is not free: %v", p, err)
	}
	l.Close()
}

func TestStartTimeoutValidated(t *testing.T) {
	if _, err := Start(StartTimeout(0)); err == nil || !strings.Contains(err.Error(), "StartTimeout") {
		t.Fatalf("Start(StartTimeout(0)) = %v, want an error naming StartTimeout", err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestUserHasOnlyItsCommandsAndNoChannels: a user made with NewUser may
// run the commands it lists on the keys it lists, is refused every other
// command and key, and may neither publish nor subscribe.
func TestUserHasOnlyItsCommandsAndNoChannels(t *testing.T) {
	s := New(t)
	u := User{Name: "svc", Password: "pw", Commands: []string{"get", "set", "publish", "subscribe"}, Keys: []string{"app:*"}}
	c := NewUser(t, s, u)
	ctx := ctxT(t)
	if err := c.Set(ctx, "app:k", "v", 0).Err(); err != nil {
		t.Fatalf("SET on an allowed key: %v", err)
	}
	if got, err := c.Get(ctx, "app:k").Result(); err != nil || got != "v" {
		t.Fatalf("GET on an allowed key = %q, %v", got, err)
	}
	for what, err := range map[string]error{
		"SET on another key":     c.Set(ctx, "other", "v", 0).Err(),
		"a command not listed":   c.Incr(ctx, "app:n").Err(),
		"PUBLISH on a channel":   c.Publish(ctx, "app:ch", "x").Err(),
		"ACL WHOAMI, not listed": c.Do(ctx, "acl", "whoami").Err(),
	} {
		if err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
			t.Errorf("%s: err = %v, want NOPERM", what, err)
		}
	}
	ps := c.Subscribe(ctx, "app:ch")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		t.Errorf("SUBSCRIBE: err = %v, want NOPERM", err)
	}
	// Channels, when listed, are allowed.
	u.Channels = []string{"app:*"}
	c = NewUser(t, s, u)
	if err := c.Publish(ctx, "app:ch", "x").Err(); err != nil {
		t.Errorf("PUBLISH on a listed channel: %v", err)
	}
	// The stand-in has no users.
	mini, err := StartStandIn()
	if err != nil {
		t.Fatal(err)
	}
	defer mini.Close()
	if err := mini.AddUser(u); !errors.Is(err, ErrNoACL) {
		t.Errorf("AddUser on the stand-in = %v, want ErrNoACL", err)
	}
}
