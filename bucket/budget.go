package bucket

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/throttle"
)

// Dimension is one dimension of a [Budget]: at most Limit per Interval of
// what a call spends, counted under Name ("requests", "tokens").
type Dimension struct {
	// Name names the dimension in a [throttle.Cost]; non-empty, at most
	// 64 bytes, distinct within a Budget.
	Name string
	// Limit is how much the calls of a key may spend of it in any span
	// of Interval; 1 to 2^50.
	Limit int64
	// Interval is the span of the limit; 1 ms to [MaxInterval].
	Interval time.Duration
}

// maxDimensions bounds the dimensions of one Budget.
const maxDimensions = 16

// Budget keeps several dimensions per key, such as the requests and the
// tokens per minute of an LLM API, and takes a call's cost from all of
// them together or from none ([throttle.CostBucket]). With a Limiter, a
// caller acquires an estimate, then settles the real cost once known:
//
//	lim := throttle.New(b)
//	g, err := lim.AcquireCost(ctx, throttle.Cost{"requests": 1, "tokens": est}, time.Minute)
//	// ... the call ...
//	err = g.Settle(ctx, throttle.Cost{"requests": 1, "tokens": used})
//
// Guarantee: every grant has a time (Decision.Delay from the take: its
// place on the Redis server's clock), and may be used from that time until
// its margin ([WithArrivalMargin]) after it, as a [TokenBucket]'s permits.
// In each dimension, a key's places hold at most Limit, net of what their
// grants gave back, in any span of the dimension's Interval plus the
// margin, on the server's clock, so calls sent within their margins
// reach a provider at most Limit in any span of one Interval, whatever the
// callers' waits, however many processes share the key; what Settle
// charges beyond the estimates comes on top, and later places wait until
// it stops counting. A caller whose wait ends before the time is refused at
// once, and nothing is taken.
//
// How: each dimension of a key is a schedule of its own, as a
// TokenBucket's (a Redis list under the key's hash tag). A take places
// the call at one time for every dimension its cost names: the earliest at
// which each has room for its amount, when that is within the caller's
// wait and at most the margin ahead; one script, one round trip, all or
// nothing. Each dimension records the amount in its entry of the place
// plus the margin. A call whose time is farther ahead is refused, told
// that time: its caller waits and asks again then, and is placed with what
// the calls settled meanwhile (placed ahead, it would hold its whole
// estimate while it waits). Costs are not paced: paced by estimates above
// the real costs, a fleet would go slower than its limits (80–89 % of the
// tokens limit used in examples/llm, against 95–99 % unpaced).
//
// Settling: a grant's Decision.Settle corrects it in those entries after
// the call. A negative amount (the call used less) is taken back from the
// grant's entry while it still counts, never below 0, so an over-estimate
// does not idle the budget; once the entry has stopped counting, a
// give-back does nothing (given to later calls, it would count twice). A
// positive amount (the call used more) is added to the grant's entry while
// it counts, else counted from now. Over all its calls, a grant's Settle
// gives back at most what it took of a dimension plus what it was charged
// since (a second Settle, or a give-back beyond the take, is cut to that).
// A settle-up above ten times a dimension's Limit is refused as an error
// in the caller's units (ErrInvalid), nothing charged. A grant's
// Decision.Cancel gives all it holds back the same way (a Limiter's, for a
// grant its caller cannot use).
//
// Faults: a Redis pause or failure refuses or grants by the Limiter's
// failure policy (FailLocal refuses: several dimensions have no local
// share). Redis losing a key's schedules (an empty restart, a failover to
// a replica that had not received them, keys deleted) is met as a
// [TokenBucket] meets it, per key and dimension (at most an Interval of
// grants lost, once per loss). A step back of the server's clock only
// keeps grants counting longer.
//
// Budget implements [throttle.Bucket] (see [Budget.Take]) and
// [throttle.CostBucket]; a Limiter can pause it for the whole fleet (every
// dimension of a key, or, from the accounting headers the Transport of
// throttle/httpclient reads, only the dimensions a provider names
// exhausted). It takes no refunds (a refund does not say which grant it
// gives back): a grant is given back by its Decision.Cancel or Settle. It
// is safe for concurrent use.
type Budget struct {
	common
	dims     []Dimension
	index    map[string]int
	takes    int   // the dimension Take charges
	marginUs int64 // every grant's margin
	longest  int64 // the longest Interval, µs
	rootKeys []string
	ends     latestEnds    // per key and dimension (endsKey)
	script   *redis.Script // budget.lua (tests: on a clock of their own)
}

