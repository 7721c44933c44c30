package throttle_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
)

// neverBucket is a bucket that refuses every call with a delay of Forever (it will not grant again), naming a period that ends in a
// second. It fails every call after the first, so that a caller that asks
// again at once ends with that error.
type neverBucket struct {
	calls atomic.Int64
}

var errAskedAgain = errors.New("the bucket was asked again before its delay")

func (b *neverBucket) Take(_ context.Context, _ string, _ int64, _ time.Duration) (throttle.Decision, error) {
	if b.calls.Add(1) > 1 {
		return throttle.Decision{}, errAskedAgain
	}
	return throttle.Decision{Delay: throttle.Forever, Limit: 1, Remaining: 0, Reset: time.Second}, nil
}

func (b *neverBucket) Fallback() (int64, time.Duration, int64) { return 1, time.Second, 1 }

// A refusal whose delay is Forever keeps the key's gate closed: the
// closing time must not wrap into the past, which would let the caller
// (and every other) ask again at once, in a loop.
func TestARefusalForeverKeepsTheGateClosed(t *testing.T) {
	for _, n := range []int64{1, 2} { // 1: through the gate; 2: a private sleep
		t.Run(strconv.FormatInt(n, 10), func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			b := &neverBucket{}
			lim := throttle.New(b, throttle.WithClock(clock))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- lim.AcquireN(ctx, n, throttle.Forever) }()
			bctx, bcancel := context.WithTimeout(context.Background(), 5*time.Second)
			blocked := make(chan error, 1)
			go func() { blocked <- clock.BlockUntilContext(bctx, 1) }()
			select {
			case err := <-done:
				t.Fatalf("AcquireN(%d, Forever) after a refusal for Forever = %v, want it to wait (bucket asked %d times)", n, err, b.calls.Load())
			case err := <-blocked:
				require.NoError(t, err, "the caller waits on a timer")
			}
			require.Equal(t, int64(1), b.calls.Load(), "n=%d: the bucket asked once", n)
			cancel()
			require.ErrorIs(t, <-done, context.Canceled)
			bcancel()
			lim.Close()
		})
	}
}
