package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/internal/provider"
)

// A round: a fresh provider and a fresh bucket key, the children started
// and told to go together, stopped after the duration, and the provider's
// arrival times counted.

// scenario is one configuration of the fleet and the provider.
type scenario struct {
	Name      string        `json:"name"`
	Bucket    string        `json:"bucket"`
	Limit     int64         `json:"limit"`
	Interval  time.Duration `json:"interval"`
	Processes int           `json:"processes"`
	// Workers per process; 0 when the scenario is built means auto
	// (autoWorkers), filled in by check.
	Workers int    `json:"workers"`
	Waits   string `json:"waits"`
	Lease   bool   `json:"lease"`
	// Margin is the bucket's WithArrivalMargin; 0: its default.
	Margin   time.Duration `json:"margin,omitempty"`
	Stops    []stopSpec    `json:"stops,omitempty"`
	Duration time.Duration `json:"duration"`
	// ProviderLimit, when positive, makes the provider refuse (429) above
	// that many per interval, the way ProviderPolicy names; 0 accepts
	// everything and just counts.
	ProviderLimit  int64         `json:"provider_limit,omitempty"`
	ProviderPolicy string        `json:"provider_policy,omitempty"`
	Latency        time.Duration `json:"latency,omitempty"`
	// Trace wraps each child's bucket to note when it granted each call's
	// permit (-trace).
	Trace bool `json:"trace,omitempty"`
}

// stopSpec stops (SIGSTOP) child Process for For, every Every.
type stopSpec struct {
	Process int           `json:"process"`
	Every   time.Duration `json:"every"`
	For     time.Duration `json:"for"`
}

func (s stopSpec) String() string { return fmt.Sprintf("%d:%v:%v", s.Process, s.Every, s.For) }

// parseStop reads "i:every:for", e.g. "0:1s:30ms".
func parseStop(v string) (stopSpec, error) {
	parts := strings.Split(v, ":")
	if len(parts) != 3 {
		return stopSpec{}, fmt.Errorf("want process:every:for, like 0:1s:30ms, got %q", v)
	}
	i, err := strconv.Atoi(parts[0])
	if err != nil || i < 0 {
		return stopSpec{}, fmt.Errorf("%q: the process must be an index from 0", v)
	}
	every, err1 := time.ParseDuration(parts[1])
	d, err2 := time.ParseDuration(parts[2])
	if err1 != nil || err2 != nil || d <= 0 || every <= d {
		return stopSpec{}, fmt.Errorf("%q: want durations with 0 < for < every", v)
	}
	return stopSpec{Process: i, Every: every, For: d}, nil
}

// autoWorkers is the workers per process when none are given: half as
// many again as the limit, over the fleet, and at least 8 per process, so
// that the fleet can use a whole period's permits at once with a third of
// its callers refused (demand above the limit).
func autoWorkers(limit int64, processes int) int {
	return max(8, int(math.Ceil(1.5*float64(limit)/float64(processes))))
}

// roundResult is what one round measured.
type roundResult struct {
	Round int `json:"round"`
	figures
	// DurationS is from the go to the stop.
	DurationS float64 `json:"duration_s"`
	// The children's own counts of their calls (childResult), summed.
	Calls      int64            `json:"calls"`
	OK         int64            `json:"ok"`
	Status429  int64            `json:"status_429"`
	Refused    int64            `json:"refused"`
	RefusedBy  map[string]int64 `json:"refused_by,omitempty"`
	Deadline   int64            `json:"deadline"`
	Errors     int64            `json:"errors"`
	FirstError string           `json:"first_error,omitempty"`
	// StoreErrors and Degraded: the bucket calls that failed, and the
	// permits the Limiters' failure policy granted without the shared
	// bucket meanwhile (childResult).
	StoreErrors int64 `json:"store_errors"`
	Degraded    int64 `json:"degraded"`
	// Stops is the SIGSTOPs sent; Killed the children that had not
	// exited within the bound after the stop (killed, and their counts
	// lost); Stuck their workers that had not returned.
	Stops  int64 `json:"stops,omitempty"`
	Killed []int `json:"killed,omitempty"`
	Stuck  int   `json:"stuck,omitempty"`
	// Load is the machine's one-minute load average at the round's end
	// (-1 unknown): figures from a loaded machine read with it.
	Load float64 `json:"load"`

	arrivals []arrival // for -dump
}

