package bucket

import (
	"bufio"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
)

// TestConcurrencyScripts: the cap's scripts carry their header, and each
// loads on a real server under the hash Go computed for it (the shared
// part prepended).
func TestConcurrencyScripts(t *testing.T) {
	rdb := redisenv.New(t).Client()
	for name, s := range map[string]*redis.Script{
		"slots_hold.lua":    scriptSlotsHold,
		"slots_release.lua": scriptSlotsRelease,
		"slots_renew.lua":   scriptSlotsRenew,
	} {
		common, err := os.ReadFile("lua/slots_common.lua")
		if err != nil {
			t.Fatal(err)
		}
		src, err := os.ReadFile("lua/" + name)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha1.Sum(append(common, src...))
		if got := hex.EncodeToString(sum[:]); got != s.Hash() {
			t.Errorf("%s: embedded hash %s, files' hash %s", name, s.Hash(), got)
		}
		if !strings.HasPrefix(string(src), "-- "+name+":") || !strings.Contains(string(src), "ARGV[5") {
			t.Errorf("%s: header comment must name the file and give its ARGV", name)
		}
		if sha, err := s.Load(context.Background(), rdb).Result(); err != nil || sha != s.Hash() {
			t.Errorf("%s: SCRIPT LOAD = %s, %v; want %s", name, sha, err, s.Hash())
		}
	}
}

func TestConcurrencyRefusesBadArguments(t *testing.T) {
	rdb := redisenv.New(t).Client()
	for _, c := range []struct {
		field string
		make  func() (*Concurrency, error)
	}{
		{"rdb", func() (*Concurrency, error) { return NewConcurrency(nil, "k", 1) }},
		{"key", func() (*Concurrency, error) { return NewConcurrency(rdb, "", 1) }},
		{"capacity", func() (*Concurrency, error) { return NewConcurrency(rdb, "k", 0) }},
		{"capacity", func() (*Concurrency, error) { return NewConcurrency(rdb, "k", 1<<51) }},
		{"lease", func() (*Concurrency, error) { return NewConcurrency(rdb, "k", 1, WithLease(time.Millisecond)) }},
		{"prefix", func() (*Concurrency, error) { return NewConcurrency(rdb, "k", 1, WithPrefix("a{b")) }},
	} {
		s, err := c.make()
		if !errors.Is(err, throttle.ErrInvalid) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("bad %s: err = %v, want ErrInvalid naming %s", c.field, err, c.field)
		}
		if s != nil {
			t.Errorf("bad %s: got a Concurrency", c.field)
		}
	}
	s := newSlots(t, rdb, "k", 1)
	ctx := context.Background()
	if _, err := s.Hold(ctx, "", -time.Second); !errors.Is(err, throttle.ErrInvalid) || !strings.Contains(err.Error(), "maxWait") {
		t.Errorf("Hold(maxWait -1s) = %v, want ErrInvalid naming maxWait", err)
	}
	if _, err := s.Hold(ctx, strings.Repeat("x", MaxKeyLen+1), 0); !errors.Is(err, throttle.ErrInvalid) || !errors.Is(err, throttle.ErrInvalidKey) {
		t.Errorf("Hold(too long a key) = %v, want ErrInvalid and ErrInvalidKey", err)
	}
}

