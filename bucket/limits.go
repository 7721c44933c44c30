package bucket

import (
	"context"
	"fmt"

	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/throttle"
)

// MaxLimit is the largest limit SetLimit accepts: a billion permits per
// interval. Anything larger is almost surely a typo.
const MaxLimit int64 = 1_000_000_000

// checkLimit validates a live limit.
func checkLimit(name string, limit int64) error {
	if limit < 1 {
		return errs.Invalid(name, "limit", limit, "must be at least 1")
	}
	if limit > MaxLimit {
		return errs.Invalid(name, "limit", limit, fmt.Sprintf("must be at most %d (bucket.MaxLimit)", MaxLimit))
	}
	return nil
}

// setLimit stores limit as the live limit of key's budget, or with limit
// 0 removes it; kind is the budget's key suffix (":tb", ":gcra",
// ":fw:<µs>").
func (c *common) setLimit(ctx context.Context, key, kind string, limit int64) error {
	method, op := ".SetLimit", "set limit"
	if limit == 0 {
		method, op = ".ClearLimit", "clear limit"
	}
	tag, err := c.ks.tag(c.name+method, key)
	if err != nil {
		return err
	}
	k := tag + kind + ":limit"
	if limit == 0 {
		err = c.rdb.Del(ctx, k).Err()
	} else {
		err = c.rdb.Set(ctx, k, limit, 0).Err()
	}
	if err != nil {
		return backend(op, k, err)
	}
	return nil
}

// liveOr returns r[i], a limit a script reported, or def when the script
// did not report one (0 or absent).
func liveOr(r []int64, i int, def int64) int64 {
	if len(r) > i && r[i] > 0 {
		return r[i]
	}
	return def
}

// exceeds is the error for n above a limit lowered live.
func exceeds(name string, n, limit int64) error {
	return fmt.Errorf("%s: %d permits asked at once, the limit in force is %d (set live with SetLimit): %w", name, n, limit, throttle.ErrExceedsLimit)
}

// SetLimit changes the limit of key's budget ("" for the constructor's key)
// for every instance sharing the bucket, until [TokenBucket.ClearLimit].
// It applies from the next take: the permits placed before it count
// against the new limit as they counted against the old, so lowering it
// holds the new limit in any span of one interval from the change on.
//
// limit must be between 1 and [MaxLimit]. A Take may still ask for at most
// the constructor's limit at once; one asking more than a lowered limit
// gets an error wrapping [throttle.ErrExceedsLimit].
func (b *TokenBucket) SetLimit(ctx context.Context, key string, limit int64) error {
	if err := checkLimit(b.name+".SetLimit", limit); err != nil {
		return err
	}
	return b.setLimit(ctx, key, ":tb", limit)
}

// ClearLimit removes the limit SetLimit stored for key's budget: the
// constructor's limit applies again from the next take. Clearing a
// budget without one does nothing.
func (b *TokenBucket) ClearLimit(ctx context.Context, key string) error {
	return b.setLimit(ctx, key, ":tb", 0)
}

// SetLimit changes the limit of key's budget ("" for the constructor's key)
// for every instance sharing the bucket, until [FixedWindow.ClearLimit].
// It applies from the next window, at most one interval away: a window's
// limit is fixed by its first grant, so lowering never lets more than the
// old limit through in the running window.
//
// limit must be between 1 and [MaxLimit]. A Take may still ask for at most
// the constructor's limit at once; one asking more than a lowered limit
// gets an error wrapping [throttle.ErrExceedsLimit].
func (b *FixedWindow) SetLimit(ctx context.Context, key string, limit int64) error {
	if err := checkLimit(b.windows.name+".SetLimit", limit); err != nil {
		return err
	}
	return b.windows.setLimit(ctx, key, b.windows.kinds[0], limit)
}

// ClearLimit removes the limit SetLimit stored for key's budget: the
// constructor's limit applies again from the next window.
func (b *FixedWindow) ClearLimit(ctx context.Context, key string) error {
	return b.windows.setLimit(ctx, key, b.windows.kinds[0], 0)
}

// SetLimit changes the rate of key's budget ("" for the constructor's key)
// to limit per interval for every instance sharing the bucket, until
// [GCRA.ClearLimit]. It applies at once, to the next Take: the emission
// interval becomes interval/limit, and the burst follows the limit unless
// [WithBurst] fixed it. Slots already reserved (at most the callers'
// maxWait ahead) keep their times.
//
// limit must be between 1 and [MaxLimit], and at most one per microsecond
// of interval. A Take may still ask for at most the constructor's burst.
func (b *GCRA) SetLimit(ctx context.Context, key string, limit int64) error {
	name := b.name + ".SetLimit"
	if err := checkLimit(name, limit); err != nil {
		return err
	}
	if limit > b.ivUs {
		return errs.Invalid(name, "limit", limit, fmt.Sprintf("must be at most one per microsecond of the interval (%d)", b.ivUs))
	}
	if em := (b.ivUs + limit - 1) / limit; b.fixed > (1<<50)/em {
		return errs.Invalid(name, "limit", limit, fmt.Sprintf("too small for the burst %d: burst × interval/limit must stay below 2^50 µs", b.fixed))
	}
	return b.setLimit(ctx, key, ":gcra", limit)
}

// ClearLimit removes the rate SetLimit stored for key's budget: the
// constructor's applies again from the next Take.
func (b *GCRA) ClearLimit(ctx context.Context, key string) error {
	return b.setLimit(ctx, key, ":gcra", 0)
}
