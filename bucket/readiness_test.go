package bucket_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// TestCheckAtStartReportsTheStoreAndTheShare: Limiter.Check, for a
// readiness probe, answers in one round trip: nil with Redis up, after
// which FailLocal knows this instance's share without any take; with Redis
// unreachable, an error that names the policy in force and why it will
// refuse. Acquire's error says the same.
func TestCheckAtStartReportsTheStoreAndTheShare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("redis up", func(t *testing.T) {
		srv := redisenv.New(t)
		tb, err := bucket.NewTokenBucket(srv.Client(), "ready", 100, time.Second)
		require.NoError(t, err)
		_, _, inst := fallbackOf(t, tb)
		require.Zero(t, inst, "no instance count before any round trip")
		lim := throttle.New(tb)
		defer lim.Close()
		require.NoError(t, lim.Check(ctx))
		_, _, inst = fallbackOf(t, tb)
		assert.Equal(t, int64(1), inst, "the check counted the live instances")
	})
	t.Run("redis unreachable", func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
		defer rdb.Close()
		tb, err := bucket.NewTokenBucket(rdb, "ready", 100, time.Second)
		require.NoError(t, err)
		var logs safeBuffer
		lim := throttle.New(tb, throttle.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		defer lim.Close()
		err = lim.Check(ctx)
		var be *throttle.BackendError
		require.ErrorAs(t, err, &be)
		assert.ErrorContains(t, err, "FailLocal refuses: this instance has not reached the store since it started, so it does not know its share")
		err = lim.Acquire(ctx, time.Second)
		require.ErrorAs(t, err, &be)
		assert.ErrorContains(t, err, "FailLocal refuses: this instance has not reached the store since it started, so it does not know its share")
		assert.False(t, errors.Is(err, throttle.ErrTimeout), "a refusal of the policy, not a wait that ran out: %v", err)
		assert.Contains(t, logs.String(), `policy=local what="FailLocal refuses: this instance has not reached the store since it started, so it does not know its share"`, "the log says what the error says")
		assert.NotContains(t, logs.String(), "grants its share", "the log does not promise a share it cannot grant")

		closed := throttle.New(tb, throttle.WithFailurePolicy(throttle.FailClosed))
		defer closed.Close()
		assert.ErrorContains(t, closed.Acquire(ctx, time.Second), "FailClosed refuses every call until it answers")
	})
}

// safeBuffer is a bytes.Buffer that a logger may write from several
// goroutines.
type safeBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *safeBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fallbackOf returns what b reports to the failure policy: its limit, its
// interval and the live instances it last counted.
func fallbackOf(t *testing.T, b throttle.Bucket) (int64, time.Duration, int64) {
	t.Helper()
	f, ok := throttle.BucketAs[throttle.Fallbacker](b)
	require.True(t, ok, "the bucket reports its limit and live instances")
	return f.Fallback()
}