// TestConcurrencyTooLongAKeyIsTheCallsProblem: a per-call key longer than
// MaxKeyLen fails that Hold with an error matching throttle.ErrInvalidKey
// (and ErrInvalid), which a consumer tells apart from a configuration
// mistake; the constructor's own key is a configuration mistake.
func TestConcurrencyTooLongAKeyIsTheCallsProblem(t *testing.T) {
	rdb := redisenv.New(t).Client()
	s := newSlots(t, rdb, "long", 1)
	_, err := s.Hold(context.Background(), strings.Repeat("k", MaxKeyLen+1), 0)
	if !errors.Is(err, throttle.ErrInvalidKey) || !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("Hold(key of %d bytes) = %v; want ErrInvalidKey and ErrInvalid", MaxKeyLen+1, err)
	}
	rel, err := s.Hold(context.Background(), strings.Repeat("k", MaxKeyLen), 0)
	if err != nil {
		t.Fatalf("Hold(key of MaxKeyLen bytes) = %v", err)
	}
	rel()
	if _, err := NewConcurrency(rdb, strings.Repeat("k", MaxKeyLen+1), 1); errors.Is(err, throttle.ErrInvalidKey) || !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("NewConcurrency(key of %d bytes) = %v; want ErrInvalid only (configuration)", MaxKeyLen+1, err)
	}
}

