package bucket

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
)

// maxTiers bounds the tiers of one bucket.
const maxTiers = 16

// windows is the machinery FixedWindow and Tiers share: one script over
// one or more aligned windows.
type windows struct {
	common
	tiers    []throttle.Tier
	kinds    []string // key suffix per tier
	live     bool     // pass each tier's live-limit key (FixedWindow)
	args     []any    // ARGV[2..]: limit, length µs per tier
	capacity int64    // smallest limit
}

func newWindows(name string, rdb redis.UniversalClient, key string, tiers []throttle.Tier, kind string, opts []CommonOption) (windows, error) {
	c, err := newCommon(name, rdb, key, opts)
	if err != nil {
		return windows{}, err
	}
	if err := checkTiers(name, tiers); err != nil {
		return windows{}, err
	}
	w := windows{common: c, tiers: append([]throttle.Tier(nil), tiers...), capacity: tiers[0].Limit}
	for _, t := range tiers {
		usLen := ceilUs(t.Period)
		w.kinds = append(w.kinds, ":"+kind+":"+strconv.FormatInt(usLen, 10))
		w.args = append(w.args, t.Limit, usLen)
		w.capacity = min(w.capacity, t.Limit)
	}
	return w, nil
}

// checkTiers refuses an empty list, a zero or negative limit, a period
// below 1 ms, and two tiers of the same period.
func checkTiers(name string, tiers []throttle.Tier) error {
	if len(tiers) == 0 {
		return errs.Invalid(name, "tiers", "[]", "must hold at least one tier")
	}
	if len(tiers) > maxTiers {
		return errs.Invalid(name, "tiers", fmt.Sprintf("%d tiers", len(tiers)), fmt.Sprintf("must hold at most %d", maxTiers))
	}
	seen := make(map[int64]bool, len(tiers))
	for i, t := range tiers {
		if err := checkLimitRange(name, fmt.Sprintf("tiers[%d].Limit", i), t.Limit); err != nil {
			return err
		}
		if err := checkDuration(name, fmt.Sprintf("tiers[%d].Period", i), t.Period, time.Millisecond); err != nil {
			return err
		}
		if seen[ceilUs(t.Period)] {
			return errs.Invalid(name, fmt.Sprintf("tiers[%d].Period", i), t.Period, "must differ from every other tier's period")
		}
		seen[ceilUs(t.Period)] = true
	}
	return nil
}

// run is one round trip of window.lua; n < 0 asks for up to -n permits.
func (w *windows) run(ctx context.Context, key string, n int64, _ time.Duration, _ []time.Duration) (upTo, error) {
	tag, err := w.ks.tag(w.name, key)
	if err != nil {
		return upTo{}, err
	}
	keys := make([]string, 0, 1+2*len(w.kinds))
	keys = append(keys, tag+":pause")
	for _, k := range w.kinds {
		keys = append(keys, tag+k)
	}
	if w.live {
		for _, k := range w.kinds {
			keys = append(keys, tag+k+":limit")
		}
	}
	args := make([]any, 0, 1+len(w.args))
	args = append(args, n)
	args = append(args, w.args...)
	r, _, err := w.eval(ctx, scriptWindow, keys, args...)
	if err := replyErr(err, len(r) >= 7 || len(r) == 6 && r[0] != 1, "window.lua"); err != nil {
		return upTo{}, backend("take", keys[1], err)
	}
	if r[0] == 2 {
		return upTo{}, exceeds(w.name, n, r[4])
	}
	return windowsReply(r, w.capacity), nil
}

// windowsReply reads a reply of window.lua or sliding.lua, which answer
// alike: {granted, delay, remaining, reset, limit, got, next}, times in µs,
// limit 0 in a pause (capacity, the tightest limit, is reported then).
func windowsReply(r []int64, capacity int64) upTo {
	d := throttle.Decision{Granted: r[0] == 1, Remaining: r[2], Reset: us(r[3]), Limit: r[4]}
	if d.Limit == 0 {
		d.Limit = capacity
	}
	if !d.Granted {
		d.Delay = us(r[1])
		return upTo{granted: d, rest: d}
	}
	rest := throttle.Decision{Delay: us(r[6]), Limit: d.Limit, Remaining: 0, Reset: d.Reset}
	return upTo{granted: d, got: r[5], rest: rest}
}

