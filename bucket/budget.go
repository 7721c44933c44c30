package bucket

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/headway-go/headway/internal/capability"
	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
)

// Dimension is one dimension of a [Budget]: at most Limit per Interval of
// what a call spends, counted under Name ("requests", "tokens").
type Dimension struct {
	// Name names the dimension in a [throttle.Cost]; non-empty, at most
	// 64 bytes, distinct within a Budget.
	Name string
	// Limit is how much a key may spend of it per Interval; 1 to 2^50.
	Limit int64
	// Interval is the period of its refills; 1 ms to [MaxInterval].
	Interval time.Duration
	// Sliding counts the dimension over a sliding window instead of
	// periods: a take is granted only when what was granted in the last
	// Interval, net of what those grants gave back or were charged since,
	// leaves room for it. At most Limit is granted in any span of one
	// Interval, however the grants fall, so the fleet stays within a
	// provider that counts a sliding window, fixed windows, or buckets
	// refilled continuously alike (periods grant up to twice the limit
	// in a span that straddles a period's end: a sliding window
	// refuses the excess). The window is kept in 20 slots of
	// Interval/20 (at least 1 ms); the slot a grant falls in counts
	// whole until it has left the window, so a grant waits up to one
	// slot longer than an exact count would, and a fleet that grants
	// steadily uses about 20/21 of Limit. A give-back goes to its
	// grant's slot while that slot counts (it frees room at once), and
	// does nothing after; a charge counts in its grant's slot too, or in
	// the running one once that has left. A refund (the Limiter's), which does
	// not know the grant's slot, gives nothing back to it. After Redis
	// lost the window (restarted empty, keys deleted), an instance that
	// was told when it empties holds the dimension full until then, for
	// every instance; one that knew nothing and asks first is granted,
	// as for periods, and once one that knew comes, the window grants
	// nothing more until then (each instance keeps, per key, which
	// record of the window it was told of). When the Redis server's clock steps back (an NTP
	// step, a failover to a replica whose clock is behind), the budget's
	// clock goes on from where it was, so the grants before the step
	// keep counting. Default: false, periods.
	Sliding bool
}

// slidingSlots is how many slots a sliding dimension keeps per Interval
// (budget.lua's SLOTS).
const slidingSlots = 20

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
// Each dimension is a token bucket of its own, as [TokenBucket]: at most
// Limit per refill, refills at least Interval apart on the Redis server's
// clock, a period starting at the first take after the last one ended;
// or, with [Dimension].Sliding, a sliding window: at most Limit in any
// span of Interval (see there). The guarantees below are those of
// periods; a sliding dimension's are in its field's doc.
//
// Guarantee, per dimension: in any period, what is granted, less what
// its own grants gave back, is at most Limit; over any k consecutive
// periods, the real spending is at most k·Limit plus what settling charged
// beyond the estimates in them, and such a charge (a debt) is paid by the
// next refills, one Limit per period elapsed, before anything more is
// granted. A grant's give-back (its Decision.Settle) goes to the period
// the grant was taken from: while that period runs it can be granted
// again (an over-estimate does not idle the budget); once it has ended,
// it only lessens the debt a later period inherited, so a call that
// straddles a period's end never lets the next period grant twice its
// Limit. Over all its calls, a grant's Settle gives back at most what the
// grant took of a dimension plus what it was charged since (a second
// Settle, or a give-back beyond the take, is cut to that). A settle-up
// above ten times a dimension's Limit is refused as an error in the
// caller's units (ErrInvalid), nothing charged.
//
// Faults: a Redis pause or failure refuses or grants by the Limiter's
// failure policy (FailLocal refuses: several dimensions have no local
// share); the periods on record are kept. A period the fleet was told of
// but the server has no record of (Redis restarted empty, a failover to a
// replica without the latest refill, keys deleted by hand) is held at 0
// until its known end, and the next period starts on the old phase: no
// refill lands inside the lost period, at the cost of at most one
// period's grants once per loss and key; debts owed then are forgotten.
// Each instance keeps, per key used in the last period, the end of each
// dimension's latest period it was told of. An instance that knew nothing
// of the lost period (new, or idle in it) may refill inside it before one
// that knew calls; that period then grants nothing more until its end,
// so the second grants inside the lost period are only those made before.
//
// How: one script (one round trip) checks every dimension the cost names,
// refills those whose period has ended, and takes from all of them or
// none; the dimensions of a key live in one hash under one Cluster hash
// tag. A refused take names in Decision.Delay the time when every
// dimension has enough (its next refill, or the refills that pay its
// debt).
//
// Take(n) charges n to the dimension named "requests" if there is one,
// else to the first; a refund (the Limiter's) gives back to the same
// dimension (only lessening an inherited debt: it does not know the
// grant's period). Budget implements [throttle.Bucket] and
// [throttle.CostBucket]; a Limiter can pause it for the whole fleet (every
// dimension of a key, or, from the accounting headers the Transport of
// throttle/httpclient reads, only the dimensions a provider names
// exhausted), and it gives FailLocal Take's dimension's limit. It is safe
// for concurrent use.
type Budget struct {
	common
	dims  []Dimension
	index map[string]int
	takes int   // the dimension Take charges
	args  []any // name, limit, ms per dimension: the script's ARGV without amounts and ends
	ends  budgetEnds
}