// child is one running child process.
type child struct {
	i      int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string   // its standard output, line by line; closed at its end
	exited chan struct{} // closed once it has exited and been reaped
}

// Bounds of a child's life.
const (
	readyBound = time.Minute               // to open its connections
	exitBound  = stopBound + 5*time.Second // to exit after the stop
)

// errStopped reports a round stopped before it began.
var errStopped = errors.New("stopped before the round began")

// runRound runs one round of sc against the Redis at redis, with children
// re-executing exe.
func runRound(ctx context.Context, sc scenario, redis, exe string, round int, stderr io.Writer) (roundResult, error) {
	cfg := provider.Config{Limit: math.MaxInt64, Interval: sc.Interval, Policy: provider.Sliding, Latency: sc.Latency}
	if sc.ProviderLimit > 0 {
		cfg.Limit, cfg.Policy = sc.ProviderLimit, policies[sc.ProviderPolicy]
	}
	prov, err := provider.Start(cfg)
	if err != nil {
		return roundResult{}, err
	}
	defer prov.Close()

	var raw [6]byte
	_, _ = rand.Read(raw[:])
	key := "arrivals-" + hex.EncodeToString(raw[:])
	var mu sync.Mutex // the children's lines on stderr
	kids := make([]*child, 0, sc.Processes)
	defer func() { // on every path: no child outlives its round
		for _, k := range kids {
			k.kill()
			<-k.exited
		}
	}()
	for i := range sc.Processes {
		spec, _ := json.Marshal(childConfig{
			Process: i, Redis: redis, Key: key, Bucket: sc.Bucket, Limit: sc.Limit, Interval: sc.Interval,
			Margin: sc.Margin, Lease: sc.Lease, Workers: sc.Workers, Waits: sc.Waits, URL: prov.URL(), Trace: sc.Trace,
		})
		k, err := startChild(exe, i, string(spec), &prefixed{mu: &mu, w: stderr, prefix: fmt.Sprintf("arrivals: process %d: ", i)})
		if err != nil {
			return roundResult{}, err
		}
		kids = append(kids, k)
	}
	for _, k := range kids {
		if err := k.ready(ctx); err != nil {
			return roundResult{}, err
		}
	}
	for _, k := range kids {
		if _, err := io.WriteString(k.stdin, "go\n"); err != nil {
			return roundResult{}, fmt.Errorf("starting process %d: %w", k.i, err)
		}
	}
	start := time.Now()
	var stops atomic.Int64
	stopping := make(chan struct{})
	var stoppers sync.WaitGroup
	for _, s := range sc.Stops {
		p := kids[s.Process].cmd.Process
		stoppers.Go(func() { stopEvery(p, s, stopping, &stops, stderr, &mu) })
	}
	select {
	case <-time.After(sc.Duration):
	case <-ctx.Done():
	}
	end := time.Now()
	close(stopping)
	stoppers.Wait() // every stopped child continued
	for _, k := range kids {
		_ = k.stdin.Close()
	}

	res := roundResult{Round: round, DurationS: end.Sub(start).Seconds(), RefusedBy: map[string]int64{}, Stops: stops.Load()}
	for _, k := range kids {
		r, ok := k.result()
		if !ok {
			res.Killed = append(res.Killed, k.i)
			mu.Lock()
			fmt.Fprintf(stderr, "arrivals: process %d did not exit within %v of the stop: killed; its counts are lost\n", k.i, exitBound)
			mu.Unlock()
			continue
		}
		res.Calls += r.Calls
		res.OK += r.OK
		res.Status429 += r.Status429
		res.Refused += r.Refused
		res.Deadline += r.Deadline
		res.Errors += r.Errors
		res.Stuck += r.Stuck
		res.StoreErrors += r.StoreErrors
		res.Degraded += r.Degraded
		for cl, n := range r.RefusedBy {
			res.RefusedBy[cl] += n
		}
		if res.FirstError == "" {
			res.FirstError = r.FirstError
		}
	}
	res.arrivals = arrivalsOf(prov)
	res.figures = count(res.arrivals, sc.Limit, sc.Interval, end)
	res.Load = loadAverage()
	return res, nil
}

