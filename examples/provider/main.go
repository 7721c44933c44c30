// Command provider is an HTTP API that enforces per-tenant, per-endpoint
// limits with headway's middleware: the provider's side of a rate limit.
// The limits come from a YAML file (throttle/httpserver); by default the one
// shipped beside this program, limits.yaml: GET /product/* at 10 per
// second and 50 per 10 s, PUT /product/* at 10 per sliding 10 s, per
// X-Org-Id.
//
// Every answer carries X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset (and the IETF draft RateLimit-Policy and RateLimit);
// a call over the limit gets 429 with Retry-After.
//
//	go run ./examples/provider                      # in memory, 127.0.0.1:8080, for 1 minute
//	go run ./examples/provider -redis 127.0.0.1:6379 -duration 0
//	curl -i -H 'X-Org-Id: acme' http://127.0.0.1:8080/product/1
//
// With -redis, every instance pointed at the same Redis shares the limits
// (Redis fixed-window tiers and sliding logs from package bucket);
// without it, the limits hold in this process only. The server listens on
// loopback only unless -public is given, and stops after -duration.
package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpserver"
)

//go:embed limits.yaml
var defaultLimits []byte

func main() {
	os.Exit(command(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// command is main, returning the exit code (see internal/cli).
func command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := cli.New("provider", "provider serves a small HTTP API rate-limited per tenant by the SLAs in -config\n(through throttle's middleware), counted in memory or in Redis with -redis.")
	read := defineFlags(cmd.Flags)
	var c config
	validate := func() (err error) {
		c, err = read()
		return err
	}
	return cmd.Run(ctx, args, stdout, stderr, validate, func(ctx context.Context) error {
		return serve(ctx, c, stdout, nil)
	})
}

// config is what the flags set.
type config struct {
	addr     string
	limits   []httpserver.SLA
	source   string // where the limits came from
	redis    string
	duration time.Duration
}

// parseFlags parses args on a flag set of its own.
func parseFlags(args []string, out io.Writer) (config, error) {
	fs := flag.NewFlagSet("provider", flag.ContinueOnError)
	fs.SetOutput(out)
	read := defineFlags(fs)
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	return read()
}

// defineFlags defines the flags on fs and returns the function that reads
// and checks them once fs is parsed.
func defineFlags(fs *flag.FlagSet) func() (config, error) {
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on")
	public := fs.Bool("public", false, "allow an -addr that is not loopback")
	file := fs.String("config", "", "limits file (YAML, see throttle/httpserver); empty: the limits.yaml shipped with this program")
	rdb := fs.String("redis", "", "Redis address (host:port) to share the limits with other instances; empty: in memory")
	duration := fs.Duration("duration", time.Minute, "how long to serve; 0: until interrupted")
	return func() (config, error) { return readFlags(*file, *public, *addr, *rdb, *duration) }
}

// readFlags checks the flags' values and loads the limits.
func readFlags(file string, public bool, addr, rdb string, duration time.Duration) (config, error) {
	c := config{addr: addr, redis: rdb, duration: duration, source: "the shipped limits.yaml"}
	if c.duration < 0 {
		return c, fmt.Errorf("-duration %v: must be 0 or positive", c.duration)
	}
	if !public {
		if err := loopbackOnly(c.addr); err != nil {
			return c, err
		}
	}
	var err error
	if file != "" {
		c.source = file
		c.limits, err = httpserver.LoadSLAs(file)
	} else {
		c.limits, err = httpserver.ParseSLAs(defaultLimits)
	}
	if err != nil {
		return c, fmt.Errorf("-config: %w", err)
	}
	return c, nil
}

// loopbackOnly refuses a listen address off loopback.
func loopbackOnly(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-addr %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("-addr %q: not a loopback address; pass -public to listen beyond this machine", addr)
	}
	return nil
}

// run parses args, serves until ctx ends or -duration passes, and prints
// a summary. ready, when set, is called with the listening address.
func run(ctx context.Context, args []string, out io.Writer, ready func(addr string)) error {
	c, err := parseFlags(args, out)
	if err != nil {
		return err
	}
	return serve(ctx, c, out, ready)
}

// serve is run with the flags parsed; setup errors (Redis, the limits,
// the listening address) match cli.ErrUsage.
func serve(ctx context.Context, c config, out io.Writer, ready func(addr string)) error {
	factory, closeStore, err := buckets(ctx, c.redis)
	if err != nil {
		return cli.Usagef("%w", err)
	}
	defer closeStore()
	// The demo trusts the X-Org-Id header for SLAs that do not name their
	// tenant. A real provider takes the tenant from the caller's verified
	// credentials (an API key, a token's subject), never from a header the
	// caller may set freely: see httpserver.NewMiddleware.
	m, err := httpserver.NewMiddleware(c.limits, factory, httpserver.TenantHeader("X-Org-Id"), httpserver.WithDraftHeaders())
	if err != nil {
		return cli.Usagef("%w", err)
	}
	var served, refused atomic.Int64
	api := m.Wrap(products(&served))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		api.ServeHTTP(rec, r)
		if rec.status == http.StatusTooManyRequests {
			refused.Add(1)
		}
	})

	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return cli.Usagef("listening on %s: %w", c.addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	store := "in memory (this process only)"
	if c.redis != "" {
		store = "in Redis at " + c.redis
	}
	fmt.Fprintf(out, "provider: serving http://%s with %d SLAs from %s, counted %s\n", ln.Addr(), len(c.limits), c.source, store)
	if ready != nil {
		ready(ln.Addr().String())
	}

	if c.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.duration)
		defer cancel()
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving: %w", err)
	}
	fmt.Fprintf(out, "provider: served %d calls, refused %d with 429\n", served.Load(), refused.Load())
	return nil
}

// buckets returns the factory of the SLAs' buckets: in memory, or Redis
// buckets shared by every instance using the same Redis.
func buckets(ctx context.Context, addr string) (httpserver.BucketFactory, func(), error) {
	if addr == "" {
		return httpserver.LocalWindows(nil), func() {}, nil
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		rdb.Close()
		return nil, nil, fmt.Errorf("-redis %s: %w", addr, err)
	}
	return redisBuckets(rdb), func() { rdb.Close() }, nil
}

// redisBuckets builds each SLA's bucket in Redis: its tiers as fixed
// windows (bucket.NewTiers) or, for a sliding SLA, as a sliding log
// (bucket.NewSlidingLog), under the key "sla:<ID>". Copy it to wire
// httpserver limits to Redis.
func redisBuckets(rdb redis.UniversalClient) httpserver.BucketFactory {
	return func(s httpserver.SLA) (throttle.Bucket, error) {
		if s.Sliding {
			b, err := bucket.NewSlidingLog(rdb, "sla:"+s.ID, s.Tiers)
			if err != nil {
				return nil, err
			}
			return b, nil
		}
		b, err := bucket.NewTiers(rdb, "sla:"+s.ID, s.Tiers)
		if err != nil {
			return nil, err
		}
		return b, nil
	}
}

// products is the API behind the limits: GET and PUT /product/{id}.
func products(served *atomic.Int64) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /product/{id}", func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"id": r.PathValue("id"), "org": r.Header.Get("X-Org-Id")})
	})
	mux.HandleFunc("PUT /product/{id}", func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such endpoint: "+path.Clean(r.URL.Path), http.StatusNotFound)
	})
	return mux
}

// statusRecorder remembers the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}
