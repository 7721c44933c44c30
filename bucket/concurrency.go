package bucket

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/throttle"
	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/slots_common.lua
	srcSlotsCommon string
	//go:embed lua/slots_hold.lua
	srcSlotsHold string
	//go:embed lua/slots_release.lua
	srcSlotsRelease string
	//go:embed lua/slots_renew.lua
	srcSlotsRenew string

	scriptSlotsHold    = redis.NewScript(srcSlotsCommon + srcSlotsHold)
	scriptSlotsRelease = redis.NewScript(srcSlotsCommon + srcSlotsRelease)
	scriptSlotsRenew   = redis.NewScript(srcSlotsCommon + srcSlotsRenew)
)

// defaultSlotLease is a Concurrency's lease unless WithLease says
// otherwise.
const defaultSlotLease = 10 * time.Second

// slotCallTimeout bounds each round trip of a Concurrency that has no
// tighter bound: a release, a renewal, the leave of a caller that gave up.
const slotCallTimeout = time.Second

// WithLease sets how long a [Concurrency] slot, or a place in its queue,
// outlives its holder: a live holder renews its lease every lease/3 in
// the background, so a long call keeps its slot; a holder that died
// (process killed, network lost) gives its slot back at most one lease
// after its last renewal. Default: 10 s. A shorter lease frees the slots
// of dead holders sooner and costs more renewals (one round trip per key
// held, per lease/3, per process). It must be between 30 ms and
// [MaxInterval].
func WithLease(d time.Duration) ConcurrencyOption {
	return concurrencyOnly(func(c *config) { c.slotLease = d })
}

// Concurrency caps the calls in flight per key across a fleet, on Redis:
// it implements [throttle.Slots]. Every process that builds a Concurrency
// with the same client's Redis, key and prefix shares one cap of capacity
// slots per key (give them all the same capacity).
//
//	slots, err := bucket.NewConcurrency(rdb, "provider", 8)
//	...
//	release, err := slots.Hold(ctx, "", 5*time.Second)
//	if err != nil {
//		return err
//	}
//	defer release()
//
// Guarantees:
//   - At most capacity holders of a key at once, counted on the Redis
//     server's clock.
//   - A holder's slot lasts from Hold until its release, renewed in the
//     background every lease/3 ([WithLease]); a holder that stops renewing
//     (its process died or lost Redis) loses its slot at most one lease
//     after its last renewal, and the slot goes to the next waiter.
//   - Waiters are served in arrival order across the fleet: a freed slot
//     is handed to the oldest waiter in the same script, and its process
//     is woken by a Redis publish. Nobody polls: a waiter also looks again
//     by itself only when the earliest lease ends, in case a wake-up was
//     lost.
//   - A caller that gives up (maxWait, its context) leaves the queue, and
//     gives back a slot handed to it in the meantime.
//
// Each decision is one Lua script. Connections: one subscription
// connection per Concurrency, opened at the first wait, plus the client's
// pool for the scripts; a waiting caller holds no connection. Renewals run
// while something is held or waited for; the subscription, once opened,
// runs until [Concurrency.Close]: call Close when done with a
// Concurrency. The wake-ups need pub/sub: a redis.Ring client (whose
// shards share no pub/sub) and an ACL user without channel permissions
// lose them, and waiters are then served only when the earliest lease
// ends.
//
// A holder whose process loses Redis for longer than a lease loses its
// slot while its call may still run: the cap then admits a call more until
// that one ends. Renewals are one round trip per key held, 16 at a time,
// within lease/3: a process holding slots of thousands of keys at once
// needs a longer lease.
//
// A release makes one round trip to Redis (at most a second); if it fails,
// the slot comes back when its lease ends.
type Concurrency struct {
	c        common
	capacity int64
	lease    time.Duration
	inst     string // random; names this value's members and wake-up channel
	chPrefix string // channel of instance i: chPrefix + i
	clock    clockwork.Clock
	seq      atomic.Uint64

	mu       sync.Mutex
	members  map[string]*slotMember // held or waiting, renewed
	renewing bool                   // the renewal goroutine runs
	closed   bool
	life     context.Context // ended by Close
	end      context.CancelFunc
	wg       sync.WaitGroup
	ps       *redis.PubSub // nil until the first wait
	psReady  chan struct{} // closed when the subscription is confirmed
}