// budgetEnds remembers, per key, the end of the latest period of each
// dimension this instance was told of, in ms on the clock of the Redis
// server that told it, so that a call can tell budget.lua of a period the
// server has lost (see "Lost period" there), as [TokenBucket] does. An
// entry is useless once its ends have passed; entries are swept when the
// map has doubled since the last sweep, so it holds about the keys used
// in the last period.
type budgetEnds struct {
	mu    sync.Mutex
	m     map[string][]int64 // key → end per dimension (0: none known)
	swept int                // len(m) after the last sweep
}

// get returns key's known ends, nil when none is known.
func (p *budgetEnds) get(key string) []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.m[key])
}

// note records the ends of key's periods an answer gave (0: none), now
// being the server's clock of the same answer, for sweeping (ms).
func (p *budgetEnds) note(key string, ends []int64, now int64) {
	if len(ends) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = make(map[string][]int64)
	}
	e := p.m[key]
	if len(e) != len(ends) {
		e = make([]int64, len(ends))
		p.m[key] = e
	}
	for i, v := range ends {
		e[i] = max(e[i], v)
	}
	if len(p.m) >= 2*max(p.swept, 64) {
		for k, e := range p.m {
			if slices.Max(e) <= now {
				delete(p.m, k)
			}
		}
		p.swept = len(p.m)
	}
}

// NewBudget returns a budget of the dimensions dims (at least one, at most
// 16) under key, shared by every instance that builds it with the same key,
// prefix and dimensions. Every per-call key gets its own budget of each
// dimension. Options: [WithPrefix], [WithHeartbeat].
func NewBudget(rdb redis.UniversalClient, key string, dims []Dimension, opts ...CommonOption) (*Budget, error) {
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
	b := &Budget{common: c, dims: append([]Dimension(nil), dims...), index: make(map[string]int, len(dims))}
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
		sliding := 0
		if d.Sliding {
			sliding = 1
		}
		b.args = append(b.args, d.Name, d.Limit, ceilMs(d.Interval), sliding)
	}
	if i, ok := b.index["requests"]; ok {
		b.takes = i
	}
	b.name = "bucket: Budget"
	return b, nil
}

// Dimensions returns the budget's dimensions, as given to NewBudget.
func (b *Budget) Dimensions() []Dimension { return append([]Dimension(nil), b.dims...) }

// Take implements [throttle.Bucket]: n of the dimension named "requests",
// or of the first if none is. It never reserves: maxWait is ignored.
func (b *Budget) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	if n < 1 {
		return throttle.Decision{}, errs.Invalid(b.name, "n", n, "must be at least 1")
	}
	return b.TakeCost(ctx, key, throttle.Cost{b.dims[b.takes].Name: n}, maxWait)
}

// refund is the Limiter's refund: n of Take's dimension, given
// back. The period they were granted in is unknown, so they can only
// lessen the debt the running period inherited: a permit taken in an
// earlier period is never granted again in this one. To give back into
// the grant's own period, use the grant's Decision.Settle.
func (b *Budget) refund(ctx context.Context, key string, n int64) error {
	if n < 1 {
		return nil
	}
	return b.settle(ctx, key, 0, throttle.Cost{b.dims[b.takes].Name: -n})
}

// budgetArgs is how many of budget.lua's ARGV each dimension has.
const budgetArgs = 7

// maxSettleUp bounds one settle-up, in periods' limits of its dimension.
const maxSettleUp = 10

