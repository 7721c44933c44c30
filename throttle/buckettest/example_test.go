package buckettest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/buckettest"
	"github.com/jonboulle/clockwork"
)

// window is a user's own bucket: at most limit permits per window of size
// aligned to its clock's Unix time, per key, in memory. (A real one would
// also forget the keys of past windows.)
type window struct {
	clock clockwork.Clock
	limit int64
	size  int64 // ns

	mu   sync.Mutex
	used map[string][2]int64 // key → {window start, permits granted in it}
}

func newWindow(clock clockwork.Clock, limit int64, size time.Duration) *window {
	return &window{clock: clock, limit: limit, size: int64(size), used: map[string][2]int64{}}
}

// Take implements throttle.Bucket.
func (w *window) Take(ctx context.Context, key string, n int64, _ time.Duration) (throttle.Decision, error) {
	if err := ctx.Err(); err != nil {
		return throttle.Decision{}, err
	}
	if n < 1 {
		return throttle.Decision{}, fmt.Errorf("window: n = %d: %w", n, throttle.ErrInvalid)
	}
	if n > w.limit {
		return throttle.Decision{}, fmt.Errorf("window: n = %d above the limit %d: %w", n, w.limit, throttle.ErrExceedsLimit)
	}
	now := w.clock.Now().UnixNano()
	start := now - now%w.size
	d := throttle.Decision{Limit: w.limit, Reset: time.Duration(start + w.size - now)}
	w.mu.Lock()
	defer w.mu.Unlock()
	u := w.used[key]
	if u[0] != start {
		u = [2]int64{start, 0}
	}
	if u[1]+n > w.limit {
		d.Delay, d.Remaining = d.Reset, w.limit-u[1]
		return d, nil
	}
	u[1] += n
	w.used[key] = u
	d.Granted, d.Remaining = true, w.limit-u[1]
	return d, nil
}

// A bucket of your own runs the suite from a test of its package, here
// on a fake clock. The suite's subtests name what they check; run the
// test with -v to see them.
func Example() {
	testWindow := func(t *testing.T) { // func TestWindow(t *testing.T) in your _test.go file
		clock := clockwork.NewFakeClock()
		buckettest.Run(t, buckettest.Spec{
			New:       func(*testing.T) throttle.Bucket { return newWindow(clock, 10, time.Second) },
			Limit:     10,
			Interval:  time.Second,
			Guarantee: buckettest.AlignedWindow,
			Clock:     clock,
		})
	}
	_ = testWindow
}