// slotMember is one Hold's entry in Redis: a slot held or a place in the
// queue.
type slotMember struct {
	keys []string
	wake chan struct{} // receives when Redis hands it a slot
}

// NewConcurrency returns a fleet-wide cap of capacity calls in flight per
// key, shared through Redis under key. Options: [WithPrefix], [WithLease].
// capacity must be between 1 and 2^50; key as for the other buckets.
func NewConcurrency(rdb redis.UniversalClient, key string, capacity int64, opts ...ConcurrencyOption) (*Concurrency, error) {
	const name = "bucket: NewConcurrency"
	c, err := newCommon(name, rdb, key, opts)
	if err != nil {
		return nil, err
	}
	if err := checkLimitRange(name, "capacity", capacity); err != nil {
		return nil, err
	}
	if err := checkDuration(name, "lease", c.cfg.slotLease, 30*time.Millisecond); err != nil {
		return nil, err
	}
	c.name = "bucket: Concurrency"
	var raw [8]byte
	_, _ = rand.Read(raw[:])
	life, end := context.WithCancel(context.Background())
	return &Concurrency{
		c:        c,
		capacity: capacity,
		lease:    c.cfg.slotLease,
		inst:     hex.EncodeToString(raw[:]),
		chPrefix: c.cfg.prefix + ":slots-wake:",
		clock:    clockwork.NewRealClock(),
		members:  make(map[string]*slotMember),
		life:     life,
		end:      end,
	}, nil
}

// keys returns the Redis keys of key's cap, all under one hash tag.
func (s *Concurrency) keys(key string) ([]string, error) {
	tag, err := s.c.ks.tag(s.c.name, key)
	if err != nil {
		return nil, err
	}
	return []string{tag + ":slots", tag + ":slots-queue", tag + ":slots-waiting", tag + ":slots-seq"}, nil
}

func (s *Concurrency) args(extra ...any) []any {
	return append([]any{s.capacity, s.lease.Milliseconds(), s.chPrefix}, extra...)
}

// Hold implements [throttle.Slots]. After [Concurrency.Close] it fails
// with an error matching redis.ErrClosed.
func (s *Concurrency) Hold(ctx context.Context, key string, maxWait time.Duration) (func(), error) {
	if maxWait < 0 {
		return nil, errs.Invalid("bucket: Concurrency.Hold", "maxWait", maxWait, "must be 0 (no wait), positive, or throttle.Forever")
	}
	keys, err := s.keys(key)
	if err != nil {
		return nil, err
	}
	ctx, cancel := throttle.WaitContext(ctx) // a stop ends the wait too
	defer cancel()
	if err := ctx.Err(); err != nil {
		return nil, waitErr(ctx)
	}
	start := s.clock.Now()
	var expired <-chan time.Time
	if maxWait > 0 && maxWait != throttle.Forever {
		t := s.clock.NewTimer(maxWait)
		defer t.Stop()
		expired = t.Chan()
	}
	mode := "try"
	if maxWait > 0 {
		mode = "wait"
		s.subscribe(ctx, maxWait)
	}
	id := s.inst + ":" + strconv.FormatUint(s.seq.Add(1), 36)
	m := &slotMember{keys: keys, wake: make(chan struct{}, 1)}
	if err := s.track(id, m); err != nil {
		return nil, err
	}
	for {
		r, err := s.run(ctx, "hold", scriptSlotsHold, keys, id, mode)
		if err != nil {
			s.leave(id, m)
			return nil, err
		}
		if r[0] == 1 {
			return s.releaser(id, m), nil
		}
		if r[1] < 0 {
			s.untrack(id)
			return nil, fmt.Errorf("%s: no slot of key %q free: %w", s.c.name, key, throttle.ErrTimeout)
		}
		look := s.clock.NewTimer(ms(r[1]))
		select {
		case <-m.wake:
			look.Stop()
			return s.releaser(id, m), nil
		case <-look.Chan():
			continue
		case <-expired:
			err = fmt.Errorf("%s: no slot of key %q within %v: %w", s.c.name, key, s.clock.Since(start), throttle.ErrTimeout)
		case <-ctx.Done():
			err = waitErr(ctx)
			if errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("%s: no slot of key %q before the context's deadline: %w: %w", s.c.name, key, throttle.ErrTimeout, err)
			}
		case <-s.life.Done():
			err = fmt.Errorf("%s: %w", s.c.name, redis.ErrClosed)
		}
		look.Stop()
		s.leave(id, m)
		return nil, err
	}
}

