package bucket

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
)

// TokenBucket is the default bucket: at most limit permits in any span of
// one interval, for the whole fleet, at the time the calls are sent. It
// matches a provider policy of "N calls per period" however the provider
// counts them (its own periods, windows aligned to the clock, a sliding
// window of the interval), and is the bucket to use when unsure.
//
// Guarantee: every permit has a time (Decision.Delay from the take: its
// place on the Redis server's clock), and may be used from that time until
// its margin ([WithArrivalMargin]) after it. A key's places are at most
// limit in any span of one interval plus the margin, on the server's
// clock, so calls sent within their margins reach a provider at most limit
// in any span of one interval, whatever the callers' waits, however many
// processes share the key, leased or not. A [throttle.Limiter] waits until
// a permit's time and gives it to its caller; a caller whose wait ends
// before the time is refused at once, and nothing is taken.
//
// How: a permit counts from its place until one interval after its place
// plus the margin; a take places its permits at the earliest time at which
// the permits counting then leave room for them (the last of them to stop
// counting, for a full key), within the caller's wait. An idle key grants
// its whole limit at once; a caller that can wait is paced besides, at
// interval/limit per permit after the previous paced place, so that a
// crowd goes at the limit's even pace rather than in bursts a window apart.
// The schedule is one Redis list per key (entries of the permits' ends, a
// slot of at most interval/256 each), read and written by one script: one
// round trip per take (coalesced: see [TokenBucket.Take]).
//
// Redis losing a key's schedule (an empty restart, a failover to a replica
// that had not received it, the key deleted) would let the whole limit
// through again on top of permits already sent: each instance remembers,
// per key, the end of the latest permit it was given, and a take that
// finds the schedule without it counts limit permits there, so that the
// key's next places come an interval after it (at most an interval of
// grants lost, once per loss). An instance that knew nothing of the key
// cannot tell; docs/reliability.md measures what it costs.
//
// Its limit can be changed live, for the whole fleet, with
// [TokenBucket.SetLimit]; the change applies from the next take. A Limiter
// can pause a TokenBucket for the whole fleet (a provider's Retry-After).
// A granted permit that will not be sent is given back exactly by its
// Decision.Cancel; there is no other refund. A Limiter gives back the
// permit of a caller that left before its time. It does not give back one
// whose caller woke too late to use it: that place has passed, and the
// next places of a key at its limit come after its last, which the
// give-back would not move. It is safe for concurrent use.
type TokenBucket struct {
	common
	limit      int64
	intervalUs int64
	marginUs   int64
	rootKeys   []string // tbKeys of key "", built once: the hot path
	ends       latestEnds
	rtt        atomic.Int64 // µs: the recent round trips of takes (noteRTT)
}

// noteRTT folds a take's round trip into rtt: at once when it is longer
// (a loaded machine, a store that slows), by a sixteenth of the
// difference when shorter, so that a permit's count covers the round
// trips of the moment without keeping a spike's for long. A round trip
// longer than the interval (a stalled store) is not kept: its permits
// come late whatever they count.
func (b *TokenBucket) noteRTT(d time.Duration) {
	v := int64(d / time.Microsecond)
	if v > b.intervalUs {
		return
	}
	for {
		old := b.rtt.Load()
		next := v
		if v < old {
			next = old - (old-v+15)/16
		}
		if next == old || b.rtt.CompareAndSwap(old, next) {
			return
		}
	}
}

// latestEnds remembers, per key, the end (place plus margin) of the latest
// permit this instance was given, and when the schedule that holds it was
// born, in µs on the clock of the Redis server that gave it (none of this
// machine's), so that a take can tell tb_take.lua of a schedule the server
// has lost (one that ends before it, or was born since). An entry is
// useless once its permit has stopped counting (an interval after its
// end); each shard is swept when it has doubled since its last sweep, so
// the map holds about the keys taken from in the last interval. Sharded
// so that takes of many keys do not queue on one lock. The zero
// latestEnds is ready to use.
type latestEnds struct {
	shards [endShards]endShard
}

const endShards = 32

type endShard struct {
	mu    sync.Mutex
	m     map[string]latestEnd
	swept int // len(m) after the last sweep
}

// latestEnd is a key's latest end and its schedule's birth, µs on the
// server's clock.
type latestEnd struct{ end, born int64 }

func (p *latestEnds) shard(key string) *endShard {
	h := uint32(2166136261) // FNV-1a: keys spread over the shards
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	return &p.shards[h%endShards]
}

