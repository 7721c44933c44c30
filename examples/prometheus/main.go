// Command prometheus shows headway's metrics (package
// github.com/headway-go/headway/throttle/otelmetrics) exported to
// Prometheus through the OpenTelemetry SDK, with nothing to install: an
// in-process Kafka (kfake) holds -records records, a consumer handles
// them at -limit per -interval, HTTP callers on the side acquire from the
// same limiter with a short wait (some time out), and /metrics is served
// on -addr (a 127.0.0.1 address) for -duration.
//
//	go run . -duration 10s -addr 127.0.0.1:9464
//	curl -s 127.0.0.1:9464/metrics | grep headway_
//
// It lives in a module of its own so that the Prometheus client and its
// dependencies stay out of headway's go.mod: headway itself imports only
// the OpenTelemetry metrics API. Before it exits it scrapes itself once and
// prints the headway series, so a run shows what a scrape would see.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/consumer/otelconsumer"
	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/otelmetrics"
)

func main() {
	os.Exit(command(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// command is main, returning the exit code (see internal/cli).
func command(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := cli.New("prometheus", "prometheus runs a rate-limited consumer and callers for -duration, serves headway's\nOpenTelemetry metrics at /metrics on -addr, and prints one scrape at the end.")
	fs := cmd.Flags
	addr := fs.String("addr", "127.0.0.1:9464", "where to serve /metrics (loopback only)")
	duration := fs.Duration("duration", 5*time.Second, "how long to run")
	records := fs.Int("records", 2000, "records in the topic")
	limit := fs.Int64("limit", 50, "permits per interval, shared by the consumer and the callers")
	interval := fs.Duration("interval", 100*time.Millisecond, "length of the interval")
	validate := func() error {
		if *duration <= 0 {
			return fmt.Errorf("-duration %v: must be positive", *duration)
		}
		if *records < 0 {
			return fmt.Errorf("-records %d: must be 0 or more", *records)
		}
		if _, err := throttle.NewLocal(*limit, *interval); err != nil {
			return err
		}
		return checkAddr(*addr)
	}
	return cmd.Run(ctx, args, stdout, stderr, validate, func(ctx context.Context) error {
		return run(ctx, stdout, *addr, *duration, *records, *limit, *interval)
	})
}

// checkAddr accepts loopback addresses only.
func checkAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-addr %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("-addr %q: must be a loopback address such as 127.0.0.1:9464", addr)
	}
	return nil
}

func run(ctx context.Context, out io.Writer, addr string, duration time.Duration, records int, limit int64, interval time.Duration) error {
	if err := checkAddr(addr); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, duration) // SIGINT or SIGTERM ends it sooner
	defer cancel()

	// The OpenTelemetry SDK, reading into a Prometheus registry of our own.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return fmt.Errorf("prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = mp.Shutdown(context.Background()) }()

	// headway's instruments: one Observer for the limiter, and the
	// consumer's figures read at each scrape.
	obs, err := otelmetrics.New(mp, otelmetrics.WithAttributes(attribute.String("headway.limiter", "provider")))
	if err != nil {
		return err
	}
	b, err := throttle.NewLocal(limit, interval)
	if err != nil {
		return err
	}
	lim := throttle.New(b, throttle.WithObserver(obs))

	kc, err := kafkaenv.Start(kafkaenv.Topic("outbox", 4))
	if err != nil {
		return err
	}
	defer kc.Close()
	if err := produce(ctx, kc, records); err != nil {
		return err
	}
	c, err := consumer.New(func(context.Context, *kgo.Record) error {
		return nil // call the provider here
	}, lim, consumer.WithKafka(
		kgo.SeedBrokers(kc.Addrs()...),
		kgo.ConsumerGroup("mailer"),
		kgo.ConsumeTopics("outbox"),
	))
	if err != nil {
		return err
	}
	unregister, err := otelconsumer.Observe(mp, "mailer", c)
	if err != nil {
		return err
	}
	defer func() { _ = unregister() }()

	l, err := net.Listen("tcp", addr)
	if err != nil {
		return cli.Usagef("%w", err)
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	fmt.Fprintf(out, "serving metrics at http://%s/metrics for %v\n", l.Addr(), duration)

	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			slog.Error("consumer", "err", err)
		}
	})
	// Callers on the side: they wait at most 20 ms, so some time out.
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				_ = lim.Acquire(ctx, 20*time.Millisecond)
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()

	// Scrape ourselves once before leaving.
	err = printScrape(out, "http://"+l.Addr().String()+"/metrics")
	shutCtx, shutCancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer shutCancel()
	if sErr := srv.Shutdown(shutCtx); sErr != nil {
		err = errors.Join(err, sErr)
	}
	if sErr := <-served; !errors.Is(sErr, http.ErrServerClosed) {
		err = errors.Join(err, sErr)
	}
	return err
}

func produce(ctx context.Context, kc *kafkaenv.Cluster, n int) error {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: []byte("hello")}
	}
	return kc.Produce(ctx, "outbox", recs...)
}

// printScrape prints the headway series of one scrape, histogram buckets
// left out.
func printScrape(out io.Writer, url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("scrape: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "headway_") && !strings.Contains(line, "_bucket{") {
			fmt.Fprintln(out, line)
			n++
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if n == 0 {
		return errors.New("scrape: no headway_ series")
	}
	return nil
}
