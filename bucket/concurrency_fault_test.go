package bucket

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// Faults of the fleet-wide cap: a Redis user without channel rights,
// new connections that stall, Redis restarted empty, a stop during a
// round trip.

// recordLog is a slog handler that keeps the messages of the records it
// is given, with their attributes, one string each.
type recordLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *recordLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *recordLog) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	l.mu.Lock()
	l.msgs = append(l.msgs, b.String())
	l.mu.Unlock()
	return nil
}
func (l *recordLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *recordLog) WithGroup(string) slog.Handler      { return l }

func (l *recordLog) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs...)
}

// noChannelUser is a Redis user with every command headway needs and no
// pub/sub channel: what a managed service gives by default (Redis 7's
// acl-pubsub-default is resetchannels).
func noChannelUser(t *testing.T, srv *redisenv.Server) func() redis.UniversalClient {
	t.Helper()
	u := redisenv.User{Name: "svc-" + strconv.FormatInt(time.Now().UnixNano(), 36), Password: "pw", Commands: redisCommands}
	redisenv.NewUser(t, srv, u)
	return func() redis.UniversalClient { return srv.UserClient(u) }
}

// TestConcurrencyWithoutChannelRightsKeepsItsGuarantee: under a Redis
// user that may neither publish nor subscribe, the cap still works: a
// Hold that may wait takes a free slot without waiting for a
// subscription that never comes, a waiter gets the slot a release hands
// it (told by its renewals), a try that promotes a waiter says there is
// no slot rather than failing, every key keeps its time to live, and
// Check logs what is missing without failing.
func TestConcurrencyWithoutChannelRightsKeepsItsGuarantee(t *testing.T) {
	srv := redisenv.New(t)
	client := noChannelUser(t, srv)
	const lease = 300 * time.Millisecond
	log := &recordLog{}
	a := newSlots(t, client(), "nochan", 1, WithLease(lease), WithLogger(slog.New(log)))
	b := newSlots(t, client(), "nochan", 1, WithLease(lease))
	ctx := context.Background()

	if err := a.Check(ctx); err != nil {
		t.Fatalf("Check without channel rights = %v, want nil (a warning, not an error)", err)
	}
	var warned bool
	for _, l := range log.lines() {
		warned = warned || strings.HasPrefix(l, "WARN") && strings.Contains(l, "slots-wake") && strings.Contains(l, "wake-ups fall back")
	}
	if !warned {
		t.Errorf("Check logged %q; want a warning naming the wake-up channel and the fallback", log.lines())
	}

	// Every slot free: a Hold that may wait takes one at once, not
	// after waiting for a subscription confirmation (which never comes).
	dctx, cancel := context.WithTimeout(ctx, 800*time.Millisecond)
	asked := time.Now()
	rel, err := a.Hold(dctx, "", throttle.Forever)
	cancel()
	if err != nil {
		t.Fatalf("Hold with every slot free (context of 800ms) = %v", err)
	}
	t.Logf("Hold(Forever) with every slot free took %v", time.Since(asked))

	// A waiter of another client gets the slot the release hands it.
	got := make(chan error, 1)
	go func() {
		r, err := b.Hold(ctx, "", 5*time.Second)
		if err == nil {
			r()
		}
		got <- err
	}()
	waitSlots(t, "waiter queued", func() bool { _, w := count(t, srv.Client(), a, ""); return w == 1 })
	released := time.Now()
	rel()
	if err := <-got; err != nil {
		t.Fatalf("waiter after a release, without wake-ups = %v", err)
	}
	t.Logf("waiter served %v after the release, without wake-ups (lease %v)", time.Since(released), lease)

	// A holder whose lease has ended and a waiter (of a process that
	// is not there to renew it): a try promotes the waiter and finds no
	// slot; it must not fail at the wake-up's PUBLISH, and every key
	// keeps a time to live.
	admin := srv.Client()
	keys := capKeys(t, a, "")
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	admin.ZAdd(ctx, keys[0], redis.Z{Score: float64(now.UnixMilli() - 1), Member: "deadbeef:1"})
	admin.ZAdd(ctx, keys[1], redis.Z{Score: 1, Member: "deadbeef:2"})
	admin.ZAdd(ctx, keys[2], redis.Z{Score: float64(now.UnixMilli() + 60_000), Member: "deadbeef:2"})
	if _, err := a.Hold(ctx, "", 0); !errors.Is(err, throttle.ErrTimeout) {
		t.Errorf("Hold(0) after a holder's lease ended, a waiter queued = %v, want ErrTimeout", err)
	}
	if h, _ := count(t, admin, a, ""); h != 1 {
		t.Errorf("%d holders after the promotion, want 1 (the waiter)", h)
	}
	for _, k := range keys {
		if ttl, err := admin.PTTL(ctx, k).Result(); err != nil || ttl == -1 {
			t.Errorf("key %s: PTTL = %v, %v; want a time to live", k, ttl, err)
		}
	}
}

