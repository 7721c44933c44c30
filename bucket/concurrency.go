package bucket

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/internal/waitstop"
	"github.com/headway-go/headway/throttle"
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
// outlives its holder's last renewal; a live holder renews every lease/3
// in the background (see [Concurrency]). Default: 10 s. A shorter lease
// frees the slots of dead holders sooner and costs more renewals: one
// round trip per key held, per lease/3, per process, 16 at a time, so a
// process holding slots of thousands of keys at once needs a longer
// lease. It must be between 30 ms and [MaxInterval].
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
//     after its last renewal, and the slot goes to the next waiter. A
//     live holder that Redis lost (restarted empty, a failover that lost
//     the write, a lease that ended while its process was cut off from
//     Redis, or while Redis was out) is put back by its next renewal,
//     and counts again; until then, the cap admits nobody new, with the
//     exceptions below.
//   - Waiters are served in arrival order across the fleet: a freed slot
//     is handed to the oldest waiter in the same script, and its process
//     is woken by a Redis publish. Nobody polls: a waiter also learns of
//     its slot from its process's next renewal (lease/3), in case a
//     wake-up was lost, and looks again by itself when the earliest
//     lease ends.
//   - A caller that gives up (maxWait, its context, a wait stop) leaves
//     the queue, and gives back a slot handed to it in the meantime.
//
// Each decision is one Lua script. Connections: one subscription
// connection per Concurrency, opened in the background at the first wait,
// plus the client's pool for the scripts; a waiting caller holds no
// connection, and no Hold waits for the subscription. Renewals run while
// something is held or waited for; the subscription, once opened, runs
// until [Concurrency.Close]: call Close when done with a Concurrency.
//
// The wake-ups need pub/sub on channel "<prefix>:slots-wake:*" (see
// docs/operations.md for the Redis user's rights). Without it (a Redis 7
// ACL user without channel rights, the default for a new user; a
// redis.Ring, whose shards share no pub/sub) the cap keeps its
// guarantees, and a waiter learns of its slot at its process's next
// renewal, within lease/3 of the release. [Concurrency.Check], and the
// first wait, log a warning through [WithLogger]'s logger when the user
// lacks the rights.
//
// After Redis loses the cap's keys (restarted empty, a failover that lost
// them, keys deleted), the cap closes to newcomers for lease/3 plus a
// renewal's round trip, the time the live holders' renewals need to put
// them back, from the first script of any instance that used the key
// within nine tenths of max(1 h, 4 leases) (54 minutes for leases up to
// 15 minutes): the keys carry a generation that every reply tells and
// every instance passes back (it remembers those of at most 16384
// keys), and a script that finds it gone, or new, knows that Redis lost
// the cap. A renewal, or a Hold of an instance that holds or waits in
// the key, that finds a member of its own missing does the same. The cap then admits nobody
// until the holders are fewer than capacity. Only Holds of instances that
// did not use the key in that time (new, or idle), asking before any of
// those scripts, can be admitted beyond capacity: up to capacity of them,
// within lease/3.
//
// When Redis itself is out for longer than a lease and keeps the cap
// (paused, a failover slower than a lease), every lease ends on the
// server's clock while the calls go on. The cap tells: every script
// records the server's time on the cap, and the first script after a
// silence longer than lease/3 + min(lease/3, 1 s) (a renewal period and
// its round trip), in which holders' leases ended, closes the cap for that
// long, whichever instance sent it (new, idle or busy), while the live
// holders' renewals put them back. The record and the holders' entries
// last max(1 h, 4 leases) past the last script: a longer outage goes
// untold. The cost: a cap whose holders all stopped without a release
// (processes killed) and that nobody used since looks the same, and its
// next Hold waits that long, once (4.3 s with the default lease; with
// maxWait 0 it fails with [throttle.ErrTimeout]). A silence shorter than
// that counts too for a holder whose renewal was due after it began (late
// within its round trip, then cut off). A cap whose holders released and
// an idle one pay nothing; one with live renewals too, except that with a
// lease under 6 s a killed holder's lease ending about a renewal period
// after the last script closes it once.
//
// What stays open: a holder whose process alone loses Redis for longer
// than a lease, while others use the cap, loses its slot while its call
// may still run: the cap may then admit a call more until its next
// renewal puts it back. A failover that loses writes (holders the
// replica never had) but keeps the rest of the cap: a Hold of an
// instance with nothing in the key can take the slot of such a holder
// before its renewal puts it back, within lease/3 of the new master
// answering; one call beyond capacity per holder lost. A holder whose
// client reaches Redis again later than lease/3 + min(lease/3, 1 s) after
// the first script that closed the cap: go-redis, after PoolSize failed
// dials in a row (a failover, a restart), refuses new connections and
// probes once a second, which a lease under 3 s does not cover; its slot
// can then be taken until its renewal lands. On a busy machine, whatever
// the pool: a renewal's round trip is cut at min(lease/3, 1 s), and a
// client's first connection to the new master can take longer while
// newcomers' Holds, which have 1 s, get through. With a lease of 3 s or
// more, the renewal has 1 s like a Hold. (docs/limits.md measures both.)
// Redis evicting one of the cap's keys (a maxmemory policy: every key
// of the cap has a time to live, so volatile-* ones may pick any): the
// holders' key (<tag>:slots) closes the cap at the next script, which
// finds it gone while the last script left a holder whose lease still
// runs; the generation's (<tag>:slots-gen) as after an empty restart;
// <tag>:slots-gone during a freeze ends the freeze early. Run Redis
// with maxmemory-policy noeviction, or with room to spare. In a rolling
// deploy from a version before <tag>:slots-gen, the previous version's
// processes neither record nor check it: what is said here of Redis out
// longer than a lease, an empty restart and an eviction holds once every
// process runs this one.
//
// A release makes one round trip to Redis (at most a second, after a
// renewal of that slot already on its way); if it fails, the slot comes
// back when its lease ends.
type Concurrency struct {
	c        common
	capacity int64
	lease    time.Duration
	inst     string // random; names this value's members and wake-up channel
	chPrefix string // channel of instance i: chPrefix + i
	channel  string // this instance's: chPrefix + inst
	clock    clockwork.Clock
	log      *slog.Logger
	warned   sync.Once // the missing channel rights are logged once
	seq      atomic.Uint64
	gens     *generations // of the keys this instance used

	mu       sync.Mutex
	members  map[string]*slotMember // held or waiting, renewed
	renewing bool                   // the renewal goroutine runs
	closed   bool
	life     context.Context // ended by Close
	end      context.CancelFunc
	wg       sync.WaitGroup
	ps       *redis.PubSub // nil until the first wait
	psReady  chan struct{} // closed when Redis confirms the subscription
}