// newSlots builds a Concurrency that the test closes at its end.
func newSlots(t *testing.T, rdb redis.UniversalClient, key string, capacity int64, opts ...ConcurrencyOption) *Concurrency {
	t.Helper()
	s, err := NewConcurrency(rdb, key, capacity, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// count returns how many members hold a slot of key and how many wait,
// read from Redis (unexpired leases only).
func count(t *testing.T, rdb redis.UniversalClient, s *Concurrency, key string) (held, waiting int64) {
	t.Helper()
	keys := capKeys(t, s, key)
	ctx := context.Background()
	after := "(" + strconv.FormatInt(serverNow(t, rdb).UnixMilli(), 10)
	held, err := rdb.ZCount(ctx, keys[0], after, "+inf").Result()
	if err != nil {
		t.Fatal(err)
	}
	waiting, err = rdb.ZCount(ctx, keys[2], after, "+inf").Result()
	if err != nil {
		t.Fatal(err)
	}
	return held, waiting
}

// capKeys returns the Redis keys of s's cap for key, or fails the test.
func capKeys(t *testing.T, s *Concurrency, key string) []string {
	t.Helper()
	keys, err := s.keys(key)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// serverNow returns the time on the Redis server's clock, or fails the
// test.
func serverNow(t *testing.T, rdb redis.UniversalClient) time.Time {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// mustHold takes a slot of s's cap for the default key without waiting,
// or fails the test; it returns the release.
func mustHold(t *testing.T, s *Concurrency) func() {
	t.Helper()
	rel, err := s.Hold(context.Background(), "", 0)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// holdNowAndRelease asks s for a slot of its default key without
// waiting and gives back at once a slot it was granted; it returns the
// error of Hold.
func holdNowAndRelease(ctx context.Context, s *Concurrency) error {
	rel, err := s.Hold(ctx, "", 0)
	if err == nil {
		rel()
	}
	return err
}

// waitSlots waits for cond, failing the test after 5 s.
func waitSlots(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// capEnv is where the cap's guarantee checks run: a client per instance
// (as another process would have), a client that reads the cap's keys,
// the options of every Concurrency, and how many holds each worker of
// checkNeverMoreThanCapacity makes.
type capEnv struct {
	client func() redis.UniversalClient
	admin  redis.UniversalClient
	addr   string // the server's, for a store meter
	opts   []ConcurrencyOption
	rounds int
}

// defaultCapEnv: a server of the test's own, its default user.
func defaultCapEnv(t *testing.T) capEnv {
	srv := redisenv.New(t)
	return capEnv{client: func() redis.UniversalClient { return srv.Client() }, admin: srv.Client(), addr: srv.Addr(), rounds: 15}
}

// TestConcurrencyNeverMoreThanCapacityAcrossClients: several processes'
// worth of Concurrency values, each with its own Redis client, never have
// more than capacity callers inside the held section, counted by the test
// itself; and nothing is held once all have released.
func TestConcurrencyNeverMoreThanCapacityAcrossClients(t *testing.T) {
	t.Parallel()
	checkNeverMoreThanCapacity(t, defaultCapEnv(t))
}

func checkNeverMoreThanCapacity(t *testing.T, env capEnv) {
	const capacity, instances, workers = 3, 4, 3
	rounds := env.rounds
	var inside, most, calls atomic.Int64
	var wg sync.WaitGroup
	var first *Concurrency
	for i := range instances {
		rdb := env.client() // a client of its own, as another process would have
		s := newSlots(t, rdb, "api", capacity, env.opts...)
		if i == 0 {
			first = s
		}
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				for range rounds {
					release, err := s.Hold(ctx, "", throttle.Forever)
					if err != nil {
						t.Error(err)
						return
					}
					n := inside.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					calls.Add(1)
					time.Sleep(time.Millisecond) // the call in flight
					inside.Add(-1)
					release()
					release() // idempotent
				}
			}()
		}
	}
	wg.Wait()
	if m := most.Load(); m > capacity || m < 1 {
		t.Fatalf("most in flight = %d, want 1..%d", m, capacity)
	}
	if c := calls.Load(); c != int64(instances*workers*rounds) {
		t.Fatalf("calls = %d, want %d", c, instances*workers*rounds)
	}
	if h, w := count(t, env.admin, first, ""); h != 0 || w != 0 {
		t.Fatalf("after all released: %d held, %d waiting; want 0, 0", h, w)
	}
}

// TestConcurrencyServesWaitersInArrivalOrderAcrossClients: waiters of
// different clients get the slot in the order they joined the queue, and
// they are woken through Redis: with the default 10 s lease, five
// waiters told only by their renewals (every 3.3 s) would exceed the
// test's 5 s bound.
func TestConcurrencyServesWaitersInArrivalOrderAcrossClients(t *testing.T) {
	checkArrivalOrder(t, defaultCapEnv(t))
}

func checkArrivalOrder(t *testing.T, env capEnv) {
	holder := newSlots(t, env.client(), "fifo", 1, env.opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	release := mustHold(t, holder)
	const waiters = 5
	order := make(chan int, waiters)
	var wg sync.WaitGroup
	for i := range waiters {
		s := newSlots(t, env.client(), "fifo", 1, env.opts...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rel, err := s.Hold(ctx, "", throttle.Forever)
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			rel()
		}()
		waitSlots(t, "waiter queued", func() bool { _, w := count(t, env.admin, holder, ""); return w == int64(i+1) })
	}
	release()
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Fatalf("waiter %d served in place %d", got, want)
		}
		want++
	}
	if want != waiters {
		t.Fatalf("%d waiters served, want %d", want, waiters)
	}
}

// TestConcurrencyDeadHolderFreesItsSlotWithinTheLease: a holder whose
// renewals stop (its client closed, as when its process dies or loses
// Redis) loses its slot within the lease, and the slot goes to a waiter
// of another client; while it renewed, it kept the slot past the lease.
func TestConcurrencyDeadHolderFreesItsSlotWithinTheLease(t *testing.T) {
	t.Parallel()
	checkDeadHolder(t, defaultCapEnv(t))
}

func checkDeadHolder(t *testing.T, env capEnv) {
	const lease = 300 * time.Millisecond
	deadClient := env.client()
	dead, err := NewConcurrency(deadClient, "die", 1, WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := dead.Hold(ctx, "", 0); err != nil { // never released
		t.Fatal(err)
	}
	live := newSlots(t, env.client(), "die", 1, WithLease(lease))
	// While the holder lives, its renewals keep the slot past its lease.
	time.Sleep(2 * lease) // the time passing is what is tested
	if _, err := live.Hold(ctx, "", 0); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("Hold(0) while a live holder renews = %v, want ErrTimeout", err)
	}
	// The holder's connection is lost: its renewals fail from now on.
	stall, store := startStallMeter(t), startStoreMeter(t, env.addr)
	_ = deadClient.Close()
	defer dead.Close()
	died := time.Now()
	release, err := live.Hold(ctx, "", throttle.Forever)
	if err != nil {
		t.Fatalf("waiter after the holder died: %v", err)
	}
	served := time.Now()
	t.Logf("slot back %v after the holder died (lease %v)", served.Sub(died), lease)
	release()
	// The dead holder's last renewal was before died, so its slot is due
	// back by died+lease; the rest is the waiter's round trip.
	if msg := lateBeyondTheLease(served.Sub(died), lease, died, served, stall, store); msg != "" {
		t.Fatalf("slot back after the holder died: %s", msg)
	}
}

// lateBeyondTheLease says why took, the time from when a slot's holder
// (or first waiter) died, at from, to when the live waiter had the slot,
// at to, is longer than the lease allows; "" when it is not. What the
// meters saw from from to to is allowed on top of the lease and a round
// trip's slack: a host that holds back this process (stall) delays the
// waiter's renewals and wake-ups, one that holds back redis-server
// (store) delays the scripts that hand the slot on; neither is the cap.
// A slot that never comes back fails on the test's context instead.
func lateBeyondTheLease(took, lease time.Duration, from, to time.Time, stall *stallMeter, store *storeMeter) string {
	const slack = 500 * time.Millisecond
	overdue, late := stall.overdueDuring(from, to), store.lateDuring(from, to)
	if took <= lease+slack+overdue+late {
		return ""
	}
	return fmt.Sprintf("%v, want within the lease %v + %v + this process's stalls (%v) + the store's slowest answer (%v)", took, lease, slack, overdue, late)
}

// TestConcurrencyDeadWaiterDoesNotBlockTheQueue: a waiter whose process
// dies in the queue (its client closed) neither keeps its place nor a slot
// handed to it for longer than its lease: the live waiter behind it gets
// the slot within a lease of the release.
func TestConcurrencyDeadWaiterDoesNotBlockTheQueue(t *testing.T) {
	checkDeadWaiter(t, defaultCapEnv(t))
}

func checkDeadWaiter(t *testing.T, env capEnv) {
	const lease = 300 * time.Millisecond
	holder := newSlots(t, env.client(), "queue", 1, WithLease(lease))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	release := mustHold(t, holder)
	deadClient := env.client()
	dead := newSlots(t, deadClient, "queue", 1, WithLease(lease))
	deadDone := make(chan error, 1)
	go func() {
		_, err := dead.Hold(ctx, "", throttle.Forever)
		deadDone <- err
	}()
	waitSlots(t, "dead waiter queued", func() bool { _, w := count(t, env.admin, holder, ""); return w == 1 })
	_ = deadClient.Close()

	live := newSlots(t, env.client(), "queue", 1, WithLease(lease))
	stall, store := startStallMeter(t), startStoreMeter(t, env.addr)
	got := make(chan error, 1)
	go func() {
		rel, err := live.Hold(ctx, "", throttle.Forever)
		if err == nil {
			rel()
		}
		got <- err
	}()
	released := time.Now()
	release()
	if err := <-got; err != nil {
		t.Fatalf("live waiter behind a dead one: %v", err)
	}
	served := time.Now()
	t.Logf("live waiter served %v after the release (lease %v)", served.Sub(released), lease)
	if msg := lateBeyondTheLease(served.Sub(released), lease, released, served, stall, store); msg != "" {
		t.Fatalf("live waiter served after the release: %s", msg)
	}
	if err := <-deadDone; err == nil {
		t.Fatal("the dead waiter's Hold succeeded with its client closed")
	}
}

// TestConcurrencyGivingUpLeavesTheQueue: a caller that times out or is
// cancelled leaves the queue and holds nothing after.
func TestConcurrencyGivingUpLeavesTheQueue(t *testing.T) {
	checkGivingUp(t, defaultCapEnv(t))
}

func checkGivingUp(t *testing.T, env capEnv) {
	rdb := env.admin
	s := newSlots(t, env.client(), "quit", 1, env.opts...)
	other := newSlots(t, env.client(), "quit", 1, env.opts...)
	ctx := context.Background()
	release := mustHold(t, s)
	if _, err := other.Hold(ctx, "", 0); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("Hold(0) while full = %v, want ErrTimeout", err)
	}
	if _, err := other.Hold(ctx, "", 50*time.Millisecond); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("Hold(50ms) while full = %v, want ErrTimeout", err)
	}
	dctx, dcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer dcancel()
	if _, err := other.Hold(dctx, "", throttle.Forever); !errors.Is(err, throttle.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Hold past the context's deadline = %v, want ErrTimeout and DeadlineExceeded", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := other.Hold(cctx, "", throttle.Forever)
		done <- err
	}()
	waitSlots(t, "waiter queued", func() bool { _, w := count(t, rdb, s, ""); return w == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Hold = %v, want context.Canceled", err)
	}
	if h, w := count(t, rdb, s, ""); h != 1 || w != 0 {
		t.Fatalf("after giving up: %d held, %d waiting; want 1, 0", h, w)
	}
	release()
	if h, w := count(t, rdb, s, ""); h != 0 || w != 0 {
		t.Fatalf("after release: %d held, %d waiting; want 0, 0", h, w)
	}
	// The slot is free at once for a caller that does not wait.
	if err := holdNowAndRelease(ctx, other); err != nil {
		t.Fatalf("Hold(0) after release = %v", err)
	}
}

// TestConcurrencyKeysHaveTheirOwnCap: a per-call key has its own slots,
// and a key with braces cannot reach another key's cap.
func TestConcurrencyKeysHaveTheirOwnCap(t *testing.T) {
	rdb := redisenv.New(t).Client()
	s := newSlots(t, rdb, "tenants", 1)
	ctx := context.Background()
	var rels []func()
	for _, k := range []string{"", "a", "b", "}x{"} {
		rel, err := s.Hold(ctx, k, 0)
		if err != nil {
			t.Fatalf("Hold(%q) = %v, want a slot of its own", k, err)
		}
		rels = append(rels, rel)
	}
	if _, err := s.Hold(ctx, "a", 0); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("second Hold(a) = %v, want ErrTimeout", err)
	}
	for _, r := range rels {
		r()
	}
}

// TestConcurrencyCloseEndsWaits: Close wakes waiting callers with
// redis.ErrClosed and refuses later Holds; releases still work.
func TestConcurrencyCloseEndsWaits(t *testing.T) {
	rdb := redisenv.New(t).Client()
	s, err := NewConcurrency(rdb, "close", 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	release := mustHold(t, s)
	done := make(chan error, 1)
	go func() {
		_, err := s.Hold(ctx, "", throttle.Forever)
		done <- err
	}()
	waitSlots(t, "waiter queued", func() bool { _, w := count(t, rdb, s, ""); return w == 1 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("waiting Hold at Close = %v, want redis.ErrClosed", err)
	}
	if _, err := s.Hold(ctx, "", 0); !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("Hold after Close = %v, want redis.ErrClosed", err)
	}
	release()
	if h, w := count(t, rdb, s, ""); h != 0 || w != 0 {
		t.Fatalf("after release: %d held, %d waiting; want 0, 0", h, w)
	}
}

// TestConcurrencyOnACluster: on Redis Cluster the cap's scripts run
// without CROSSSLOT for keys with braces, and a waiter of one client is
// woken through the cluster when a holder of another releases.
func TestConcurrencyOnACluster(t *testing.T) {
	t.Parallel()
	cl := redisenv.NewCluster(t)
	a := newSlots(t, cl.Client(), "api{v1}", 1)
	b := newSlots(t, cl.Client(), "api{v1}", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, key := range []string{"", "{tenant}", "a}b"} {
		release, err := a.Hold(ctx, key, 0)
		if err != nil {
			t.Fatalf("Hold(%q) = %v", key, err)
		}
		got := make(chan error, 1)
		go func() {
			rel, err := b.Hold(ctx, key, throttle.Forever) // the default 10 s lease: only a wake-up is this fast
			if err == nil {
				rel()
			}
			got <- err
		}()
		waitSlots(t, "waiter queued", func() bool { _, w := count(t, cl.Client(), a, key); return w == 1 })
		release()
		if err := <-got; err != nil {
			t.Fatalf("waiter of key %q: %v", key, err)
		}
	}
}

// TestConcurrencyKilledProcessFreesItsSlot: another process (this test's
// binary, run again) holds the only slot; while it runs, this process
// finds none; once it is killed (SIGKILL: no release, no goodbye), the
// slot comes back within the lease.
func TestConcurrencyKilledProcessFreesItsSlot(t *testing.T) {
	const lease = 300 * time.Millisecond
	if addr := os.Getenv("HEADWAY_SLOTS_HOLDER"); addr != "" {
		holdForever(addr, lease)
		return
	}
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "a second process shares the server")
	cmd := exec.Command(os.Args[0], "-test.run=^TestConcurrencyKilledProcessFreesItsSlot$")
	cmd.Env = append(os.Environ(), "HEADWAY_SLOTS_HOLDER="+srv.Addr())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
		}
		_ = cmd.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "held\n" {
		t.Fatalf("holder process said %q, %v", line, err)
	}
	s := newSlots(t, srv.Client(), "proc", 1, WithLease(lease))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.Hold(ctx, "", 0); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("Hold(0) while the other process holds = %v, want ErrTimeout", err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed = true
	stall, store := startStallMeter(t), startStoreMeter(t, srv.Addr())
	died := time.Now()
	release, err := s.Hold(ctx, "", throttle.Forever)
	if err != nil {
		t.Fatalf("waiter after the holder process was killed: %v", err)
	}
	served := time.Now()
	t.Logf("slot back %v after the kill (lease %v)", served.Sub(died), lease)
	release()
	if msg := lateBeyondTheLease(served.Sub(died), lease, died, served, stall, store); msg != "" {
		t.Fatalf("slot back after the kill: %s", msg)
	}
}

// holdForever is the holder process of
// TestConcurrencyKilledProcessFreesItsSlot: it takes the slot, says so on
// stdout, and renews it until it is killed (or for a minute, should the
// test that runs it die first).
func holdForever(addr string, lease time.Duration) {
	s, err := NewConcurrency(redis.NewClient(&redis.Options{Addr: addr}), "proc", 1, WithLease(lease))
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := s.Hold(context.Background(), "", 0); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("held")
	time.Sleep(time.Minute)
}

// BenchmarkConcurrencyHoldRelease: a free slot taken and given back, two
// round trips.
func BenchmarkConcurrencyHoldRelease(b *testing.B) {
	rdb := redisenv.New(b).Client()
	s, err := NewConcurrency(rdb, "bench", 1)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for b.Loop() {
		release, err := s.Hold(ctx, "", 0)
		if err != nil {
			b.Fatal(err)
		}
		release()
	}
}

// BenchmarkConcurrencyHandoff: a slot passed back and forth between two
// clients that each wait for it: each op is one release and the other
// side's wake-up through Redis.
func BenchmarkConcurrencyHandoff(b *testing.B) {
	srv := redisenv.New(b)
	ctx := context.Background()
	var sides [2]*Concurrency
	for i := range sides {
		s, err := NewConcurrency(srv.Client(), "handoff", 1)
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		sides[i] = s
	}
	poll := srv.Client() // one client for every poll: a client per poll left thousands of connections open
	release, err := sides[0].Hold(ctx, "", 0)
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ResetTimer()
	for i := range b.N {
		got := make(chan func(), 1)
		next := sides[(i+1)%2]
		go func() {
			rel, err := next.Hold(ctx, "", throttle.Forever)
			if err != nil {
				b.Error(err)
				rel = func() {}
			}
			got <- rel
		}()
		for { // the other side queued before the release
			if _, w := countB(b, poll, next); w == 1 {
				break
			}
			time.Sleep(50 * time.Microsecond)
		}
		b.StartTimer()
		release()
		release = <-got
		b.StopTimer()
	}
	release()
}

func countB(b *testing.B, rdb redis.UniversalClient, s *Concurrency) (int64, int64) {
	keys, _ := s.keys("")
	n, err := rdb.ZCard(context.Background(), keys[2]).Result()
	if err != nil {
		b.Fatal(err)
	}
	return 0, n
}

// An instance with a shorter lease (a rolling deploy that changes
// WithLease) does not make the cap's keys vanish under the holders of a
// longer one: the capacity holds.
func TestConcurrencyShorterLeaseDoesNotDropLongerHolders(t *testing.T) {
	srv := redisenv.New(t)
	long := newSlots(t, srv.Client(), "mixed", 1, WithLease(3*time.Second))
	short := newSlots(t, srv.Client(), "mixed", 1, WithLease(60*time.Millisecond))
	ctx := context.Background()
	rel := mustHold(t, long)
	defer rel()
	if _, err := short.Hold(ctx, "", 10*time.Millisecond); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("the short-lease instance while the only slot is held: %v, want ErrTimeout", err)
	}
	// Beyond two of the short leases, on the server's clock: the keys
	// must still be there.
	time.Sleep(300 * time.Millisecond)
	if err := holdNowAndRelease(ctx, short); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("a second holder of a capacity of 1 while the first still holds: %v, want ErrTimeout", err)
	}
}

