package bucket

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/throttle"
)

// How a bucket talks to Redis when things go wrong.
//
// Bounded time: Take returns by its context's deadline even when the client
// blocks. go-redis ignores context deadlines on reads and writes unless the
// client was built with ContextTimeoutEnabled, so unless it was, Take runs
// its round trips in a goroutine and returns at the deadline with a
// [*throttle.BackendError] wrapping the context's error. That goroutine
// ends when go-redis gives up on its own (it does not retry once the
// context has ended): after the client's ReadTimeout (default 3 s) per
// round trip for a server that stopped answering, at once for a closed
// connection; with a ReadTimeout of -1, as long as the server stalls. A
// client with ContextTimeoutEnabled needs no goroutine and none is
// started: that is the recommended setting.
//
// No double spending: go-redis resends a command after some failures (a
// reset connection, EOF, a timeout; MaxRetries, 3 by default), including a
// script that ran but whose reply was lost, which would charge the budget
// twice. So headway owns the retries of its scripts: each is sent as a
// command marked NoRetry, which go-redis never resends once it may have
// reached the server (it still resends one that provably never left, and
// headway itself resends only after NOSCRIPT, which means the script did
// not run). A lost reply therefore costs at most the permits of that one
// call, never twice as many, and surfaces as a [*throttle.BackendError]
// that the Limiter's failure policy handles. This costs nothing per call:
// no extra key, no extra command.
//
// Heartbeats (see [WithHeartbeat]): a heartbeat due goes pipelined with a
// take, in the same round trip (eval).

//go:embed lua/heartbeat.lua
var srcHeartbeat string

// defaultLiveWindow is how long an instance counts as live after its last
// heartbeat, unless WithHeartbeat says otherwise.
const defaultLiveWindow = 10 * time.Second

// WithHeartbeat sets how long an instance counts as live after its last
// heartbeat. Default: 10 s. Each bucket instance beats, piggybacked on a
// take, at most every window/10 (and at most once a second), so it counts
// as live while it takes at least that often; an idle instance drops out
// after window. The live count sets each instance's share of the limit
// under [throttle.FailLocal] while Redis is down: a longer window counts
// idle instances longer, which makes the shares smaller and safer. It must
// be between 100 ms and 1 h.
func WithHeartbeat(window time.Duration) CommonOption {
	return commonOption(func(c *config) { c.liveWindow = window })
}

// calls is a bucket's per-instance state for its round trips. Each bucket
// value owns one; it is shared by the copies of its common.
type calls struct {
	nonce    string // random, names this instance in the live set
	liveKey  string
	window   time.Duration
	every    int64 // ns between beats
	lastBeat atomic.Int64
	live     atomic.Int64 // last count seen; 0 before the first beat
	maxLive  atomic.Int64 // largest count seen
	heard    atomic.Int64 // when live was last counted, Unix ns
	ctxOK    bool         // the client honours context deadlines itself
	inflight atomic.Int64 // goroutines still in a round trip, for tests
}

// nonce returns 16 random hex digits.
func nonce() string {
	var raw [8]byte
	_, _ = rand.Read(raw[:]) // never fails (crypto/rand panics rather than return an error)
	return hex.EncodeToString(raw[:])
}

func newCalls(rdb redis.UniversalClient, ks keyspace, window time.Duration) *calls {
	every := min(max(window/10, 10*time.Millisecond), time.Second)
	return &calls{
		nonce:   nonce(),
		liveKey: ks.root + ":live",
		window:  window,
		every:   int64(every),
		ctxOK:   honoursContext(rdb),
	}
}