// memberState is what this process knows of a member in Redis.
type memberState int

const (
	memberPending memberState = iota // its first script has not answered: not renewed
	memberWaiting                    // in the queue
	memberHolding                    // holds a slot
)

// slotMember is one Hold's entry in Redis: a slot held or a place in the
// queue.
type slotMember struct {
	keys []string
	wake chan struct{} // receives when Redis hands it a slot
	// Under Concurrency.mu.
	state memberState
	// renewals counts the renewal scripts on their way that name it; its
	// release waits for them, so that no renewal puts back a slot already
	// given back.
	renewals sync.WaitGroup
}

// NewConcurrency returns a fleet-wide cap of capacity calls in flight per
// key, shared through Redis under key. Options: [WithPrefix], [WithLease],
// [WithLogger]. capacity must be between 1 and 2^50; key as for the other
// buckets. It makes no round trip: [Concurrency.Check] does.
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
	inst := nonce()
	chPrefix := c.cfg.prefix + ":slots-wake:"
	life, end := context.WithCancel(context.Background())
	return &Concurrency{
		c:        c,
		capacity: capacity,
		lease:    c.cfg.slotLease,
		inst:     inst,
		chPrefix: chPrefix,
		channel:  chPrefix + inst,
		clock:    clockwork.NewRealClock(),
		log:      c.cfg.logger,
		members:  make(map[string]*slotMember),
		gens:     newGenerations(c.cfg.slotLease),
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
	return []string{tag + ":slots", tag + ":slots-queue", tag + ":slots-waiting", tag + ":slots-seq", tag + ":slots-gone", tag + ":slots-gen"}, nil
}

// args are a script's arguments: the common ones, the generation this
// instance remembers of the cap (gen, "" if none), then the script's own.
func (s *Concurrency) args(gen string, extra ...any) []any {
	return append([]any{s.capacity, s.lease.Milliseconds(), s.chPrefix, gen}, extra...)
}