// amounts checks c against the budget's dimensions and returns the
// script's ARGV. take refuses negative amounts, amounts above a
// dimension's limit and a cost of nothing.
func (b *Budget) amounts(field string, c throttle.Cost, take bool, mark int64, known []int64) ([]any, bool, error) {
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
			// A charge of many periods' limits is a caller's error (units,
			// a garbled usage), and would lock the key for as long.
			return nil, false, errs.Invalid(b.name, fmt.Sprintf("%s[%q]", field, name), v, fmt.Sprintf("a settle-up must be at most %d times the dimension's limit (%d): check the actual cost's units", maxSettleUp, b.dims[i].Limit))
		}
		amt[i] = v
		some = some || v != 0
	}
	mode := "settle"
	if take {
		mode = "take"
	}
	return b.argv(mode, mark, amt, known), some, nil
}

// argv is the script's ARGV: mode, mark, and per dimension its name,
// limit, period, amount, known end, whether it slides and the start of
// its sliding record known (0; see withKnown).
func (b *Budget) argv(mode string, mark int64, amt, known []int64) []any {
	args := make([]any, 0, 3+budgetArgs*len(b.dims))
	args = append(args, mode, len(b.dims), mark)
	for i := range b.dims {
		var end int64
		if i < len(known) {
			end = known[i]
		}
		args = append(args, b.args[4*i], b.args[4*i+1], b.args[4*i+2], amt[i], end, b.args[4*i+3], int64(0))
	}
	return args
}

func (b *Budget) names() string {
	s := ""
	for i, d := range b.dims {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%q", d.Name)
	}
	return s
}

// keys returns the keys of key's budget: its state and its pause.
func (b *Budget) keys(key string) ([]string, error) {
	tag, err := b.ks.tag(b.name, key)
	if err != nil {
		return nil, err
	}
	return []string{tag + ":budget", tag + ":pause"}, nil
}

// TakeCost implements [throttle.CostBucket]: c from every dimension it
// names, all or nothing, in one round trip. It never reserves: maxWait is
// ignored. Refused, Decision.Delay is the time until every dimension has
// enough (its refill, its debt paid) or the pause ends; Limit, Remaining
// and Reset describe the dimension that binds (granted: the one with the
// least left for its limit). A grant's Decision.Settle corrects it after
// the call (see [Budget]).
func (b *Budget) TakeCost(ctx context.Context, key string, c throttle.Cost, _ time.Duration) (throttle.Decision, error) {
	args, some, err := b.amounts("cost", c, true, 0, nil)
	if err != nil {
		return throttle.Decision{}, err
	}
	if !some {
		return throttle.Decision{}, errs.Invalid(b.name, "cost", fmt.Sprintf("%q", c.String()), "must ask for at least 1 of some dimension")
	}
	keys, err := b.keys(key)
	if err != nil {
		return throttle.Decision{}, err
	}
	b.withKnown(args, key)
	return bounded(ctx, &b.common, key, func(ctx context.Context) (throttle.Decision, error) {
		r, err := b.eval(ctx, scriptBudget, keys, args...)
		if err != nil {
			return throttle.Decision{}, backend("take", keys[0], err)
		}
		if len(r) < 7 {
			return throttle.Decision{}, backend("take", keys[0], errors.New("unexpected reply from budget.lua"))
		}
		b.noteEnds(key, r[7:], r[6])
		d := throttle.Decision{Granted: r[0] == 1, Remaining: r[2], Reset: ms(r[3]), Limit: r[4]}
		if !d.Granted {
			d.Delay = ms(r[1])
		}
		if d.Limit == 0 { // paused
			d.Limit = b.dims[b.takes].Limit
		}
		if d.Granted {
			// mark: the grant's time on the server's clock, its periods.
			g := &budgetGrant{b: b, key: key, mark: r[6], took: maps.Clone(c)}
			d.Settle = g.settle
		}
		return d, nil
	})
}

// withKnown puts the period ends this instance knows for key into args
// (the amounts' ARGV), and the starts of the sliding records it was told
// of (kept after the ends: see noteEnds).
func (b *Budget) withKnown(args []any, key string) {
	d := len(b.dims)
	for i, v := range b.ends.get(key) {
		switch {
		case i < d:
			args[3+budgetArgs*i+4] = v
		case i < 2*d:
			args[3+budgetArgs*(i-d)+6] = v
		}
	}
}