// NewBudget returns a budget of the dimensions dims (at least one, at most
// 16) under key, shared by every instance that builds it with the same key,
// prefix and dimensions. Every per-call key gets its own budget of each
// dimension. Options: [WithPrefix], [WithHeartbeat], [WithArrivalMargin]
// (default: [DefaultArrivalMargin] of the shortest Interval; below every
// Interval).
func NewBudget(rdb redis.UniversalClient, key string, dims []Dimension, opts ...BudgetOption) (*Budget, error) {
	const name = "bucket: NewBudget"
	c, err := newCommon(name, rdb, key, opts)
	if err != nil {
		return nil, err
	}
	if len(dims) == 0 {
		return nil, errs.Invalid(name, "dims", "[]", "must hold at least one dimension")
	}
	if len(dims) > maxDimensions {
		return nil, errs.Invalid(name, "dims", fmt.Sprintf("%d dimensions", len(dims)), fmt.Sprintf("must hold at most %d", maxDimensions))
	}
	b := &Budget{common: c, dims: append([]Dimension(nil), dims...), index: make(map[string]int, len(dims)), script: scriptBudget}
	shortest := MaxInterval
	for i, d := range dims {
		switch {
		case d.Name == "":
			return nil, errs.Invalid(name, fmt.Sprintf("dims[%d].Name", i), `""`, "must be non-empty")
		case len(d.Name) > 64:
			return nil, errs.Invalid(name, fmt.Sprintf("dims[%d].Name", i), fmt.Sprintf("%.32q…", d.Name), "must be at most 64 bytes")
		}
		if _, dup := b.index[d.Name]; dup {
			return nil, errs.Invalid(name, fmt.Sprintf("dims[%d].Name", i), fmt.Sprintf("%q", d.Name), "must differ from every other dimension's name")
		}
		if err := checkLimitRange(name, fmt.Sprintf("dims[%d].Limit", i), d.Limit); err != nil {
			return nil, err
		}
		if err := checkDuration(name, fmt.Sprintf("dims[%d].Interval", i), d.Interval, time.Millisecond); err != nil {
			return nil, err
		}
		b.index[d.Name] = i
		shortest = min(shortest, d.Interval)
		b.longest = max(b.longest, ceilUs(d.Interval))
	}
	margin := c.cfg.margin
	if margin == 0 {
		margin = DefaultArrivalMargin(shortest)
	} else if err := checkMargin(name, margin, shortest); err != nil {
		return nil, err
	}
	b.marginUs = ceilUs(margin)
	if i, ok := b.index["requests"]; ok {
		b.takes = i
	}
	b.name = "bucket: Budget"
	b.rootKeys = b.keysOf(c.ks.root)
	return b, nil
}

// Dimensions returns the budget's dimensions, as given to NewBudget.
func (b *Budget) Dimensions() []Dimension { return append([]Dimension(nil), b.dims...) }

// Take implements [throttle.Bucket]: n of the dimension named "requests",
// or of the first if none is, as TakeCost.
func (b *Budget) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	if n < 1 {
		return throttle.Decision{}, errs.Invalid(b.name, "n", n, "must be at least 1")
	}
	return b.TakeCost(ctx, key, throttle.Cost{b.dims[b.takes].Name: n}, maxWait)
}

// maxSettleUp bounds one settle-up, in limits of its dimension.
const maxSettleUp = 10

// amounts checks c against the budget's dimensions and returns its
// amount per dimension, and whether any is not 0. take refuses negative
// amounts and amounts above a dimension's limit; a settle, charges above
// maxSettleUp limits.
func (b *Budget) amounts(field string, c throttle.Cost, take bool) ([]int64, bool, error) {
	amt := make([]int64, len(b.dims))
	some := false
	for name, v := range c {
		i, ok := b.index[name]
		if !ok {
			return nil, false, errs.Invalid(b.name, fmt.Sprintf("%s[%q]", field, name), v, fmt.Sprintf("names no dimension of the budget (it has %s)", b.names()))
		}
		switch {
		case take && v < 0:
			return nil, false, errs.Invalid(b.name, fmt.Sprintf("%s[%q]", field, name), v, "must be at least 0")
		case take && v > b.dims[i].Limit:
			// However large: waiting cannot help.
			return nil, false, fmt.Errorf("%s: %d of %q asked at once, at most %d can ever be granted: %w", b.name, v, name, b.dims[i].Limit, throttle.ErrExceedsLimit)
		case v > maxRateLimit || v < -maxRateLimit:
			return nil, false, errs.Invalid(b.name, fmt.Sprintf("%s[%q]", field, name), v, "must be at most 2^50 in size")
		case !take && v > maxSettleUp*b.dims[i].Limit:
			// A charge of many limits is a caller's error (units, a
			// garbled usage), and would hold the key for as long.
			return nil, false, errs.Invalid(b.name, fmt.Sprintf("%s[%q]", field, name), v, fmt.Sprintf("a settle-up must be at most %d times the dimension's limit (%d): check the actual cost's units", maxSettleUp, b.dims[i].Limit))
		}
		amt[i] = v
		some = some || v != 0
	}
	return amt, some, nil
}