// Hold implements [throttle.Slots]. Its round trips are bounded by the
// wait (maxWait, ctx, a wait stop) and by a second each. A per-call key
// longer than [MaxKeyLen] fails with an error matching
// [throttle.ErrInvalidKey] (and [throttle.ErrInvalid]). After
// [Concurrency.Close] it fails with an error matching redis.ErrClosed.
func (s *Concurrency) Hold(ctx context.Context, key string, maxWait time.Duration) (func(), error) {
	if maxWait < 0 {
		return nil, errs.Invalid("bucket: Concurrency.Hold", "maxWait", maxWait, "must be 0 (no wait), positive, or throttle.Forever")
	}
	keys, err := s.keys(key)
	if err != nil {
		return nil, err
	}
	ctx, cancel := waitstop.Context(ctx) // a stop ends the wait too
	defer cancel()
	if ctx.Err() != nil {
		return nil, s.waitEnded(ctx, key)
	}
	start := s.clock.Now()
	// trip bounds each round trip by the wait: ctx, and maxWait's end.
	trip := ctx
	var expired <-chan time.Time
	if maxWait > 0 && maxWait != throttle.Forever {
		t := s.clock.NewTimer(maxWait)
		defer t.Stop()
		expired = t.Chan()
		var cancelTrip context.CancelFunc
		trip, cancelTrip = context.WithTimeout(ctx, maxWait)
		defer cancelTrip()
	}
	mode := "try"
	var subscribed <-chan struct{}
	if maxWait > 0 {
		mode = "wait"
		subscribed = s.subscribe()
	}
	id := s.inst + ":" + strconv.FormatUint(s.seq.Add(1), 36)
	m := &slotMember{keys: keys, wake: make(chan struct{}, 1)}
	if err := s.track(id, m); err != nil {
		return nil, err
	}
	for {
		r, err := s.run(trip, "hold", scriptSlotsHold, keys, id, mode, s.witness(keys[0], id))
		if err == nil && (len(r) < 2 || len(r) > 3 || !isInt(r[0]) || !isInt(r[1]) || len(r) == 3 && !isInt(r[2])) {
			err = backend("hold", keys[0], fmt.Errorf("unexpected reply %v", r))
		}
		if err != nil {
			s.leave(id, m)
			switch {
			case ctx.Err() != nil:
				return nil, s.waitEnded(ctx, key)
			case trip.Err() != nil:
				return nil, fmt.Errorf("%s: no slot of key %q within %v: %w (the store did not answer in time: %w)", s.c.name, key, maxWait, throttle.ErrTimeout, err)
			}
			return nil, err
		}
		if r[0].(int64) == 1 {
			return s.holds(id, m), nil
		}
		wait := r[1].(int64)
		if wait < 0 {
			s.untrack(id)
			if len(r) == 3 {
				return nil, fmt.Errorf("%s: no slot of key %q: %w: the cap is closed for %v more, while the renewals of holders Redis lost (a restart, a failover, a pause) put them back; retry then, or Hold with a maxWait", s.c.name, key, throttle.ErrTimeout, ms(r[2].(int64)))
			}
			return nil, fmt.Errorf("%s: no slot of key %q free: %w", s.c.name, key, throttle.ErrTimeout)
		}
		s.setState(m, memberWaiting)
		look := s.clock.NewTimer(ms(wait))
		select {
		case <-m.wake:
			look.Stop()
			return s.holds(id, m), nil
		case <-look.Chan():
			continue
		case <-subscribed:
			// Wake-ups flow from now on; one published before may be
			// lost: look again once.
			subscribed = nil
			look.Stop()
			continue
		case <-expired:
			err = fmt.Errorf("%s: no slot of key %q within %v: %w", s.c.name, key, s.clock.Since(start), throttle.ErrTimeout)
		case <-ctx.Done():
			err = s.waitEnded(ctx, key)
		case <-s.life.Done():
			err = fmt.Errorf("%s: %w", s.c.name, redis.ErrClosed)
		}
		look.Stop()
		s.leave(id, m)
		return nil, err
	}
}

func isInt(v any) bool {
	_, ok := v.(int64)
	return ok
}

// waitEnded is the error of a wait for a slot of key that ctx ended:
// ctx's error, and its cause when that says more (a stop's); a wait that
// ctx's deadline ended also matches [throttle.ErrTimeout].
func (s *Concurrency) waitEnded(ctx context.Context, key string) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		err = fmt.Errorf("%w (%w)", err, cause)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: no slot of key %q before the context's deadline: %w: %w", s.c.name, key, throttle.ErrTimeout, err)
	}
	return fmt.Errorf("%s: waiting for a slot of key %q: %w", s.c.name, key, err)
}