// TestConcurrencyTryThatPromotesAWaiterKeepsTheTTL: a try (maxWait 0)
// that hands a freed slot to a waiter, and then finds none for itself,
// leaves every key of the cap with a time to live.
func TestConcurrencyTryThatPromotesAWaiterKeepsTheTTL(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	s := newSlots(t, rdb, "ttl", 1)
	keys := capKeys(t, s, "")
	ctx := context.Background()
	now := serverNow(t, rdb)
	// A holder whose lease has ended, and a waiter whose has not.
	rdb.ZAdd(ctx, keys[0], redis.Z{Score: float64(now.UnixMilli() - 1), Member: "deadbeef:1"})
	rdb.ZAdd(ctx, keys[1], redis.Z{Score: 1, Member: "deadbeef:2"})
	rdb.ZAdd(ctx, keys[2], redis.Z{Score: float64(now.UnixMilli() + 60_000), Member: "deadbeef:2"})
	if _, err := s.Hold(ctx, "", 0); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("Hold(0) with a waiter to promote = %v, want ErrTimeout", err)
	}
	if h, _ := count(t, rdb, s, ""); h != 1 {
		t.Fatalf("%d holders after the promotion, want 1 (the waiter)", h)
	}
	for _, k := range keys[:3] {
		if ttl, err := rdb.PTTL(ctx, k).Result(); err != nil || ttl < 0 && ttl != -2 {
			t.Errorf("key %s: PTTL = %v, %v; want a time to live", k, ttl, err)
		}
	}
}

// TestConcurrencyRestartedEmptyPutsLiveHoldersBack: after Redis restarts
// empty, the renewals of live holders put them back, so the cap counts
// them again and admits nobody beyond its capacity.
func TestConcurrencyRestartedEmptyPutsLiveHoldersBack(t *testing.T) {
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "a restart")
	const lease = 300 * time.Millisecond
	a := newSlots(t, srv.Client(), "restart", 2, WithLease(lease))
	b := newSlots(t, srv.Client(), "restart", 2, WithLease(lease))
	ctx := context.Background()
	for range 2 {
		rel := mustHold(t, a)
		defer rel()
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitSlots(t, "live holders back after the restart", func() bool {
		h, _ := count(t, srv.Client(), a, "")
		return h == 2
	})
	if err := holdNowAndRelease(ctx, b); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("Hold(0) of another instance with both slots held = %v, want ErrTimeout", err)
	}
}

// stallDialer is a client's dialer whose new connections stall for a
// while once armed (a TCP handshake lost, a proxy that accepts slowly):
// pooled connections still work. The test closes done at its end.
type stallDialer struct {
	addr  string
	stall atomic.Int64  // ns; 0: dial at once
	done  chan struct{} // closed at the test's end: stalls end
}

func (d *stallDialer) dial(ctx context.Context, network, _ string) (net.Conn, error) {
	if s := time.Duration(d.stall.Load()); s > 0 {
		t := time.NewTimer(s)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-d.done:
			t.Stop()
			return nil, errors.New("test over")
		}
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, d.addr)
}