// arrivalsOf is every request p saw: the accepted ones with their senders
// (from their query: see work), and the refused ones.
func arrivalsOf(p *provider.Provider) []arrival {
	var out []arrival
	for _, c := range p.Calls() {
		a := arrival{At: c.At, Process: int(c.Partition), Class: c.Topic, Remaining: -1}
		decode(c.Key, &a)
		out = append(out, a)
	}
	for _, t := range p.Refusals() {
		out = append(out, arrival{At: t, Process: -1, Remaining: -1})
	}
	return out
}

// stopEvery stops p (SIGSTOP) for s.For every s.Every until done, and
// leaves it running.
func stopEvery(p *os.Process, s stopSpec, done <-chan struct{}, stops *atomic.Int64, stderr io.Writer, mu *sync.Mutex) {
	t := time.NewTicker(s.Every)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		if err := stopProcess(p); err != nil {
			mu.Lock()
			fmt.Fprintf(stderr, "arrivals: stopping process %d: %v\n", s.Process, err)
			mu.Unlock()
			return
		}
		stops.Add(1)
		select {
		case <-time.After(s.For):
		case <-done:
		}
		_ = contProcess(p)
	}
}

// startChild starts child i of spec, its standard error to stderr.
func startChild(exe string, i int, spec string, stderr *prefixed) (*child, error) {
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+spec)
	cmd.Stderr = stderr
	cmd.SysProcAttr = sysProcAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting process %d: %w", i, err)
	}
	k := &child{i: i, cmd: cmd, stdin: stdin, lines: make(chan string, 4), exited: make(chan struct{})}
	go func() {
		defer close(k.exited)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			k.lines <- sc.Text()
		}
		close(k.lines)
		_ = cmd.Wait()
		stderr.flush()
	}()
	return k, nil
}

// ready waits until k says it is ready.
func (k *child) ready(ctx context.Context) error {
	t := time.NewTimer(readyBound)
	defer t.Stop()
	select {
	case line, ok := <-k.lines:
		switch {
		case ok && line == childReady:
			return nil
		case ok:
			return fmt.Errorf("process %d said %q, not %q", k.i, line, childReady)
		}
		<-k.exited
		return fmt.Errorf("process %d ended before it was ready (%v); its errors are above", k.i, k.cmd.ProcessState)
	case <-t.C:
		return fmt.Errorf("process %d was not ready within %v", k.i, readyBound)
	case <-ctx.Done():
		return errStopped
	}
}

// result reads k's result, the last line it prints, once stopped; false
// when it did not exit within exitBound (then it is killed) or printed none.
func (k *child) result() (childResult, bool) {
	t := time.NewTimer(exitBound)
	defer t.Stop()
	var last string
	for {
		select {
		case line, ok := <-k.lines:
			if ok {
				last = line
				continue
			}
			<-k.exited
			var r childResult
			if err := json.Unmarshal([]byte(last), &r); err != nil {
				return childResult{}, false
			}
			return r, true
		case <-t.C:
			k.kill()
			<-k.exited
			return childResult{}, false
		}
	}
}

// kill kills k if it is still running; safe to call more than once.
func (k *child) kill() {
	select {
	case <-k.exited:
		return
	default:
	}
	_ = contProcess(k.cmd.Process) // a stopped process dies on SIGKILL too, but leave none stopped
	_ = k.cmd.Process.Kill()
}

// prefixed writes a child's standard error line by line, each line with
// prefix, under mu (several children share w).
type prefixed struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
}

func (p *prefixed) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		p.mu.Lock()
		fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf[:i])
		p.mu.Unlock()
		p.buf = p.buf[i+1:]
	}
}

// flush writes a last line without its newline.
func (p *prefixed) flush() {
	if len(p.buf) > 0 {
		_, _ = p.Write([]byte("\n"))
	}
}

// loadAverage is the machine's one-minute load average, -1 when unknown.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}
