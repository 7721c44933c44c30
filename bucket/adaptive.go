package bucket

import (
	"context"
	_ "embed"
	"math"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/throttle"
)

// The fleet's adaptive rate (see docs/adaptive.md): every bucket
// keeps it in Redis next to the budget's own keys, under the same hash
// tag, so that a refusal one instance reports slows every instance that
// shares the bucket, and they all pace their grants at one rate on the
// server's clock. A budget that is not adapting has no such keys.

var (
	//go:embed lua/adapt_pace.lua
	srcAdaptPace string
	//go:embed lua/adapt_swap.lua
	srcAdaptSwap string

	scriptAdaptPace = redis.NewScript(srcAdaptPace)
	scriptAdaptSwap = redis.NewScript(srcAdaptSwap)
)

// adaptScripts lists the adaptive scripts by file name, for tests.
var adaptScripts = map[string]*redis.Script{
	"adapt_pace.lua": scriptAdaptPace,
	"adapt_swap.lua": scriptAdaptSwap,
}

// adaptKeys are key's adaptive state and its next free slot.
func (c *common) adaptKeys(key string) ([]string, error) {
	tag, err := c.ks.tag(c.name, key)
	if err != nil {
		return nil, err
	}
	return []string{tag + ":adapt", tag + ":adapt:tat"}, nil
}

// PaceAdaptive implements [throttle.AdaptiveStore] with one round trip:
// it reads key's adaptive state, kept in Redis for the whole fleet, and,
// while it is active, reserves n evenly spaced slots at its rate when the
// first is at most horizon away. It is for a throttle.Limiter: a program
// that calls it takes paced slots from the whole fleet. A program reads
// the fleet's rate with [throttle.Keyed.AdaptiveState].
func (c *common) PaceAdaptive(ctx context.Context, key string, n int64, interval, horizon time.Duration) (throttle.AdaptivePace, error) {
	keys, err := c.adaptKeys(key)
	if err != nil {
		return throttle.AdaptivePace{}, err
	}
	// The reply is handed over through an atomic pointer, read only when
	// bounded returned f's own result: a call cut off by ctx may still be
	// running (and writing) in bounded's goroutine.
	var res atomic.Pointer[throttle.AdaptivePace]
	_, err = bounded(ctx, c, key, func(ctx context.Context) (throttle.Decision, error) {
		cmd, _ := c.evalNoRetry(ctx, scriptAdaptPace, keys, []any{n, max(ceilUs(interval), 1), max(int64(horizon/time.Microsecond), 0)})
		r, err := cmd.Int64Slice()
		if err := replyErr(err, len(r) >= 11, "adapt_pace.lua"); err != nil {
			return throttle.Decision{}, backend("pace", keys[0], err)
		}
		res.Store(&throttle.AdaptivePace{Granted: r[0] >= 1, Delay: us(r[1]), State: adaptState(r[2], r[3:11])})
		return throttle.Decision{}, nil
	})
	if err != nil {
		return throttle.AdaptivePace{}, err
	}
	return *res.Load(), nil
}

// SwapAdaptive implements [throttle.AdaptiveStore] with one round trip:
// it replaces key's adaptive state, kept in Redis for the whole fleet, by
// next if its version is still old.Version, and returns the stored state
// and whether it swapped; the state expires ttl after its last swap. With
// old.Version below 0 it only reads (next and ttl unused: cmd/headwayctl
// reads the rate so). A throttle.Limiter changes it after reports of
// refusals; [throttle.Keyed.AdaptiveState] reads it through one.
func (c *common) SwapAdaptive(ctx context.Context, key string, old, next throttle.AdaptiveState, ttl time.Duration) (throttle.AdaptiveState, bool, error) {
	keys, err := c.adaptKeys(key)
	if err != nil {
		return throttle.AdaptiveState{}, false, err
	}
	type reply struct {
		s       throttle.AdaptiveState
		swapped bool
	}
	var res atomic.Pointer[reply] // as in PaceAdaptive
	_, err = bounded(ctx, c, key, func(ctx context.Context) (throttle.Decision, error) {
		args := []any{old.Version, max(ceilMs(ttl), 1),
			milli(next.Rate), milli(next.Ceiling), milli(next.Peak), milli(next.Step),
			micros(next.Decreased), micros(next.Increased), micros(next.Refused)}
		cmd, _ := c.evalNoRetry(ctx, scriptAdaptSwap, keys[:1], args)
		r, err := cmd.Int64Slice()
		if err := replyErr(err, len(r) >= 10, "adapt_swap.lua"); err != nil {
			return throttle.Decision{}, backend("adapt", keys[0], err)
		}
		res.Store(&reply{s: adaptState(r[1], r[2:10]), swapped: r[0] == 1})
		return throttle.Decision{}, nil
	})
	if err != nil {
		return throttle.AdaptiveState{}, false, err
	}
	r := res.Load()
	return r.s, r.swapped, nil
}

// adaptState decodes the fields r, c, p, s, d, i, x, v read at nowUs.
func adaptState(nowUs int64, f []int64) throttle.AdaptiveState {
	return throttle.AdaptiveState{
		Rate: float64(f[0]) / 1000, Ceiling: float64(f[1]) / 1000, Peak: float64(f[2]) / 1000, Step: float64(f[3]) / 1000,
		Decreased: fromMicros(f[4]), Increased: fromMicros(f[5]), Refused: fromMicros(f[6]),
		Version: f[7], At: time.UnixMicro(nowUs),
	}
}

// milli is a rate in thousandths, rounded down (never faster than asked),
// as package throttle's law counts them: within a millionth of a
// thousandth, so that a rate the law computed as 6.8599999… (0.98 of 7)
// is kept as 6.860, the thousandth it means, and reads back as itself.
func milli(v float64) int64 {
	if v <= 0 || math.IsNaN(v) {
		return 0
	}
	return int64(math.Floor(min(v*1000+1e-6, 1<<53)))
}

func micros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

func fromMicros(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMicro(v)
}