// TestConcurrencyStalledSubscriptionBlocksNothingElse: while the first
// waiter's subscription connection stalls (new connections take 3 s,
// pooled ones are fine), renewals and releases go on: a live holder
// keeps the only slot, and the waiter's Hold returns within its wait.
func TestConcurrencyStalledSubscriptionBlocksNothingElse(t *testing.T) {
	t.Parallel()
	srv := redisenv.New(t)
	const lease = 600 * time.Millisecond // four leases fit in the stall
	d := &stallDialer{addr: srv.Addr(), done: make(chan struct{})}
	defer close(d.done)
	opt := srv.ClientOptions()
	opt.Dialer = d.dial
	stalling := redis.NewClient(opt)
	defer stalling.Close()
	// A few connections in the pool, which stay usable.
	var warm sync.WaitGroup
	for range 4 {
		warm.Go(func() {
			if err := stalling.Ping(context.Background()).Err(); err != nil {
				t.Error(err)
			}
		})
	}
	warm.Wait()
	a := newSlots(t, stalling, "stall", 1, WithLease(lease))
	b := newSlots(t, srv.Client(), "stall", 1, WithLease(lease))
	ctx := context.Background()
	rel := mustHold(t, a)
	d.stall.Store(int64(3 * time.Second))
	waited := make(chan error, 1)
	go func() {
		asked := time.Now()
		_, err := a.Hold(ctx, "", 200*time.Millisecond) // opens the subscription
		t.Logf("Hold(200ms) returned after %v: %v", time.Since(asked), err)
		waited <- err
	}()
	// Over four leases, the other instance never gets the held slot.
	end := time.Now().Add(4 * lease)
	for time.Now().Before(end) {
		if err := holdNowAndRelease(ctx, b); !errors.Is(err, throttle.ErrTimeout) {
			t.Fatalf("Hold(0) of another instance while the only slot is held = %v, want ErrTimeout", err)
		}
		time.Sleep(20 * time.Millisecond) // paces the probes; not a synchronisation
	}
	select {
	case err := <-waited:
		if !errors.Is(err, throttle.ErrTimeout) {
			t.Fatalf("Hold(200ms) while the slot is held = %v, want ErrTimeout", err)
		}
	default:
		t.Fatal("Hold(200ms) still waiting four leases on")
	}
	released := make(chan struct{})
	go func() {
		start := time.Now()
		rel()
		t.Logf("release took %v", time.Since(start))
		close(released)
	}()
	select {
	case <-released:
	case <-time.After(2 * time.Second):
		t.Fatal("release still running 2s on, while only new connections stall")
	}
}

// TestConcurrencyStopDuringTheRoundTripNamesItsCause: a Hold whose wait
// is stopped (throttle.ContextWithWaitStop) while its script is on its way
// returns the stop's error, naming its cause, not a store error.
func TestConcurrencyStopDuringTheRoundTripNamesItsCause(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	hook := &holdHook{entered: make(chan struct{})}
	rdb.AddHook(hook)
	s := newSlots(t, rdb, "stopped", 1)
	stop, cancelStop := context.WithCancelCause(context.Background())
	ctx := throttle.ContextWithWaitStop(context.Background(), stop)
	done := make(chan error, 1)
	hook.armed.Store(true)
	go func() {
		_, err := s.Hold(ctx, "", 0)
		done <- err
	}()
	<-hook.entered
	cause := errors.New("partition 3 revoked")
	cancelStop(cause)
	err := <-done
	var be *throttle.BackendError
	if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) || errors.As(err, &be) {
		t.Fatalf("Hold stopped during its round trip = %v; want context.Canceled naming the stop's cause, not a store error", err)
	}
	if h, w := count(t, srv.Client(), s, ""); h != 0 || w != 0 {
		t.Fatalf("after the stopped Hold: %d held, %d waiting; want 0, 0", h, w)
	}
}

// holdHook holds the first script sent once armed until its context
// ends, as a server that does not answer.
type holdHook struct {
	armed   atomic.Bool
	entered chan struct{}
}

func (h *holdHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.HasPrefix(cmd.Name(), "eval") && h.armed.CompareAndSwap(true, false) {
			close(h.entered)
			<-ctx.Done()
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
		return next(ctx, cmd)
	}
}
func (h *holdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestConcurrencyRoundTripEndsWithTheWait: a Hold whose script gets no
// answer returns when its maxWait runs out, with ErrTimeout, not at the
// round trip's own one-second bound with a store error; and leaves
// nothing behind.
func TestConcurrencyRoundTripEndsWithTheWait(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	hook := &holdHook{entered: make(chan struct{})}
	rdb.AddHook(hook)
	s := newSlots(t, rdb, "bounded", 1)
	hook.armed.Store(true)
	asked := time.Now()
	_, err := s.Hold(context.Background(), "", 200*time.Millisecond)
	t.Logf("Hold(200ms) with no answer returned after %v: %v", time.Since(asked), err)
	if !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("Hold(200ms) whose script gets no answer = %v, want ErrTimeout", err)
	}
	if h, w := count(t, srv.Client(), s, ""); h != 0 || w != 0 {
		t.Fatalf("after the Hold: %d held, %d waiting; want 0, 0", h, w)
	}
}

