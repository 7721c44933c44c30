package throttle

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slowRefund grants every take latency after it decided, on the fake
// clock, and takes its permits back only when release is closed (a store
// that answers the give-back late); ended counts the Refunds that
// returned, refunded those that took the permits back.
type slowRefund struct {
	fake     *clockwork.FakeClock
	latency  time.Duration
	release  chan struct{}
	ended    atomic.Int64
	refunded atomic.Int64
}

func (b *slowRefund) Take(context.Context, string, int64, time.Duration) (Decision, error) {
	b.fake.Advance(b.latency)
	return Decision{Granted: true}, nil
}

func (b *slowRefund) Refund(ctx context.Context, _ string, n int64) error {
	defer b.ended.Add(1)
	select {
	case <-b.release:
		b.refunded.Add(n)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestGiveBackDoesNotKeepTheCallerPastTheStoreTimeout: a grant answered
// after the caller's wait is given back; a store slow to take it back
// keeps the caller at most the store timeout, not the give-back's whole
// second, and the give-back is not lost: it goes on, and Close waits for
// it.
func TestGiveBackDoesNotKeepTheCallerPastTheStoreTimeout(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &slowRefund{fake: clock, latency: 30 * time.Millisecond, release: make(chan struct{})}
	lim := New(b, WithClock(clock), WithStoreTimeout(5*time.Millisecond))
	defer lim.Close()
	err := lim.Acquire(context.Background(), 20*time.Millisecond)
	require.ErrorIs(t, err, ErrTimeout)
	assert.Zero(t, b.ended.Load(), "Acquire returned only once the give-back had ended")
	close(b.release)
	require.NoError(t, lim.Close())
	assert.Equal(t, int64(1), b.refunded.Load(), "the late grant given back")
}

// TestGiveBackDoesNotKeepTheCallerPastItsWait: a grant answered after the
// caller's wait is given back without keeping the caller any longer, even
// with a long store timeout: its give-back's bound is its wait's end, not
// the store timeout. The give-back goes on, and Close waits for it.
func TestGiveBackDoesNotKeepTheCallerPastItsWait(t *testing.T) {
	clock := clockwork.NewFakeClock()
	b := &slowRefund{fake: clock, latency: 30 * time.Millisecond, release: make(chan struct{})}
	lim := New(b, WithClock(clock), WithStoreTimeout(time.Hour))
	defer lim.Close()
	done := make(chan error, 1)
	go func() { done <- lim.Acquire(context.Background(), 20*time.Millisecond) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrTimeout)
	case <-time.After(time.Minute):
		close(b.release)
		t.Fatal("Acquire waited for its give-back past the end of its wait")
	}
	assert.Zero(t, b.ended.Load(), "Acquire returned only once the give-back had ended")
	close(b.release)
	require.NoError(t, lim.Close())
	assert.Equal(t, int64(1), b.refunded.Load(), "the late grant given back")
}
