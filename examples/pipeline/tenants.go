package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/throttle"
)

// tenantSpec is one tenant of -tenants: name:count[@rate/s][*weight][!].
type tenantSpec struct {
	name   string
	count  int
	rate   float64 // records per second; 0: all at once
	weight int     // 1 unless given
	urgent bool
}

// parseTenants reads -tenants, e.g. "A:2000,B:20@2/s" or
// "A:400*1,B:800*2,C:1600*4" or "A:2000,U:20@2/s!".
func parseTenants(s string) ([]tenantSpec, error) {
	var out []tenantSpec
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		bad := func(why string) error {
			return fmt.Errorf("-tenants %q: %s (want name:count[@rate/s][*weight][!], e.g. A:2000,B:20@2/s)", part, why)
		}
		name, rest, ok := strings.Cut(part, ":")
		if !ok || name == "" || strings.ContainsAny(name, "-") {
			return nil, bad("a name without '-', then ':'")
		}
		if seen[name] {
			return nil, bad("tenant named twice")
		}
		seen[name] = true
		t := tenantSpec{name: name, weight: 1}
		if strings.HasSuffix(rest, "!") {
			t.urgent, rest = true, strings.TrimSuffix(rest, "!")
		}
		if r, w, ok := strings.Cut(rest, "*"); ok {
			n, err := strconv.Atoi(w)
			if err != nil || n < 1 || n > 1000 {
				return nil, bad("a weight between 1 and 1000 after '*'")
			}
			t.weight, rest = n, r
		}
		if r, rate, ok := strings.Cut(rest, "@"); ok {
			v, err := strconv.ParseFloat(strings.TrimSuffix(rate, "/s"), 64)
			if err != nil || !(v > 0) || v > 1e6 {
				return nil, bad("a positive rate per second after '@', e.g. @2/s")
			}
			t.rate, rest = v, r
		}
		n, err := strconv.Atoi(rest)
		if err != nil || n < 1 {
			return nil, bad("a count of at least 1 after ':'")
		}
		t.count = n
		out = append(out, t)
	}
	return out, nil
}

// tenantOf is the tenant of a record keyed "<tenant>-<entity>".
func tenantOf(r *kgo.Record) string {
	t, _, _ := strings.Cut(string(r.Key), "-")
	return t
}

// fairOptions returns the consumer's WithFairness for the tenants, with
// reserve (if not nil) the urgent records' own part of the limit.
func fairOptions(ts []tenantSpec, share float64, reserve *throttle.Limiter) consumer.Option {
	weights := map[string]int{}
	urgent := map[string]bool{}
	for _, t := range ts {
		weights[t.name] = t.weight
		if t.urgent {
			urgent[t.name] = true
		}
	}
	opts := []consumer.FairOption{consumer.Weights(weights)}
	if len(urgent) > 0 {
		opts = append(opts, consumer.Urgent(func(r *kgo.Record) bool { return urgent[tenantOf(r)] }, share))
		if reserve != nil {
			opts = append(opts, consumer.UrgentReserve(reserve))
		}
	}
	return consumer.WithFairness(tenantOf, opts...)
}

// tenantLog records, per tenant, each record's wait from its produce
// time to its handler call, and the call times; and checks the order per
// key of the calls that succeed.
type tenantLog struct {
	mu     sync.Mutex
	waits  map[string][]time.Duration
	calls  map[string][]time.Time
	last   map[string]int64 // partition/key → last offset handled
	behind int              // calls of a key for an offset before one handled already
}

func newTenantLog() *tenantLog {
	return &tenantLog{waits: map[string][]time.Duration{}, calls: map[string][]time.Time{}, last: map[string]int64{}}
}

// called notes a handler call for rec, at now, before the provider call.
func (l *tenantLog) called(rec *kgo.Record, now time.Time) {
	t := tenantOf(rec)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls[t] = append(l.calls[t], now)
	l.waits[t] = append(l.waits[t], now.Sub(rec.Timestamp))
	k := strconv.Itoa(int(rec.Partition)) + "/" + string(rec.Key)
	if last, ok := l.last[k]; ok && rec.Offset < last {
		l.behind++
	}
	l.last[k] = max(l.last[k], rec.Offset)
}