// lateHook delays the first renewal script sent once armed until the
// test opens gate, then sends it whatever its context says: a command
// already written to a slow network, from a client that does not honour
// context deadlines (the default). landed is closed once Redis answered.
type lateHook struct {
	sha     string
	armed   atomic.Bool
	entered chan struct{}
	gate    chan struct{}
	landed  chan struct{}
	err     error // the late command's, once landed
}

func (h *lateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) > 1 && args[1] == h.sha && h.armed.CompareAndSwap(true, false) {
			close(h.entered)
			<-h.gate
			err := next(context.WithoutCancel(ctx), cmd)
			h.err = err
			close(h.landed)
			return err
		}
		return next(ctx, cmd)
	}
}
func (h *lateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestConcurrencyRenewalLandingAfterTheReleaseDoesNotTakeTheSlotBack: a
// renewal that its one round trip's bound gave up on, but that reaches
// Redis after the holder's release, does not put the released holder
// back: the slot stays free for the next caller, not lost for a lease.
func TestConcurrencyRenewalLandingAfterTheReleaseDoesNotTakeTheSlotBack(t *testing.T) {
	srv := redisenv.New(t)
	rdb := srv.Client()
	hook := &lateHook{sha: scriptSlotsRenew.Hash(), entered: make(chan struct{}), gate: make(chan struct{}), landed: make(chan struct{})}
	rdb.AddHook(hook)
	const lease = 300 * time.Millisecond
	a := newSlots(t, rdb, "late-renewal", 1, WithLease(lease))
	b := newSlots(t, srv.Client(), "late-renewal", 1, WithLease(lease))
	ctx := context.Background()
	if err := scriptSlotsRenew.Load(ctx, rdb).Err(); err != nil { // as after any earlier renewal
		t.Fatal(err)
	}
	rel := mustHold(t, a)
	hook.armed.Store(true)
	<-hook.entered // a renewal is on its way, and stays there
	rel()          // waits for the renewal's bound, then releases
	if h, _ := count(t, srv.Client(), a, ""); h != 0 {
		t.Fatalf("after the release: %d held, want 0", h)
	}
	close(hook.gate)
	<-hook.landed
	if hook.err != nil {
		t.Fatalf("the late renewal: %v", hook.err)
	}
	if h, _ := count(t, srv.Client(), a, ""); h != 0 {
		t.Fatalf("after the late renewal landed: %d held, want 0 (the released holder is back)", h)
	}
	if err := holdNowAndRelease(ctx, b); err != nil {
		t.Fatalf("Hold(0) of another instance after the release and the late renewal = %v, want the free slot", err)
	}
}

// TestConcurrencyRestartedEmptyAdmitsNobodyBeforeHoldersAreBack: after
// Redis restarts empty, an instance that holds slots of the cap sees at
// its next Hold that Redis lost them, and the cap admits nobody new, of
// any instance, until the live holders' renewals have had time to put
// them back; then it serves its waiters again.
func TestConcurrencyRestartedEmptyAdmitsNobodyBeforeHoldersAreBack(t *testing.T) {
	t.Parallel()
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "a restart")
	const lease = 1500 * time.Millisecond // renewals every 500 ms: the test acts before
	a := newSlots(t, srv.Client(), "restart-closed", 2, WithLease(lease))
	b := newSlots(t, srv.Client(), "restart-closed", 2, WithLease(lease))
	ctx := context.Background()
	var rels []func()
	for range 2 {
		rel := mustHold(t, a)
		rels = append(rels, rel)
	}
	defer func() {
		for _, rel := range rels {
			rel()
		}
	}()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Concurrency{a, b} {
		if err := holdNowAndRelease(ctx, s); !errors.Is(err, throttle.ErrTimeout) {
			t.Fatalf("Hold(0) right after the restart, both slots held by live callers = %v, want ErrTimeout", err)
		}
	}
	waitSlots(t, "live holders back after the restart", func() bool {
		h, _ := count(t, srv.Client(), a, "")
		return h == 2
	})
	rels[0]()
	rels = rels[1:]
	rel, err := b.Hold(ctx, "", 5*time.Second)
	if err != nil {
		t.Fatalf("Hold(5s) once a holder released after the restart = %v, want the slot", err)
	}
	rel()
}