// FixedWindow counts permits in fixed windows aligned to the Redis server's
// clock: window k runs from k·interval to (k+1)·interval since the Unix
// epoch (windowStart = now/window*window). It matches a provider whose
// limit resets on wall-clock boundaries ("1000 calls per 10 s, counters
// reset at :00, :10, ...").
//
// Guarantee: at most limit permits per aligned window. A span of one
// interval that straddles a boundary can see up to 2·limit (the end of one
// window, the start of the next); use [SlidingLog] or [GCRA] if the
// provider counts over a sliding window.
//
// How: one script reads the server's TIME, checks the window's counter
// before it counts (a denied call charges nothing) and sets the counter to
// expire at the window's end, so old windows clean themselves up. When
// refused, Decision.Delay is the time until the window ends.
//
// Its limit can be changed live, for the whole fleet, with
// [FixedWindow.SetLimit]; the change applies from the next window.
//
// Round trips per grant: 1. A Limiter can pause it for the whole fleet.
// It is safe for concurrent use.
type FixedWindow struct {
	windows
}

// NewFixedWindow returns a fixed-window bucket of limit permits per aligned
// window of length interval under key. Each per-call key passed to Take
// gets its own budget.
//
// limit must be at least 1 and interval at least 1 ms. Options:
// [WithPrefix], [WithHeartbeat].
func NewFixedWindow(rdb redis.UniversalClient, key string, limit int64, interval time.Duration, opts ...CommonOption) (*FixedWindow, error) {
	const name = "bucket: NewFixedWindow"
	if err := checkRate(name, limit, "interval", interval); err != nil {
		return nil, err
	}
	w, err := newWindows(name, rdb, key, []throttle.Tier{{Limit: limit, Period: interval}}, "fw", opts)
	if err != nil {
		return nil, err
	}
	w.name = "bucket: FixedWindow"
	w.live = true
	return &FixedWindow{windows: w}, nil
}

// Take implements [throttle.Bucket]. It never reserves: maxWait is
// ignored.
func (b *FixedWindow) Take(ctx context.Context, key string, n int64, _ time.Duration) (throttle.Decision, error) {
	return b.takeBy(ctx, key, n, b.capacity, 0, b.run)
}

// Tiers is several fixed-window limits on one key that must all pass, such
// as "10 per second and 50 per 10 seconds". It matches a provider that
// publishes several wall-clock-aligned limits at once.
//
// Guarantee: each tier's own (see [FixedWindow]): at most Limit permits per
// aligned window of its Period. A call is charged to every tier or to none;
// a denied call charges nothing.
//
// Round trips per grant: 1 — one script over every tier, whose keys share
// one hash tag and so one cluster slot. When refused, Decision.Delay is the
// time until every full tier's window has ended; Limit, Remaining and Reset
// describe the tier with the fewest permits left.
//
// A Limiter can pause Tiers for the whole fleet. It is safe for concurrent
// use.
type Tiers struct {
	windows
}

// NewTiers returns a bucket that grants a permit only when every tier has
// room. Tiers need at least one entry, at most 16, each with Limit ≥ 1 and
// Period ≥ 1 ms, no two with the same Period. A Take may ask for at most
// the smallest Limit. Options: [WithPrefix], [WithHeartbeat].
func NewTiers(rdb redis.UniversalClient, key string, tiers []throttle.Tier, opts ...CommonOption) (*Tiers, error) {
	w, err := newWindows("bucket: NewTiers", rdb, key, tiers, "tier", opts)
	if err != nil {
		return nil, err
	}
	w.name = "bucket: Tiers"
	return &Tiers{windows: w}, nil
}

// Take implements [throttle.Bucket]. It never reserves: maxWait is
// ignored.
func (b *Tiers) Take(ctx context.Context, key string, n int64, _ time.Duration) (throttle.Decision, error) {
	return b.takeBy(ctx, key, n, b.capacity, 0, b.run)
}