// waitErr is the error of a wait for a slot that ctx ended: its error,
// and its cause when that says more (a stop's).
func waitErr(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%w (%w)", err, cause)
	}
	return err
}

// run runs one of the cap's scripts for member id, bounded by ctx and by
// slotCallTimeout. The scripts are idempotent per member, so go-redis may
// resend them.
func (s *Concurrency) run(ctx context.Context, op string, script *redis.Script, keys []string, extra ...any) ([]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, slotCallTimeout)
	defer cancel()
	var r []int64
	_, err := bounded(ctx, &s.c, "", func(ctx context.Context) (throttle.Decision, error) {
		v, err := script.Run(ctx, s.c.rdb, keys, s.args(extra...)...).Int64Slice()
		if err != nil {
			return throttle.Decision{}, backend(op, keys[0], err)
		}
		r = v
		return throttle.Decision{}, nil
	})
	if err != nil {
		var be *throttle.BackendError
		if !errors.As(err, &be) {
			err = backend(op, keys[0], err)
		}
		return nil, err
	}
	if op == "hold" && len(r) != 2 {
		return nil, backend(op, keys[0], fmt.Errorf("unexpected reply %v", r))
	}
	return r, nil
}

// releaser returns the idempotent function that gives id's slot back.
func (s *Concurrency) releaser(id string, m *slotMember) func() {
	var once sync.Once
	return func() { once.Do(func() { s.leave(id, m) }) }
}

// leave stops renewing id and removes it from the cap, holder or waiter,
// in one round trip that does not depend on the caller's context: a caller
// that gave up must not leave a slot behind. If the round trip fails, the
// lease ends it.
func (s *Concurrency) leave(id string, m *slotMember) {
	s.untrack(id)
	_, _ = s.run(context.Background(), "release", scriptSlotsRelease, m.keys, id)
}

// track registers id for renewals and wake-ups, starting the renewal
// goroutine if it does not run.
func (s *Concurrency) track(id string, m *slotMember) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("%s: %w", s.c.name, redis.ErrClosed)
	}
	s.members[id] = m
	if !s.renewing {
		s.renewing = true
		s.wg.Add(1)
		go s.renew()
	}
	return nil
}

func (s *Concurrency) untrack(id string) {
	s.mu.Lock()
	delete(s.members, id)
	s.mu.Unlock()
}

// renewParallel bounds the renewal scripts of one Concurrency in flight at
// once.
const renewParallel = 16