// honoursContext reports whether rdb applies context deadlines to its
// reads and writes (ContextTimeoutEnabled), so no goroutine is needed to
// return by them.
func honoursContext(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// beatDue reports whether this call should carry a heartbeat, claiming it.
func (s *calls) beatDue() bool {
	now := time.Now().UnixNano()
	last := s.lastBeat.Load()
	return now-last >= s.every && s.lastBeat.CompareAndSwap(last, now)
}

// instances is the live count last seen while it is fresh (counted
// within two beat intervals); after that, the largest count ever seen: an
// instance that has not heard from Redis recently cannot know who joined
// meanwhile, and a larger count gives it a smaller, safer share. 0 before the first heartbeat.
func (s *calls) instances() int64 {
	live := s.live.Load()
	if time.Now().UnixNano()-s.heard.Load() > 2*s.every {
		return max(live, s.maxLive.Load())
	}
	return live
}

// noteLive records a live count just read from Redis.
func (s *calls) noteLive(n int64) {
	s.live.Store(n)
	s.heard.Store(time.Now().UnixNano())
	for {
		old := s.maxLive.Load()
		if n <= old || s.maxLive.CompareAndSwap(old, n) {
			return
		}
	}
}

// replyErr is err, a script's failure, or when the script ran but its
// reply is not one file returns (ok false), an error saying so.
func replyErr(err error, ok bool, file string) error {
	if err == nil && !ok {
		return errors.New("unexpected reply from " + file)
	}
	return err
}

// eval runs script s with keys (all of one budget's hash tag) as one
// command that go-redis must not resend, and a heartbeat pipelined with it
// when one is due. It returns too when the attempt that ran the script
// was sent (after a NOSCRIPT, the second): the script decided between
// then and the return.
func (c *common) eval(ctx context.Context, s *redis.Script, keys []string, args ...any) ([]int64, time.Time, error) {
	if c.calls.beatDue() {
		sent := time.Now()
		pipe := c.rdb.Pipeline()
		// EVAL, not EVALSHA: the heartbeat is tiny and rare, and never
		// hits NOSCRIPT after a restart.
		hb := pipe.Eval(ctx, srcHeartbeat, []string{c.calls.liveKey}, c.calls.nonce, c.calls.window.Milliseconds())
		take := evalSHA(ctx, s, keys, args)
		_ = pipe.Process(ctx, take)
		_, _ = pipe.Exec(ctx)
		if n, err := hb.Int64(); err == nil {
			c.calls.noteLive(n)
		} else {
			c.calls.lastBeat.Store(0) // beat again at the next call
		}
		if r, err := take.Int64Slice(); err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") {
			return r, sent, err
		}
	}
	cmd, sent := c.evalNoRetry(ctx, s, keys, args) // (after a NOSCRIPT, loads it)
	r, err := cmd.Int64Slice()
	return r, sent, err
}

// evalNoRetry sends EVALSHA as a command go-redis must not resend, and
// after NOSCRIPT (the script did not run: the server restarted or flushed
// its scripts) loads the script and sends it once more. It returns when
// the last attempt was sent.
func (c *common) evalNoRetry(ctx context.Context, s *redis.Script, keys []string, args []any) (*redis.Cmd, time.Time) {
	cmd := evalSHA(ctx, s, keys, args)
	sent := time.Now()
	_ = c.rdb.Process(ctx, cmd)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		if err := s.Load(ctx, c.rdb).Err(); err != nil {
			cmd.SetErr(err)
			return cmd.Cmd, sent
		}
		cmd = evalSHA(ctx, s, keys, args)
		sent = time.Now()
		_ = c.rdb.Process(ctx, cmd)
	}
	return cmd.Cmd, sent
}

// noRetry is a command go-redis must not resend after it may have reached
// the server (go-redis v9 asks every command's NoRetry before a retry).
type noRetry struct{ *redis.Cmd }

// NoRetry implements redis.Cmder: never resend.
func (noRetry) NoRetry() bool { return true }

// evalSHA builds EVALSHA of s on keys and args as a noRetry command.
func evalSHA(ctx context.Context, s *redis.Script, keys []string, args []any) noRetry {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, "evalsha", s.Hash(), len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	return noRetry{redis.NewCmd(ctx, a...)}
}

// bounded runs f, a bucket's decision (one or more round trips), so that it
// returns by ctx's end even if the client blocks: see the comment at the
// top of this file.
func bounded(ctx context.Context, c *common, key string, f func(context.Context) (throttle.Decision, error)) (throttle.Decision, error) {
	if ctx.Done() == nil || c.calls.ctxOK {
		return f(ctx)
	}
	ch := make(chan answer, 1)
	c.calls.inflight.Add(1)
	go func() {
		defer c.calls.inflight.Add(-1)
		d, err := f(ctx)
		ch <- answer{d: d, err: err, at: time.Now()}
	}()
	select {
	case r := <-ch:
		return fresh(r.d, r.at), r.err
	case <-ctx.Done():
	}
	select {
	case r := <-ch: // both ready: the answer wins
		return fresh(r.d, r.at), r.err
	default:
	}
	tag, _ := c.ks.tag(c.name, key)
	return throttle.Decision{}, backend("take", tag, fmt.Errorf("no reply from redis before the context ended: %w", ctx.Err()))
}