func (b *Budget) names() string {
	var s []string
	for _, d := range b.dims {
		s = append(s, strconv.Quote(d.Name))
	}
	return strings.Join(s, ", ")
}

// keysOf lists the keys of the budget under tag: the whole budget's pause,
// the dimensions' pauses, then each dimension's schedule. Scripts read
// them and never change the slice.
func (b *Budget) keysOf(tag string) []string {
	keys := []string{tag + ":pause", tag + ":pause:dims"}
	for _, d := range b.dims {
		keys = append(keys, tag+":budget:"+d.Name)
	}
	return keys
}

// keys returns the keys of key's budget.
func (b *Budget) keys(key string) ([]string, error) {
	return b.budgetKeys(key, b.rootKeys, b.keysOf)
}

// endsKey names dimension i of key in b.ends.
func endsKey(key string, i int) string { return key + "\x00" + strconv.Itoa(i) }

// budgetReply is budget.lua's answer (see there), times in µs.
type budgetReply struct {
	granted          bool
	delay, now       int64
	dim              int // 1-based; 0: none
	remaining, reset int64
	ends             []int64
}

// run is one round trip of budget.lua on key's keys: mode ("take",
// "settle", "pause") with amt per dimension; a take waits at most wait µs
// (-1: no bound), a settle corrects the grant recorded at ends (nil:
// unknown). It notes the ends the answer gives.
func (b *Budget) run(ctx context.Context, mode, key string, keys []string, wait int64, amt, ends []int64) (budgetReply, error) {
	args := make([]any, 0, 3+6*len(b.dims))
	args = append(args, mode, b.marginUs, wait)
	for i, d := range b.dims {
		var at int64
		if ends != nil {
			at = ends[i]
		}
		args = append(args, d.Name, d.Limit, ceilUs(d.Interval), amt[i], b.ends.get(endsKey(key, i)).end, at)
	}
	r, _, err := b.eval(ctx, b.script, keys, args...)
	if err := replyErr(err, len(r) == 6+len(b.dims) && r[3] >= 0 && r[3] <= int64(len(b.dims)), "budget.lua"); err != nil {
		return budgetReply{}, backend(mode, keys[2], err)
	}
	u := budgetReply{granted: r[0] == 1, delay: r[1], now: r[2], dim: int(r[3]), remaining: r[4], reset: r[5], ends: r[6:]}
	for i, e := range u.ends {
		if e > 0 {
			b.ends.note(endsKey(key, i), e, 0, u.now-b.longest)
		}
	}
	return u, nil
}

// TakeCost implements [throttle.CostBucket]: c from every dimension it
// names, all or nothing, in one round trip, placed at the earliest time
// the budget allows within maxWait (see the type's doc). Refused,
// Decision.Delay is the earliest time the cost could have, or the end of a
// pause. Limit, Remaining and Reset describe the dimension that binds
// (granted: the one with the least left for its limit). A grant's
// Decision.Settle corrects it after the call.
func (b *Budget) TakeCost(ctx context.Context, key string, c throttle.Cost, maxWait time.Duration) (throttle.Decision, error) {
	d, _, err := b.take(ctx, key, c, maxWait)
	return d, err
}

// take is TakeCost; it also returns the script's reply (the server's
// clock of the decision, from which Decision.Delay counts; where a grant
// was recorded).
func (b *Budget) take(ctx context.Context, key string, c throttle.Cost, maxWait time.Duration) (throttle.Decision, budgetReply, error) {
	amt, some, err := b.amounts("cost", c, true)
	if err != nil {
		return throttle.Decision{}, budgetReply{}, err
	}
	if !some {
		return throttle.Decision{}, budgetReply{}, errs.Invalid(b.name, "cost", fmt.Sprintf("%q", c.String()), "must ask for at least 1 of some dimension")
	}
	keys, err := b.keys(key)
	if err != nil {
		return throttle.Decision{}, budgetReply{}, err
	}
	wait := int64(-1) // no bound
	if maxWait != throttle.Forever && maxWait < time.Duration(1<<52)*time.Microsecond {
		wait = int64(maxWait / time.Microsecond)
	}
	var reply budgetReply // written by f, read only once bounded returned f's answer
	d, err := bounded(ctx, &b.common, key, func(ctx context.Context) (throttle.Decision, error) {
		u, err := b.run(ctx, "take", key, keys, wait, amt, nil)
		if err != nil {
			return throttle.Decision{}, err
		}
		reply = u
		dim := b.takes // a whole pause describes Take's dimension
		if u.dim > 0 {
			dim = u.dim - 1
		}
		d := throttle.Decision{Granted: u.granted, Delay: us(u.delay), Limit: b.dims[dim].Limit, Remaining: u.remaining, Reset: us(u.reset)}
		if d.Granted {
			g := &budgetGrant{b: b, key: key, ends: u.ends, took: maps.Clone(c)}
			d.Margin, d.Settle, d.Cancel = us(b.marginUs), g.settle, g.cancel
		}
		return d, nil
	})
	if err != nil {
		return d, budgetReply{}, err
	}
	return d, reply, nil
}

