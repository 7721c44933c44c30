package bucket

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// userWrapper is a wrapper a user might write: it counts the calls that
// reach the bucket, and offers Unwrap.
type userWrapper struct {
	throttle.Bucket
	calls atomic.Int64
}

func (c *userWrapper) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	c.calls.Add(1)
	return c.Bucket.Take(ctx, key, n, maxWait)
}

func (c *userWrapper) Unwrap() throttle.Bucket { return c.Bucket }

// TestUserWrapperKeepsTheTokenBucketsCapabilities: through a user's
// counting wrapper, a Limiter over a Redis token bucket still adapts the
// fleet's rate in Redis, pauses the fleet on a retry hint, and under
// FailLocal grants this instance's share while Redis is paused: the
// wrapper hides none of the three.
func TestUserWrapperKeepsTheTokenBucketsCapabilities(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real-time fault test")
	}
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "SIGSTOP")
	ctx := context.Background()
	tb, err := NewTokenBucket(shortClient(t, srv.Addr()), "wrapped", 1000, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	w := &userWrapper{Bucket: tb}
	obs := &degradedObs{}
	lim := throttle.New(w, throttle.WithObserver(obs))
	defer lim.Close()
	if err := lim.Acquire(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := lim.Report(ctx, throttle.Answer{Refused: true}); err != nil {
		t.Fatal(err)
	}
	if s, err := tb.adaptive(ctx, ""); err != nil || !s.Active() {
		t.Errorf("the fleet's adaptive state in Redis: %+v, %v; want active", s, err)
	}
	if err := lim.Key("paused").Report(ctx, throttle.Answer{Refused: true, Retry: true, RetryAfter: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if st, err := tb.State(ctx, "paused"); err != nil || st.Paused <= 0 {
		t.Errorf("the pause in Redis: %+v, %v; want paused", st, err)
	}

	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Resume() }()
	for range 20 {
		_ = lim.Key("other").Acquire(ctx, 200*time.Millisecond)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	waitInflight(t, &tb.common)
	if obs.granted.Load() == 0 {
		t.Errorf("FailLocal granted nothing while Redis was paused (%d refused): the wrapper hid the bucket's share", obs.refused.Load())
	}
	if w.calls.Load() == 0 {
		t.Error("the wrapper saw no call")
	}
}

// embeddingWrapper is the other wrapper a user might write: it embeds the
// bucket's concrete type (to override Take) and has no Unwrap.
type embeddingWrapper struct {
	*TokenBucket
	calls atomic.Int64
}

func (e *embeddingWrapper) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	e.calls.Add(1)
	return e.TokenBucket.Take(ctx, key, n, maxWait)
}

// TestWrapperEmbeddingABucketKeepsItsCapabilities: a wrapper that embeds
// a bucket of this package keeps what the bucket offers the Limiter (its
// methods are promoted through the embedding): a provider's retry hint
// pauses the fleet in Redis, and the adaptive rate is kept there.
func TestWrapperEmbeddingABucketKeepsItsCapabilities(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	tb, err := NewTokenBucket(srv.Client(), "embedded", 1000, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	w := &embeddingWrapper{TokenBucket: tb}
	lim := throttle.New(w)
	defer lim.Close()
	if err := lim.Acquire(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := lim.Report(ctx, throttle.Answer{Refused: true}); err != nil {
		t.Fatal(err)
	}
	if s, err := tb.adaptive(ctx, ""); err != nil || !s.Active() {
		t.Errorf("the fleet's adaptive state in Redis: %+v, %v; want active", s, err)
	}
	if err := lim.Key("paused").Report(ctx, throttle.Answer{Refused: true, Retry: true, RetryAfter: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if st, err := tb.State(ctx, "paused"); err != nil || st.Paused <= 0 {
		t.Errorf("the pause in Redis: %+v, %v; want paused", st, err)
	}
	if w.calls.Load() == 0 {
		t.Error("the wrapper saw no call")
	}
}

// adaptive reads key's adaptive state in one round trip; the zero state
// means the budget is not adapting.
func (c *common) adaptive(ctx context.Context, key string) (throttle.AdaptiveState, error) {
	s, _, err := c.SwapAdaptive(ctx, key, throttle.AdaptiveState{Version: -1}, throttle.AdaptiveState{}, time.Millisecond)
	return s, err
}
