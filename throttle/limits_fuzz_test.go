package throttle_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/throttle"
)

// checkRefusal fails t unless err is a refusal of bad input: an error
// matching ErrInvalid.
func checkRefusal(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, throttle.ErrInvalid) {
		t.Fatalf("%s: %v, not an error matching ErrInvalid", what, err)
	}
}

// FuzzLocalLimits checks NewLocal's arithmetic on any limit, interval and
// burst: it never panics, refuses bad values with ErrInvalid, and a bucket
// it accepts grants its burst at once, then refuses with a positive delay
// of at most one interval per permit asked, without overflowing.
func FuzzLocalLimits(f *testing.F) {
	for _, s := range [][3]int64{
		{10, int64(time.Second), 0}, {1, 1, 0}, {1, 1, 1}, {0, int64(time.Second), 0},
		{-1, int64(time.Second), 0}, {5, 0, 0}, {5, -1, 0}, {2, 1, 0},
		{math.MaxInt64, math.MaxInt64, 0}, {1, math.MaxInt64, math.MaxInt64}, {3, int64(time.Hour), 1 << 62},
		{7, int64(time.Second), -3}, {1000, int64(time.Millisecond), 1},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, limit, interval, burst int64) {
		clock := clockwork.NewFakeClock()
		opts := []throttle.LocalOption{throttle.WithClock(clock)}
		if burst != 0 {
			opts = append(opts, throttle.WithLocalBurst(burst))
		}
		b, err := throttle.NewLocal(limit, time.Duration(interval), opts...)
		if err != nil {
			checkRefusal(t, "NewLocal", err)
			return
		}
		if limit < 1 || interval < 1 || limit > interval {
			t.Fatalf("NewLocal(%d, %d) accepted", limit, interval)
		}
		eff := burst
		if eff == 0 {
			eff = limit
		}
		ctx := context.Background()
		// The whole burst at once (capped, so the test stays quick).
		n := min(eff, 1<<20)
		d, err := b.Take(ctx, "k", n, 0)
		if err != nil || !d.Granted || d.Delay != 0 {
			t.Fatalf("Take(%d) on a full bucket of burst %d: %+v, %v", n, eff, d, err)
		}
		if n == eff {
			d, err = b.Take(ctx, "k", 1, 0)
			if err != nil || d.Granted || d.Delay <= 0 || d.Delay > time.Duration(interval) {
				t.Fatalf("Take(1) on an empty bucket: %+v, %v; want a refusal within one interval", d, err)
			}
			if _, err := b.Take(ctx, "k", eff+1, throttle.Forever); !errors.Is(err, throttle.ErrExceedsLimit) && eff < math.MaxInt64 {
				t.Fatalf("Take(burst+1): %v, want ErrExceedsLimit", err)
			}
		}
		for _, bad := range []int64{0, -1, math.MinInt64} {
			if _, err := b.Take(ctx, "k", bad, 0); err == nil {
				t.Fatalf("Take(%d) accepted", bad)
			}
		}
	})
}

// FuzzLeasingOptions checks the Limiter's leasing on any option value: no
// panic, and every refusal matches ErrInvalid.
func FuzzLeasingOptions(f *testing.F) {
	f.Add(0.1, int64(time.Second), int64(time.Minute))
	f.Add(0.0, int64(0), int64(0))
	f.Add(-1.0, int64(-1), int64(-1))
	f.Add(math.NaN(), int64(1), int64(1))
	f.Add(math.Inf(1), int64(math.MaxInt64), int64(math.MaxInt64))
	f.Add(1.0, int64(time.Millisecond), int64(time.Hour))
	f.Fuzz(func(t *testing.T, share float64, horizon, ttl int64) {
		inner, err := throttle.NewLocal(100, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		lim := throttle.New(inner, throttle.WithLeasing(throttle.Leasing{Share: share, Horizon: time.Duration(horizon), TTL: time.Duration(ttl)}))
		err = lim.Acquire(context.Background(), 0)
		if err != nil && !errors.Is(err, throttle.ErrTimeout) {
			checkRefusal(t, "WithLeasing", err)
			return
		}
		if !(share >= 0 && share <= 1) || horizon < 0 || ttl < 0 {
			t.Fatalf("WithLeasing accepted share %v, horizon %v, ttl %v", share, horizon, ttl)
		}
		if err := lim.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	})
}

// FuzzAcquireArgs checks Acquire's arguments: any n and maxWait is
// answered (granted, refused or ErrInvalid) without a panic and within the
// context's deadline.
func FuzzAcquireArgs(f *testing.F) {
	for _, s := range [][2]int64{{1, 0}, {0, 0}, {-1, 0}, {1, -1}, {11, 0}, {10, int64(throttle.Forever)}, {math.MaxInt64, math.MaxInt64}, {math.MinInt64, math.MinInt64}, {5, int64(time.Hour)}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, n, maxWait int64) {
		b, err := throttle.NewLocal(10, time.Second, throttle.WithLocalBurst(10))
		if err != nil {
			t.Fatal(err)
		}
		lim := throttle.New(b)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		start := time.Now()
		err = lim.AcquireN(ctx, n, time.Duration(maxWait))
		if took := time.Since(start); took > time.Second {
			t.Fatalf("AcquireN(%d, %d) took %v, beyond the context's 20 ms", n, maxWait, took)
		}
		switch {
		case n < 1 || maxWait < 0:
			checkRefusal(t, "AcquireN", err)
		case n > 10:
			if !errors.Is(err, throttle.ErrExceedsLimit) {
				t.Fatalf("AcquireN(%d): %v, want ErrExceedsLimit", n, err)
			}
		case err != nil:
			t.Fatalf("AcquireN(%d, %d) on a full bucket: %v", n, maxWait, err)
		}
	})
}
