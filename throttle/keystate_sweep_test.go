package throttle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// failingLocal is a Local that fails as a store does while down; it is
// no Immediate (no Unwrap), so the failure policy decides meanwhile.
type failingLocal struct {
	loc  *Local
	down atomic.Bool
}

func (f *failingLocal) Take(ctx context.Context, key string, n int64, w time.Duration) (Decision, error) {
	if f.down.Load() {
		return Decision{}, &BackendError{Op: "take", Err: errors.New("connection refused")}
	}
	return f.loc.Take(ctx, key, n, w)
}

func (f *failingLocal) Fallback() (int64, time.Duration, int64) {
	return f.loc.Fallback()
}

// TestTenantKeysUnusedSinceAnOutageAreForgottenWhileOnlyTheDefaultKeyIsUsed
// 100 tenant keys granted locally during an outage hold their
// local shares for a while; once those have run out and the keys have
// been idle for their window, they are forgotten, though traffic goes to
// key "" alone (whose state is the Limiter's own, outside the map). They
// were kept until a key of their shard was used again: an hour later,
// all 100 were still there.
func TestTenantKeysUnusedSinceAnOutageAreForgottenWhileOnlyTheDefaultKeyIsUsed(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	loc, err := NewLocal(1000, time.Second, WithClock(clock))
	require.NoError(t, err)
	b := &failingLocal{loc: loc}
	lim := New(b, WithClock(clock), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer lim.Close()
	b.down.Store(true)
	_ = lim.Acquire(ctx, 0)        // the outage begins
	clock.Advance(2 * time.Second) // FailLocal grants an interval after the failure of a period it knows nothing of
	for i := range 100 {
		require.NoError(t, lim.Key(fmt.Sprintf("tenant-%d", i)).Acquire(ctx, 0), "granted locally in the outage")
	}
	require.Equal(t, 100, lim.states.count())
	b.down.Store(false)

	// Local shares owe the store for two intervals; the keys' idle window
	// is a second: all may go 3 s after their last use. Key "" is used
	// every 10 ms meanwhile and after.
	for range 400 {
		clock.Advance(10 * time.Millisecond)
		require.NoError(t, lim.Acquire(ctx, 0))
	}
	assert.Zero(t, lim.states.count(), "tenant keys kept 4 s after their last use, while key \"\" was used")
}