// TestConcurrencyRestartedEmptyAdmitsNoInstanceThatUsedTheKey: after
// Redis restarts empty, an instance that used the key before (it held a
// slot and gave it back: it now holds and waits for nothing) gets no
// slot while the live holders' renewals have not yet put them back. The
// holders' clocks stand still, so their renewals do not come: the Hold
// asks before any renewal lands.
func TestConcurrencyRestartedEmptyAdmitsNoInstanceThatUsedTheKey(t *testing.T) {
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "a restart")
	const lease = 300 * time.Millisecond
	a := newSlots(t, srv.Client(), "restart-knew", 2, WithLease(lease))
	b := newSlots(t, srv.Client(), "restart-knew", 2, WithLease(lease))
	c := newSlots(t, srv.Client(), "restart-knew", 2, WithLease(lease))
	a.clock, b.clock = clockwork.NewFakeClock(), clockwork.NewFakeClock() // no renewals
	ctx := context.Background()
	rel := mustHold(t, c)
	rel()
	for _, s := range []*Concurrency{a, b} {
		rel := mustHold(t, s)
		defer rel()
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := holdNowAndRelease(ctx, c); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("Hold(0), right after the restart, of an instance that used the key, both slots held by live callers = %v, want ErrTimeout", err)
	}
}

// TestConcurrencyReleasedKeyIdleLongerThanASilenceAdmitsAtOnce: a cap
// whose holders all gave their slots back, and that nobody used for
// longer than a renewal period plus its round trip (three leases here:
// the idle keys have expired, the generation has not), is not taken for
// one whose holders were cut off: Hold(0) of the instance that used it,
// and of a new one, get their slots at once.
func TestConcurrencyReleasedKeyIdleLongerThanASilenceAdmitsAtOnce(t *testing.T) {
	t.Parallel()
	srv := redisenv.New(t)
	const lease = 300 * time.Millisecond
	used := newSlots(t, srv.Client(), "idle", 2, WithLease(lease))
	ctx := context.Background()
	var rels []func()
	for range 2 {
		rel := mustHold(t, used)
		rels = append(rels, rel)
	}
	for _, rel := range rels {
		rel()
	}
	time.Sleep(3 * lease) // the idle time is what is tested
	fresh := newSlots(t, srv.Client(), "idle", 2, WithLease(lease))
	for _, s := range []*Concurrency{used, fresh} {
		rel, err := s.Hold(ctx, "", 0)
		if err != nil {
			t.Fatalf("Hold(0) on a cap released normally and idle for %v = %v, want a slot at once", 3*lease, err)
		}
		defer rel()
	}
}

// TestConcurrencyHolderKilledOnAnIdleKeyClosesTheCapOnce: the cost of
// telling a silence of Redis from one of the fleet. A holder whose
// process stopped (its client closed: no renewal, no release) on a cap
// nobody else used looks like a live holder cut off while Redis was out:
// the first Hold after its lease ended finds a lease that ended in a
// silence longer than a renewal period plus its round trip, and closes
// the cap for that long (lease/3 + min(lease/3, 1 s)); a Hold(0) then
// fails with ErrTimeout, a waiting Hold gets the slot once the span is
// over, and the next Hold(0) is served at once.
func TestConcurrencyHolderKilledOnAnIdleKeyClosesTheCapOnce(t *testing.T) {
	t.Parallel()
	srv := redisenv.New(t)
	const lease = 300 * time.Millisecond
	deadClient := srv.Client()
	dead, err := NewConcurrency(deadClient, "killed", 1, WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	ctx := context.Background()
	if _, err := dead.Hold(ctx, "", 0); err != nil { // never released
		t.Fatal(err)
	}
	_ = deadClient.Close() // the process is gone
	s := newSlots(t, srv.Client(), "killed", 1, WithLease(lease))
	waitSlots(t, "the dead holder's lease ended", func() bool {
		h, _ := count(t, srv.Client(), s, "")
		return h == 0
	})
	if err := holdNowAndRelease(ctx, s); !errors.Is(err, throttle.ErrTimeout) {
		t.Fatalf("Hold(0) right after a lease ended with nothing running = %v, want ErrTimeout (the cap closed for a span)", err)
	}
	start := time.Now()
	rel, err := s.Hold(ctx, "", 5*time.Second)
	if err != nil {
		t.Fatalf("Hold(5s) after the dead holder's lease = %v, want the slot once the span is over", err)
	}
	t.Logf("slot after %v (span %v)", time.Since(start), lease/3+min(lease/3, time.Second))
	rel()
	rel, err = s.Hold(ctx, "", 0)
	if err != nil {
		t.Fatalf("Hold(0) after the span, the cap free = %v, want the slot at once", err)
	}
	rel()
}