// noteEnds records the period ends an answer gave for key, and the
// starts of its sliding records after them (none from a paused budget),
// now being the answer's server clock. A record's start identifies it:
// a later record has a later start, so the latest is kept as the ends
// are.
func (b *Budget) noteEnds(key string, ends []int64, now int64) {
	if len(ends) == 2*len(b.dims) && slices.Max(ends[:len(b.dims)]) > 0 {
		b.ends.note(key, ends, now)
	}
}

// budgetGrant is one grant of TakeCost, for its Decision.Settle: what it
// took of each dimension, plus what settling charged since, less what it
// gave back.
type budgetGrant struct {
	b    *Budget
	key  string
	mark int64
	mu   sync.Mutex
	took throttle.Cost
}

// settle is the grant's Decision.Settle. Over all its calls, a grant gives
// back at most what it took of a dimension (plus what it was charged
// since): a give-back beyond is cut to that, so a grant settled twice, or
// with a give-back larger than its take, never hands its period what other
// grants took. A give-back whose round trip failed counts as given (it may
// have reached Redis); a charge counts once Redis confirmed it.
func (g *budgetGrant) settle(ctx context.Context, delta throttle.Cost) error {
	if _, _, err := g.b.amounts("delta", delta, false, 0, nil); err != nil {
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
	err := g.b.settle(ctx, g.key, g.mark, cut)
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

// settle changes key's dimensions by delta for a grant made at mark (ms
// on the server's clock; 0: unknown), in one round trip: a positive
// amount is charged at once, even beyond what is left (a debt, paid by
// the next refills before anything more is granted); a negative one is
// given back to the grant's period while it runs, up to its limit, or,
// once it has ended, only reduces a debt (see budget.lua). Amounts of 0
// change nothing, and a delta of nothing sends nothing. A charge above
// ten times a dimension's limit is refused (ErrInvalid), nothing charged.
func (b *Budget) settle(ctx context.Context, key string, mark int64, delta throttle.Cost) error {
	args, some, err := b.amounts("delta", delta, false, mark, nil)
	if err != nil || !some {
		return err
	}
	keys, err := b.keys(key)
	if err != nil {
		return err
	}
	b.withKnown(args, key)
	_, err = bounded(ctx, &b.common, key, func(ctx context.Context) (throttle.Decision, error) {
		r, err := b.eval(ctx, scriptBudget, keys, args...)
		if err != nil {
			return throttle.Decision{}, backend("settle", keys[0], err)
		}
		if len(r) >= 2 {
			b.noteEnds(key, r[2:], r[1])
		}
		return throttle.Decision{}, nil
	})
	return err
}

// pauseDimensions is the Limiter's pause of some dimensions: until each
// named dimension's RetryAfter has passed, no cost of key that needs some
// of it is granted to anyone sharing the budget; costs that need none of
// it are not held. A shorter pause never shortens a longer one. A name
// that is none of the budget's dimensions pauses the whole key for that
// long (as pause does): the provider counts something the budget does
// not, so nothing is known to pass. Times of 0 or less do nothing; times
// are rounded up to the millisecond and clamped to [throttle.MaxPause].
func (b *Budget) pauseDimensions(ctx context.Context, key string, dims []capability.Exhausted) error {
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
		amt[i] = max(amt[i], ceilMs(d))
		some = true
	}
	keys, err := b.keys(key)
	if err != nil {
		return err
	}
	var errs []error
	if whole > 0 {
		errs = append(errs, b.pause(ctx, key, whole))
	}
	if some {
		args := b.argv("pause", 0, amt, nil)
		_, err := bounded(ctx, &b.common, key, func(ctx context.Context) (throttle.Decision, error) {
			if _, err := b.eval(ctx, scriptBudget, keys, args...); err != nil {
				return throttle.Decision{}, backend("pause", keys[0], err)
			}
			return throttle.Decision{}, nil
		})
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// fallback is, for Take's dimension, its
// limit per interval, and the live instances last counted.
func (b *Budget) fallback() (int64, time.Duration, int64) {
	d := b.dims[b.takes]
	return d.Limit, ms(ceilMs(d.Interval)), b.calls.instances()
}

var (
	_ throttle.Bucket     = (*Budget)(nil)
	_ throttle.CostBucket = (*Budget)(nil)
)