// get returns key's latest end and its schedule's birth, zero when none
// is known.
func (p *latestEnds) get(key string) latestEnd {
	s := p.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[key]
}

// note records that an answer of the schedule born at born (0: not told)
// gave key a permit ending at end (0: none, a refusal); stale is the server's clock of
// the same answer less one interval, for sweeping (µs). The end kept is
// the latest given; the birth, the answer's: the take that found a
// schedule born since the one the latest end was given in counted that
// end's permits there (Schedule:lost), refused or not, so that the next
// takes must not count them again (each would, at the schedule's tail,
// pushing every place an interval on).
func (p *latestEnds) note(key string, end, born, stale int64) {
	s := p.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.m[key]
	if !ok && end <= 0 {
		return // nothing given, nothing known
	}
	if born == 0 {
		born = old.born // not told (a Budget's schedules): keep what is known
	}
	if s.m == nil {
		s.m = make(map[string]latestEnd)
	}
	s.m[key] = latestEnd{end: max(old.end, end), born: born}
	if len(s.m) >= 2*max(s.swept, 64) {
		for k, e := range s.m {
			if e.end <= stale {
				delete(s.m, k)
			}
		}
		s.swept = len(s.m)
	}
}

// NewTokenBucket returns a token bucket of limit permits per interval under
// key, shared by every instance that builds it with the same key and
// prefix. Every per-call key passed to Take gets its own budget of limit
// per interval.
//
// limit must be at least 1 and interval at least 1 ms. Options:
// [WithPrefix], [WithHeartbeat], [WithArrivalMargin] (default:
// [DefaultArrivalMargin]).
func NewTokenBucket(rdb redis.UniversalClient, key string, limit int64, interval time.Duration, opts ...TokenBucketOption) (*TokenBucket, error) {
	const name = "bucket: NewTokenBucket"
	c, err := newCommon(name, rdb, key, opts)
	if err != nil {
		return nil, err
	}
	if err := checkRate(name, limit, "interval", interval); err != nil {
		return nil, err
	}
	margin := c.cfg.margin
	if margin == 0 {
		margin = DefaultArrivalMargin(interval)
	} else if err := checkMargin(name, margin, interval); err != nil {
		return nil, err
	}
	c.name = "bucket: TokenBucket"
	c.co.byWait = true // run places each caller of a batch within its own wait
	return &TokenBucket{
		common:     c,
		limit:      limit,
		intervalUs: ceilUs(interval),
		marginUs:   ceilUs(margin),
		rootKeys:   tbKeys(c.ks.root),
	}, nil
}

// DefaultArrivalMargin is the margin a [TokenBucket] gives its permits
// when [WithArrivalMargin] does not set one: a hundredth of the interval,
// at least 5 ms (a loaded machine's scheduling delay between a permit's
// time and its call's arrival), and at most a tenth of the interval. It
// costs about margin/interval of the limit when demand exceeds it.
func DefaultArrivalMargin(interval time.Duration) time.Duration {
	return min(max(interval/100, 5*time.Millisecond), interval/10)
}

// checkMargin refuses a margin that is negative or not below the
// interval.
func checkMargin(name string, margin, interval time.Duration) error {
	if margin < 0 || margin >= interval {
		return errs.Invalid(name, "WithArrivalMargin", margin, "must be at least 0 and below the interval")
	}
	return nil
}

// tbKeys lists a budget's keys: its schedule, its pause, its live limit.
// Scripts read them and never change the slice.
func tbKeys(tag string) []string {
	return []string{tag + ":tb", tag + ":pause", tag + ":tb:limit"}
}

// Take implements [throttle.Bucket]: it places n permits at the earliest
// time the limit allows within maxWait (see the type's doc), or refuses
// with the earliest time one permit could have (Decision.Delay) when that
// is beyond maxWait. A grant names the earliest place one more permit
// could have now (Decision.Next; 0 when one is free at once, or for an
// idle key's first take). Concurrent takes of one permit for the same key
// are coalesced into one round trip (see the package doc), each permit
// placed within its own caller's maxWait. A place is within maxWait less
// the recent round trip of a take: the caller has it only when the answer
// comes.
func (b *TokenBucket) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	return b.takeBy(ctx, key, n, b.limit, maxWait, b.run)
}