// holds marks m as a holder and returns its release.
func (s *Concurrency) holds(id string, m *slotMember) func() {
	s.setState(m, memberHolding)
	var once sync.Once
	return func() { once.Do(func() { s.leave(id, m) }) }
}

// run runs one of the cap's scripts, bounded by ctx and by
// slotCallTimeout, passing the generation this instance remembers of the
// cap and remembering the one the reply carries; it returns the rest of
// the reply. The scripts are idempotent per member, so go-redis may
// resend them. Its error is a *throttle.BackendError labelled op.
func (s *Concurrency) run(ctx context.Context, op string, script *redis.Script, keys []string, extra ...any) ([]any, error) {
	sent := s.clock.Now()
	args := s.args(s.gens.told(keys[0], sent), extra...)
	var r []any
	err := s.call(ctx, op, keys[0], func(ctx context.Context) error {
		v, err := script.Run(ctx, s.c.rdb, keys, args...).Slice()
		r = v
		return err
	})
	if err != nil {
		return nil, err // r may still be written by a round trip left running
	}
	var gen string
	if len(r) > 0 {
		gen, _ = r[0].(string)
	}
	if gen == "" {
		return nil, backend(op, keys[0], fmt.Errorf("unexpected reply %v: no generation", r))
	}
	s.gens.heard(keys[0], gen, sent)
	return r[1:], nil
}

// call runs f, one round trip, bounded by ctx and slotCallTimeout even
// when the client blocks (see bounded); its error is a
// *throttle.BackendError labelled op.
func (s *Concurrency) call(ctx context.Context, op, key string, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, slotCallTimeout)
	defer cancel()
	_, err := bounded(ctx, &s.c, "", func(ctx context.Context) (throttle.Decision, error) {
		return throttle.Decision{}, f(ctx)
	})
	if err == nil {
		return nil
	}
	if be := (*throttle.BackendError)(nil); errors.As(err, &be) {
		err = be.Err // bounded's own, labelled for a take
	}
	return backend(op, key, err)
}

// leave stops renewing id and removes it from the cap, holder or waiter,
// in one round trip that does not depend on the caller's context: a caller
// that gave up must not leave a slot behind. It waits for the renewals of
// id already on their way, which would put its slot back. If the round
// trip fails, the lease ends it.
func (s *Concurrency) leave(id string, m *slotMember) {
	s.untrack(id)
	m.renewals.Wait()
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

// witnessScan bounds the members witness looks at.
const witnessScan = 64

// witness returns another member of this instance in the cap of key (its
// first Redis key) that Redis told it holds a slot or waits, "" if it
// finds none among a few: a Hold's script learns from it whether Redis
// lost the cap's members (see slots_hold.lua).
func (s *Concurrency) witness(key, id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for mid, m := range s.members {
		if mid != id && m.state != memberPending && m.keys[0] == key {
			return mid
		}
		if n++; n == witnessScan {
			break
		}
	}
	return ""
}

func (s *Concurrency) untrack(id string) {
	s.mu.Lock()
	delete(s.members, id)
	s.mu.Unlock()
}

func (s *Concurrency) setState(m *slotMember, st memberState) {
	s.mu.Lock()
	m.state = st
	s.mu.Unlock()
}

// renewParallel bounds the renewal scripts of one Concurrency in flight at
// once.
const renewParallel = 16

// renewBatch is one key's members to renew.
type renewBatch struct {
	keys             []string
	holders, waiters []any
	members          []*slotMember
}

// renew extends the leases of every member of this Concurrency every
// lease/3, one script per key (renewParallel at a time), wakes the
// waiters that the renewal finds holding a slot, and returns when none is
// left or at Close.
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
		byKey := make(map[string]*renewBatch)
		for id, m := range s.members {
			if m.state == memberPending {
				continue
			}
			b := byKey[m.keys[0]]
			if b == nil {
				b = &renewBatch{keys: m.keys}
				byKey[m.keys[0]] = b
			}
			if m.state == memberHolding {
				b.holders = append(b.holders, id)
			} else {
				b.waiters = append(b.waiters, id)
			}
			b.members = append(b.members, m)
			m.renewals.Add(1)
		}
		s.mu.Unlock()
		// Keys renewed side by side, a few at a time: in series, the
		// renewals of many keys held at once may not fit in lease/3.
		ctx, cancel := context.WithTimeout(s.life, min(s.lease/3, slotCallTimeout))
		var wg sync.WaitGroup
		sem := make(chan struct{}, renewParallel)
		for _, b := range byKey {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				args := append(append([]any{len(b.holders)}, b.holders...), b.waiters...)
				r, err := s.run(ctx, "renew", scriptSlotsRenew, b.keys, args...)
				for _, m := range b.members {
					m.renewals.Done()
				}
				if err == nil {
					ids := make([]string, 0, len(r))
					for _, v := range r {
						if id, ok := v.(string); ok {
							ids = append(ids, id)
						}
					}
					s.wake(ids)
				}
			}()
		}
		wg.Wait()
		cancel()
	}
}