// Fallback implements [throttle.Fallbacker]: the constructor's limit per
// interval (that of every key without a live limit of its own, see
// [TokenBucket.SetLimit]), and the live instances last counted.
func (b *TokenBucket) Fallback() (int64, time.Duration, int64) {
	return b.limit, us(b.intervalUs), b.calls.instances()
}

// Fallback implements [throttle.Fallbacker]: the limit per interval, and
// the live instances last counted.
func (b *Counter) Fallback() (int64, time.Duration, int64) {
	return b.limit, ms(b.periodMs), b.calls.instances()
}

// Fallback implements [throttle.Fallbacker]: the constructor's limit per
// interval (that of every key without a live rate of its own, see
// [GCRA.SetLimit]), and the live instances last counted.
func (b *GCRA) Fallback() (int64, time.Duration, int64) {
	return b.limit, us(b.emission * b.limit), b.calls.instances()
}

// Fallback implements [throttle.Fallbacker]: the constructor's limit per
// interval (that of every key without a live limit of its own, see
// [FixedWindow.SetLimit]), and the live instances last counted.
func (b *FixedWindow) Fallback() (int64, time.Duration, int64) {
	return b.windows.tiers[0].Limit, b.windows.tiers[0].Period, b.windows.calls.instances()
}

// Fallback implements [throttle.Fallbacker]: the limit per interval,
// conservatively for several tiers: the smallest limit per the longest period, a rate and a burst
// that no tier's is below.
func (b *Tiers) Fallback() (int64, time.Duration, int64) {
	l, p := tightest(b.windows.tiers)
	return l, p, b.windows.calls.instances()
}

// Fallback implements [throttle.Fallbacker], as [Tiers.Fallback].
func (b *SlidingLog) Fallback() (int64, time.Duration, int64) {
	tiers := make([]throttle.Tier, 0, len(b.args)/2)
	for i := 0; i+1 < len(b.args); i += 2 {
		tiers = append(tiers, throttle.Tier{Limit: b.args[i].(int64), Period: us(b.args[i+1].(int64))})
	}
	l, p := tightest(tiers)
	return l, p, b.calls.instances()
}

func tightest(tiers []throttle.Tier) (int64, time.Duration) {
	l, p := tiers[0].Limit, tiers[0].Period
	for _, t := range tiers[1:] {
		l, p = min(l, t.Limit), max(p, t.Period)
	}
	return l, p
}

// inflight counts round trips still running after their Take returned; for
// tests, which wait for it to reach 0 before checking for leaks.
func (c *common) inflight() int64 { return c.calls.inflight.Load() }

// Check checks Redis with one round trip, for [throttle.Limiter.Check] (a
// service's readiness probe): the heartbeat that takes carry now and then,
// which records this instance in the bucket's set of live instances and
// reads how many are live, so that a Limiter's FailLocal knows this
// instance's share even before its first take. It returns by ctx's
// deadline, with a [*throttle.BackendError] when Redis fails.
func (c *common) Check(ctx context.Context) error {
	_, err := bounded(ctx, c, "", func(ctx context.Context) (throttle.Decision, error) {
		n, err := c.rdb.Eval(ctx, srcHeartbeat, []string{c.calls.liveKey}, c.calls.nonce, c.calls.window.Milliseconds()).Int64()
		if err != nil {
			return throttle.Decision{}, backend("check", c.calls.liveKey, err)
		}
		c.calls.noteLive(n)
		c.calls.lastBeat.Store(time.Now().UnixNano())
		return throttle.Decision{}, nil
	})
	return err
}

// What every Redis bucket of this package offers a throttle.Limiter
// beyond Take (see throttle.BucketAs).
type offers interface {
	throttle.Pauser
	throttle.Fallbacker
	throttle.AdaptiveStore
	throttle.Checker
}

var (
	_                          = []offers{(*TokenBucket)(nil), (*FixedWindow)(nil), (*Tiers)(nil), (*SlidingLog)(nil), (*GCRA)(nil), (*Counter)(nil), (*Budget)(nil)}
	_ throttle.DimensionPauser = (*Budget)(nil)
)