// run is one round trip of tb_take.lua; n < 0 asks for up to -n permits.
// The answer for an all-or-nothing take is in granted (also when refused).
func (b *TokenBucket) run(ctx context.Context, key string, n int64, maxWait time.Duration, waits []time.Duration) (upTo, error) {
	keys, err := b.budgetKeys(key, b.rootKeys, tbKeys)
	if err != nil {
		return upTo{}, err
	}
	// Each permit counts for its margin and for the round trip that
	// places it: the script decides while the call is under way, so the
	// permit's time may be that much earlier than Take's return says. The
	// round trip is not known before the answer: the recent ones stand for
	// it (rtt), and what the answer took beyond them comes off the margin
	// (at least 1 ns: a margin of 0 bounds nothing). The same round trip
	// comes off each wait: the caller has the answer only then, and a
	// place past its wait's end would be given back.
	extra := b.rtt.Load()
	known := b.ends.get(key)
	waitUs := func(d time.Duration) int64 {
		if d == throttle.Forever || d >= time.Duration(1<<52)*time.Microsecond {
			return -1 // none
		}
		return max(int64(d/time.Microsecond)-extra, 0) // rounded down
	}
	args := []any{n, b.limit, b.intervalUs, b.marginUs + extra, waitUs(maxWait), known.end, known.born}
	if n < -1 && len(waits) == int(-n) {
		args = append(args, waitGroups(waits, waitGrid(us(b.intervalUs/b.limit)), waitUs)...) // the pace
	}
	r, sent, err := b.eval(ctx, scriptTBTake, keys, args...)
	took := time.Since(sent)
	b.noteRTT(took)
	margin := max(us(b.marginUs+extra)-took, 1)
	if err := replyErr(err, len(r) >= 7, "tb_take.lua"); err != nil {
		return upTo{}, backend("take", keys[0], err)
	}
	status, limit, remaining, reset, now := r[0], liveOr(r, 1, b.limit), r[2], us(r[3]), r[4]
	next, born, places, ends := us(r[5]), r[6], r[7:], []int64(nil)
	shared := int64(1) // permits per place: k of an up-to take may share one
	if len(places) == 3 && places[0] < 0 {
		shared, places, ends = -places[0], places[1:2], places[2:3]
	} else if k := len(places) / 2; len(places) == 2*k {
		places, ends = places[:k], places[k:]
	}
	refused := throttle.Decision{Delay: next, Limit: limit, Remaining: max(remaining, 0), Reset: reset}
	switch {
	case status == 4:
		return upTo{}, exceeds(b.name, max(n, -n), limit)
	case status == 0 || len(places) == 0:
		b.ends.note(key, 0, born, now-b.intervalUs) // the schedule it found: see note
		return upTo{granted: refused, rest: refused, at: now}, nil
	}
	// The latest end given: the permits of an up-to take need not come in
	// order of place (one at once after one paced), but the ends they are
	// recorded under do, the last the latest.
	latest := slices.Max(places) + now + b.marginUs + extra
	if len(ends) > 0 {
		latest = max(latest, ends[len(ends)-1])
	}
	b.ends.note(key, latest, born, now-b.intervalUs)
	granted := throttle.Decision{Granted: true, Delay: us(max(places[0], 0)), Margin: margin, Next: max(next, 0), Limit: limit, Remaining: remaining, Reset: reset}
	refused.Remaining = 0
	got := int64(0) // places: one for each caller in turn, -1 for one refused
	for _, p := range places {
		if p >= 0 {
			got++
		}
	}
	u := upTo{granted: granted, got: got * shared, rest: refused, at: now}
	if len(ends) == len(places) {
		each := max(n, 1) // all n at one place, or one each
		u.cancel = func(i int64) func(context.Context) error {
			end, once := ends[i/shared], new(atomic.Bool)
			return func(ctx context.Context) error {
				if !once.CompareAndSwap(false, true) {
					return nil // given back already: the entry holds other callers' permits too
				}
				return b.giveBack(ctx, keys[0], end, born, each)
			}
		}
		u.granted.Cancel = u.cancel(0)
	}
	if len(places) > 1 {
		u.eachCaller(places)
	}
	return u, nil
}

// giveBack takes n permits that will not be sent, recorded under end in
// the schedule born at born, off the schedule under key (tb_giveback.lua):
// a caller that left before its place, or could no longer use it.
func (b *TokenBucket) giveBack(ctx context.Context, key string, end, born, n int64) error {
	cmd, _ := b.evalNoRetry(ctx, scriptTBGiveBack, []string{key}, []any{b.intervalUs, end, n, born}) // never twice
	if err := cmd.Err(); err != nil {
		return backend("give back", key, err)
	}
	return nil
}