// More dead waiters of one key than a Lua unpack takes (8000) are dropped
// without failing the scripts: the cap goes on answering.
func TestConcurrencyManyDeadWaitersAreDropped(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	s := newSlots(t, rdb, "crowd", 1, WithLease(time.Second))
	ctx := context.Background()
	rel := mustHold(t, s)
	defer rel()
	keys := capKeys(t, s, "")
	now := serverNow(t, rdb)
	const n = 9000
	queue, leases := make([]redis.Z, n), make([]redis.Z, n)
	for i := range n {
		m := "deadbeef:" + strconv.Itoa(i)
		queue[i] = redis.Z{Score: float64(i + 1), Member: m}
		leases[i] = redis.Z{Score: float64(now.UnixMilli() - 1), Member: m} // ended
	}
	rdb.ZAdd(ctx, keys[1], queue...)
	rdb.ZAdd(ctx, keys[2], leases...)
	if _, err := s.Hold(ctx, "", 0); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("Hold after 9,000 dead waiters: %v, want ErrTimeout (the one slot is held), not a script error", err)
	}
	if left, err := rdb.ZCard(ctx, keys[1]).Result(); err != nil || left != 0 {
		t.Fatalf("waiters left in the queue: %d, %v; want 0", left, err)
	}
}

// TestConcurrencyNeverMoreThanCapacityAcrossProcesses: three processes,
// each with its own Concurrency on the same key and four callers, never
// hold more slots at once than the capacity, as counted by this process
// from what each holder reports while it holds (an independent count,
// not the cap's own).
func TestConcurrencyNeverMoreThanCapacityAcrossProcesses(t *testing.T) {
	t.Parallel()
	const (
		capacity  = 3
		processes = 3
		callers   = 4 // per process
		rounds    = 5 // holds per caller
	)
	if addr := os.Getenv("HEADWAY_SLOTS_WORKER"); addr != "" {
		holdAndReport(addr, os.Getenv("HEADWAY_SLOTS_COUNTER"), capacity, callers, rounds)
		return
	}
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "other processes share the server")

	var (
		mu              sync.Mutex
		inside, most    int
		entered, exited int
	)
	counter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.URL.Path {
		case "/enter":
			inside++
			entered++
			most = max(most, inside)
		case "/exit":
			inside--
			exited++
		}
	}))
	defer counter.Close()

	cmds := make([]*exec.Cmd, processes)
	outs := make([]*strings.Builder, processes)
	for i := range cmds {
		cmd := exec.Command(os.Args[0], "-test.run=^TestConcurrencyNeverMoreThanCapacityAcrossProcesses$")
		cmd.Env = append(os.Environ(), "HEADWAY_SLOTS_WORKER="+srv.Addr(), "HEADWAY_SLOTS_COUNTER="+counter.URL)
		outs[i] = new(strings.Builder)
		cmd.Stdout, cmd.Stderr = outs[i], outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
	}
	for i, cmd := range cmds {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("process %d: %v\n%s", i, err, outs[i])
			}
		case <-time.After(30 * time.Second):
			for _, c := range cmds {
				_ = c.Process.Kill()
			}
			<-done
			t.Fatalf("process %d did not finish within 30 s", i)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d holds, at most %d at once", entered, most)
	if want := processes * callers * rounds; entered != want || exited != want {
		t.Fatalf("%d holds entered and %d left, want %d", entered, exited, want)
	}
	if most > capacity {
		t.Fatalf("%d slots held at once across the processes, capacity %d", most, capacity)
	}
}