// produceTenants writes each tenant's records: those without a rate at
// once, the others one at a time at their rate, starting when go is
// closed. Record i of a tenant has key <tenant>-<i mod keys>, and its
// partition follows its key; its timestamp is when it was produced.
func produceTenants(ctx context.Context, seeds []string, c config, ts []tenantSpec, goTimed <-chan struct{}, produced *atomic.Int64) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.DefaultProduceTopic(c.topic), kgo.ProducerLinger(0))
	if err != nil {
		return err
	}
	defer cl.Close()
	var mu sync.Mutex
	var first error
	record := func(t tenantSpec, i int) *kgo.Record {
		key := t.name + "-" + strconv.Itoa(i%max(c.keys, 1))
		h := fnv.New32a()
		_, _ = h.Write([]byte(key))
		return &kgo.Record{Partition: int32(h.Sum32() % uint32(c.partitions)), Key: []byte(key), Value: []byte(strconv.Itoa(i)), Timestamp: time.Now()}
	}
	send := func(r *kgo.Record) {
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				first = cmpErr(first, err)
				mu.Unlock()
				return
			}
			produced.Add(1)
		})
	}
	for _, t := range ts {
		if t.rate == 0 {
			for i := range t.count {
				send(record(t, i))
			}
		}
	}
	select {
	case <-goTimed:
	case <-ctx.Done():
		return ctx.Err()
	}
	var wg sync.WaitGroup
	for _, t := range ts {
		if t.rate == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			every := time.Duration(float64(time.Second) / t.rate)
			tick := time.NewTicker(every)
			defer tick.Stop()
			for i := range t.count {
				send(record(t, i))
				if i == t.count-1 {
					break
				}
				select {
				case <-tick.C:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	return first
}

// tenantReport is what -tenants prints per tenant.
type tenantReport struct {
	Name          string
	Calls         int // handler calls
	P50, P90, Max time.Duration
	// InSpan is the tenant's calls per second while every tenant had
	// records (see report).
	InSpan float64
}

// report prints each tenant's waits and its calls per second while every
// tenant had records: from the first record of the last tenant to start
// (the timed tenants start once the group has settled) to the last call
// of the first tenant to finish.
func (l *tenantLog) report(out io.Writer, ts []tenantSpec, perSecond float64) (reps []tenantReport, span time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var from, to time.Time
	for _, t := range ts {
		cs := l.calls[t.name]
		if len(cs) == 0 {
			continue
		}
		// A tenant starts with its first call's record's produce time.
		start := cs[0].Add(-l.waits[t.name][0])
		if start.After(from) {
			from = start
		}
		end := cs[0]
		for _, at := range cs {
			if at.After(end) {
				end = at
			}
		}
		if to.IsZero() || end.Before(to) {
			to = end
		}
	}
	span = to.Sub(from)
	fmt.Fprintf(out, "\nper tenant, from produce to the handler call (%d tenants):\n", len(ts))
	var total float64
	for _, t := range ts {
		ws := slices.Clone(l.waits[t.name])
		slices.Sort(ws)
		r := tenantReport{Name: t.name, Calls: len(ws)}
		if len(ws) > 0 {
			r.P50, r.P90, r.Max = ws[(len(ws)-1)/2], ws[(len(ws)*9+9)/10-1], ws[len(ws)-1]
		}
		if span > 0 {
			n := 0
			for _, at := range l.calls[t.name] {
				if !at.Before(from) && !at.After(to) {
					n++
				}
			}
			r.InSpan = float64(n) / span.Seconds()
			total += r.InSpan
		}
		kind := "at once"
		if t.rate > 0 {
			kind = fmt.Sprintf("%g/s", t.rate)
		}
		if t.urgent {
			kind += ", urgent"
		}
		fmt.Fprintf(out, "  %-8s %5d records (%s, weight %d): wait p50 %7.1f ms  p90 %7.1f ms  max %7.1f ms;  %6.1f calls/s while all had records\n",
			t.name, r.Calls, kind, t.weight, ms(r.P50), ms(r.P90), ms(r.Max), r.InSpan)
		reps = append(reps, r)
	}
	if span > 0 {
		fmt.Fprintf(out, "while all had records (%.1f s, from %s's start to the first tenant's last call): %.1f calls/s in all, %.1f%% of the limit\n",
			span.Seconds(), "the last tenant", total, 100*total/perSecond)
	}
	fmt.Fprintf(out, "calls of a key behind an offset handled already: %d\n", l.behind)
	return reps, span
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
