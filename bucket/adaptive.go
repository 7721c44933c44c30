package bucket

import (
	"context"
	_ "embed"
	"errors"
	"math"
	"sync/atomic"
	"time"

	"github.com/headway-go/headway/internal/capability"
	"github.com/headway-go/headway/throttle"
	"github.com/redis/go-redis/v9"
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

// paceAdaptive is capability.AdaptiveStore's PaceAdaptive: one round trip that
// reads key's adaptive state and, while it is active, reserves n evenly
// spaced slots at its rate when the first is at most horizon away.
func (c *common) paceAdaptive(ctx context.Context, key string, n int64, interval, horizon time.Duration) (capability.AdaptivePace, error) {
	keys, err := c.adaptKeys(key)
	if err != nil {
		return capability.AdaptivePace{}, err
	}
	// The reply is handed over through an atomic pointer, read only when
	// bounded returned f's own result: a call cut off by ctx may still be
	// running (and writing) in bounded's goroutine.
	var res atomic.Pointer[capability.AdaptivePace]
	_, err = bounded(ctx, c, key, func(ctx context.Context) (throttle.Decision, error) {
		cmd, _ := c.evalNoRetry(ctx, scriptAdaptPace, keys, []any{n, max(ceilUs(interval), 1), max(int64(horizon/time.Microsecond), 0)})
		r, err := cmd.Int64Slice()
		if err != nil {
			return throttle.Decision{}, backend("pace", keys[0], err)
		}
		if len(r) < 11 {
			return throttle.Decision{}, backend("pace", keys[0], errors.New("unexpected reply from adapt_pace.lua"))
		}
		res.Store(&capability.AdaptivePace{Granted: r[0] >= 1, Delay: us(r[1]), State: adaptState(r[2], r[3:11])})
		return throttle.Decision{}, nil
	})
	if err != nil {
		return capability.AdaptivePace{}, err
	}
	return *res.Load(), nil
}

// swapAdaptive is capability.AdaptiveStore's SwapAdaptive, with one round trip.
func (c *common) swapAdaptive(ctx context.Context, key string, old, next capability.AdaptiveState, ttl time.Duration) (capability.AdaptiveState, bool, error) {
	keys, err := c.adaptKeys(key)
	if err != nil {
		return capability.AdaptiveState{}, false, err
	}
	type reply struct {
		s       capability.AdaptiveState
		swapped bool
	}
	var res atomic.Pointer[reply] // as in PaceAdaptive
	_, err = bounded(ctx, c, key, func(ctx context.Context) (throttle.Decision, error) {
		args := []any{old.Version, max(ceilMs(ttl), 1),
			milli(next.Rate), milli(next.Ceiling), milli(next.Peak), milli(next.Step),
			micros(next.Decreased), micros(next.Increased), micros(next.Refused)}
		cmd, _ := c.evalNoRetry(ctx, scriptAdaptSwap, keys[:1], args)
		r, err := cmd.Int64Slice()
		if err != nil {
			return throttle.Decision{}, backend("adapt", keys[0], err)
		}
		if len(r) < 10 {
			return throttle.Decision{}, backend("adapt", keys[0], errors.New("unexpected reply from adapt_swap.lua"))
		}
		res.Store(&reply{s: adaptState(r[1], r[2:10]), swapped: r[0] == 1})
		return throttle.Decision{}, nil
	})
	if err != nil {
		return capability.AdaptiveState{}, false, err
	}
	r := res.Load()
	return r.s, r.swapped, nil
}

// adaptive reads key's adaptive state ("" for the constructor's key) in
// one round trip; the zero state means the budget is not adapting. For
// operators (cmd/headwayctl).
func (c *common) adaptive(ctx context.Context, key string) (capability.AdaptiveState, error) {
	s, _, err := c.swapAdaptive(ctx, key, capability.AdaptiveState{Version: -1}, capability.AdaptiveState{}, time.Millisecond)
	return s, err
}

// adaptState decodes the fields r, c, p, s, d, i, x, v read at nowUs.
func adaptState(nowUs int64, f []int64) capability.AdaptiveState {
	return capability.AdaptiveState{
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