// budgetGrant is one grant of TakeCost, for its Decision.Settle: where it
// was recorded, and what it took of each dimension, plus what settling
// charged since, less what it gave back.
type budgetGrant struct {
	b    *Budget
	key  string
	ends []int64 // per dimension, the end its entry had (0: not taken)
	mu   sync.Mutex
	took throttle.Cost
}

// settle is the grant's Decision.Settle, cut as Budget's doc says
// ("Settling"), so that a grant settled twice, or with a give-back larger
// than its take, never hands its entry what other grants took. A give-back whose round
// trip failed counts as given (it may have reached Redis); a charge counts
// once Redis confirmed it.
func (g *budgetGrant) settle(ctx context.Context, delta throttle.Cost) error {
	if _, _, err := g.b.amounts("delta", delta, false); err != nil {
		return err
	}
	g.mu.Lock()
	cut := make(throttle.Cost, len(delta))
	for name, v := range delta {
		if v < 0 {
			v = max(v, -g.took[name])
			g.took[name] += v
		}
		if v != 0 {
			cut[name] = v
		}
	}
	g.mu.Unlock()
	err := g.b.settle(ctx, g.key, g.ends, cut)
	if err == nil {
		g.mu.Lock()
		for name, v := range cut {
			if v > 0 {
				g.took[name] += v
			}
		}
		g.mu.Unlock()
	}
	return err
}

// cancel is the grant's Decision.Cancel: it gives back all the grant still
// holds, as a Settle would.
func (g *budgetGrant) cancel(ctx context.Context) error {
	g.mu.Lock()
	back := make(throttle.Cost, len(g.took))
	for name, v := range g.took {
		back[name] = -v
	}
	g.mu.Unlock()
	return g.settle(ctx, back)
}

// settle changes key's dimensions by delta (checked by amounts) for a
// grant recorded at ends (µs on the server's clock, per dimension; nil:
// unknown), in one round trip (see the type's doc). Amounts of 0 change
// nothing, and a delta of nothing sends nothing.
func (b *Budget) settle(ctx context.Context, key string, ends []int64, delta throttle.Cost) error {
	amt, some, err := b.amounts("delta", delta, false)
	if err != nil || !some {
		return err
	}
	keys, err := b.keys(key)
	if err != nil {
		return err
	}
	_, err = bounded(ctx, &b.common, key, func(ctx context.Context) (throttle.Decision, error) {
		_, err := b.run(ctx, "settle", key, keys, -1, amt, ends)
		return throttle.Decision{}, err
	})
	return err
}

// PauseDimensions implements [throttle.DimensionPauser]: until each
// named dimension's RetryAfter has passed, no cost of key that needs some
// of it is granted to anyone sharing the budget; costs that need none of
// it are not held. A shorter pause never shortens a longer one. A name
// that is none of the budget's dimensions pauses the whole key for that
// long (as pause does): the provider counts something the budget does
// not, so nothing is known to pass. Times of 0 or less do nothing; times
// are clamped to [throttle.MaxPause].
func (b *Budget) PauseDimensions(ctx context.Context, key string, dims []throttle.Exhausted) error {
	amt := make([]int64, len(b.dims))
	var whole time.Duration
	some := false
	for _, e := range dims {
		d := min(e.RetryAfter, throttle.MaxPause)
		if d <= 0 {
			continue
		}
		i, ok := b.index[e.Dimension]
		if !ok {
			whole = max(whole, d)
			continue
		}
		amt[i] = max(amt[i], ceilUs(d))
		some = true
	}
	keys, err := b.keys(key)
	if err != nil {
		return err
	}
	var errs []error
	if whole > 0 {
		errs = append(errs, b.Pause(ctx, key, whole))
	}
	if some {
		_, err := bounded(ctx, &b.common, key, func(ctx context.Context) (throttle.Decision, error) {
			_, err := b.run(ctx, "pause", key, keys, -1, amt, nil)
			return throttle.Decision{}, err
		})
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Fallback implements [throttle.Fallbacker]: for Take's dimension, its
// limit per interval, and the live instances last counted.
func (b *Budget) Fallback() (int64, time.Duration, int64) {
	d := b.dims[b.takes]
	return d.Limit, ms(ceilMs(d.Interval)), b.calls.instances()
}

var (
	_ throttle.Bucket     = (*Budget)(nil)
	_ throttle.CostBucket = (*Budget)(nil)
)