// renew extends the leases of every member of this Concurrency every
// lease/3, one script per key (renewParallel at a time), and returns when
// none is left or at Close.
func (s *Concurrency) renew() {
	defer s.wg.Done()
	tick := s.clock.NewTicker(s.lease / 3)
	defer tick.Stop()
	for {
		select {
		case <-s.life.Done():
			return
		case <-tick.Chan():
		}
		s.mu.Lock()
		if len(s.members) == 0 {
			s.renewing = false
			s.mu.Unlock()
			return
		}
		byKey := make(map[string][]any)
		keysOf := make(map[string][]string)
		for id, m := range s.members {
			byKey[m.keys[0]] = append(byKey[m.keys[0]], id)
			keysOf[m.keys[0]] = m.keys
		}
		s.mu.Unlock()
		// Keys renewed side by side, a few at a time: in series, the
		// renewals of many keys held at once did not fit in lease/3,
		// and the later keys' leases ended under live holders.
		ctx, cancel := context.WithTimeout(s.life, min(s.lease/3, slotCallTimeout))
		var wg sync.WaitGroup
		sem := make(chan struct{}, renewParallel)
		for k, ids := range byKey {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				_, _ = s.run(ctx, "renew", scriptSlotsRenew, keysOf[k], ids...)
			}()
		}
		wg.Wait()
		cancel()
	}
}

// subscribe opens the wake-up subscription at the first wait and waits
// (within ctx and maxWait, at most a second) until Redis confirms it, so that no
// wake-up published after the caller joins the queue is missed.
func (s *Concurrency) subscribe(ctx context.Context, maxWait time.Duration) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	if s.ps == nil {
		s.ps = s.c.rdb.Subscribe(context.Background(), s.chPrefix+s.inst)
		s.psReady = make(chan struct{})
		s.wg.Add(1)
		go s.listen(s.ps, s.psReady)
	}
	ready := s.psReady
	s.mu.Unlock()
	// Within the caller's wait: a subscription slow to confirm (or
	// never, without channel permissions) costs a wake-up, not the wait.
	t := s.clock.NewTimer(min(slotCallTimeout, maxWait))
	defer t.Stop()
	select {
	case <-ready:
	case <-ctx.Done():
	case <-t.Chan():
	}
}

// listen delivers wake-ups to the waiters they name until Close. A
// message lost while the connection is down costs a waiter at most the
// time until the earliest lease ends, when it looks again by itself.
func (s *Concurrency) listen(ps *redis.PubSub, ready chan struct{}) {
	defer s.wg.Done()
	confirmed := false
	ctx := context.Background()
	for {
		msg, err := ps.ReceiveTimeout(ctx, s.lease)
		if err != nil {
			select {
			case <-s.life.Done():
				return
			default:
			}
			if errors.Is(err, redis.ErrClosed) {
				return
			}
			var ne interface{ Timeout() bool }
			if errors.As(err, &ne) && ne.Timeout() {
				_ = ps.Ping(ctx) // a dead connection fails here and reconnects at the next receive
				continue
			}
			t := s.clock.NewTimer(50 * time.Millisecond) // Redis unreachable: try again shortly
			select {
			case <-s.life.Done():
				t.Stop()
				return
			case <-t.Chan():
			}
			continue
		}
		switch msg := msg.(type) {
		case *redis.Subscription:
			if !confirmed {
				confirmed = true
				close(ready)
			}
		case *redis.Message:
			s.wake(msg.Payload)
		}
	}
}

// wake signals the members named in payload (space-separated).
func (s *Concurrency) wake(payload string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range strings.Fields(payload) {
		if m := s.members[id]; m != nil {
			select {
			case m.wake <- struct{}{}:
			default:
			}
		}
	}
}

// Close stops the background work: renewals and wake-ups. Callers still
// waiting return an error matching redis.ErrClosed, and later Holds fail
// with it. Slots still held are not given back by Close: their releases
// still do it, or their leases end. Close does not close rdb. It is safe
// to call more than once.
func (s *Concurrency) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.end()
	ps := s.ps
	s.mu.Unlock()
	var err error
	if ps != nil {
		err = ps.Close()
	}
	s.wg.Wait()
	return err
}

var _ throttle.Slots = (*Concurrency)(nil)