// subscribe starts the wake-up subscription if it has not started, and
// returns a channel closed once Redis confirms it, or nil when it is
// confirmed already, will never be (a redis.Ring), or the Concurrency is
// closed. It does no I/O: the subscription is opened in the background.
func (s *Concurrency) subscribe() <-chan struct{} {
	if _, ring := s.c.rdb.(*redis.Ring); ring {
		return nil // its shards share no pub/sub; renewals tell the waiters
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	if s.ps == nil {
		s.ps = s.c.rdb.Subscribe(s.life) // no channel yet: no round trip
		s.psReady = make(chan struct{})
		s.wg.Add(1)
		go s.listen(s.ps, s.psReady)
	}
	select {
	case <-s.psReady:
		return nil
	default:
		return s.psReady
	}
}

// listen subscribes to this instance's wake-up channel, outside every
// lock (opening the connection may stall), and delivers wake-ups to the
// waiters they name until Close (a lost one: see Concurrency's doc).
func (s *Concurrency) listen(ps *redis.PubSub, ready chan struct{}) {
	defer s.wg.Done()
	// An error here (a failed dial) needs nothing: go-redis keeps the
	// channel, and the receive below reconnects and subscribes again.
	_ = ps.Subscribe(s.life, s.channel)
	confirmed := false
	for {
		msg, err := ps.ReceiveTimeout(s.life, s.lease)
		if err != nil {
			if s.life.Err() != nil || errors.Is(err, redis.ErrClosed) {
				return
			}
			var rerr redis.Error
			if errors.As(err, &rerr) {
				// Redis refused the subscription (NOPERM: no rights on
				// the channel). go-redis keeps the connection; there is
				// nothing to receive but a reconnection's new attempt.
				s.warnNoWakeups("subscribe", err)
				continue
			}
			var ne interface{ Timeout() bool }
			if errors.As(err, &ne) && ne.Timeout() {
				_ = ps.Ping(s.life) // a dead connection fails here and reconnects at the next receive
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
			s.wake(strings.Fields(msg.Payload))
		}
	}
}

// warnNoWakeups logs, once, that this Redis user may not op ("publish",
// "subscribe") on the wake-up channel: not an error, the cap still holds.
func (s *Concurrency) warnNoWakeups(op string, err error) {
	s.warned.Do(func() {
		s.log.Warn("bucket: Concurrency: this Redis user cannot "+op+" on channel "+s.channel+
			": wake-ups fall back to renewals, a waiter learns of its slot within lease/3 of its release; grant the user the channel pattern "+s.chPrefix+"* (ACL SETUSER ... &"+s.chPrefix+"*) for prompt wake-ups",
			"key", s.c.ks.root, "lease", s.lease, "err", err)
	})
}

// wake signals the members named in ids that they hold a slot.
func (s *Concurrency) wake(ids []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if m := s.members[id]; m != nil {
			select {
			case m.wake <- struct{}{}:
			default:
			}
		}
	}
}

// Check checks Redis with one round trip, for a readiness probe (call it
// at start to hear of missing rights before the first wait): an empty
// wake-up published on this instance's own channel. It returns a
// [*throttle.BackendError] when Redis does not answer (by ctx's deadline,
// at most a second), and nil when it does, even when the Redis user may
// not publish on the channel (the cap still holds: see [Concurrency]);
// Check then logs, once, a warning that says what the user lacks.
func (s *Concurrency) Check(ctx context.Context) error {
	err := s.call(ctx, "check", s.channel, func(ctx context.Context) error {
		return s.c.rdb.Publish(ctx, s.channel, "").Err()
	})
	var rerr redis.Error
	if errors.As(err, &rerr) {
		s.warnNoWakeups("publish", err)
		return nil
	}
	return err
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

var (
	_ throttle.Slots   = (*Concurrency)(nil)
	_ throttle.Checker = (*Concurrency)(nil)
)