// holdAndReport is a process of
// TestConcurrencyNeverMoreThanCapacityAcrossProcesses: callers goroutines
// each take a slot rounds times, and report to the counter at url when
// they hold it and before they give it back. It exits non-zero on any
// failure.
func holdAndReport(addr, url string, capacity int64, callers, rounds int) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	s, err := NewConcurrency(rdb, "procs", capacity)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	report := func(path string) error {
		resp, err := client.Get(url + path)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	}
	var failed atomic.Bool
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range rounds {
				release, err := s.Hold(ctx, "", throttle.Forever)
				if err == nil {
					err = report("/enter")
					time.Sleep(5 * time.Millisecond) // the call
					if rerr := report("/exit"); err == nil {
						err = rerr
					}
					release()
				}
				if err != nil {
					fmt.Println(err)
					failed.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() {
		os.Exit(1)
	}
}

// TestConcurrencyHolderPutBackLeavesTheQueue: a member that a renewal
// puts back as a holder (its process learnt of its slot, then Redis lost
// it and re-queued it) leaves the queue, so it is not promoted a second
// time: the next free slot goes to the next waiter.
func TestConcurrencyHolderPutBackLeavesTheQueue(t *testing.T) {
	rdb := redisenv.New(t).Client()
	s := newSlots(t, rdb, "put-back", 2)
	keys := capKeys(t, s, "")
	ctx := context.Background()
	run := func(script *redis.Script, extra ...any) {
		t.Helper()
		if err := script.Run(ctx, rdb, keys, s.args("", extra...)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	run(scriptSlotsHold, "x:a", "wait", "")
	run(scriptSlotsHold, "x:b", "wait", "")
	run(scriptSlotsHold, "y:1", "wait", "") // queued: its wake-up will be lost
	run(scriptSlotsHold, "z:1", "wait", "") // queued behind it
	// A renewal of y's process, which holds y:1 after a wake-up from
	// before a loss, while Redis has y:1 back in its queue.
	run(scriptSlotsRenew, 1, "y:1")
	if err := rdb.ZRem(ctx, keys[4], "!frozen").Err(); err != nil { // the loss's freeze is not this test's
		t.Fatal(err)
	}
	run(scriptSlotsRelease, "x:a")
	run(scriptSlotsRelease, "x:b")
	if err := rdb.ZScore(ctx, keys[0], "z:1").Err(); err != nil {
		q, _ := rdb.ZRange(ctx, keys[1], 0, -1).Result()
		h, _ := rdb.ZRange(ctx, keys[0], 0, -1).Result()
		t.Fatalf("a slot freed with z:1 next in line: z:1 does not hold it (%v); holders %v, queue %v", err, h, q)
	}
}
