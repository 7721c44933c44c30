package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/throttle"
)

// The retry delays double from base up to max and stay there, however many
// retries: the doubling never overflows into a negative (at once) delay,
// even with the largest max a user may give.
func TestRetryDelayNeverOverflows(t *testing.T) {
	c, err := New(func(context.Context, *kgo.Record) error { return nil }, nil,
		WithKafka(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t")),
		WithRetry(1000, time.Nanosecond, maxRetryDelay))
	require.NoError(t, err)
	prev := time.Duration(0)
	for n := 1; n <= 1000; n++ {
		d := c.backoff(n)
		require.Positive(t, d, "retry %d", n)
		require.GreaterOrEqual(t, d, prev, "retry %d: delays never shrink", n)
		require.LessOrEqual(t, d, maxRetryDelay, "retry %d", n)
		prev = d
	}
	assert.Equal(t, maxRetryDelay, c.backoff(1000))
	assert.Equal(t, time.Nanosecond, c.backoff(1))
	assert.Equal(t, 2*time.Nanosecond, c.backoff(2))
}

// The delay before asking the limiter again after its store failed (or a
// permit wait timed out) grows like the retry delays but never beyond
// maxPermitDelay, so a long outage of the store is noticed to have ended
// within that, whatever the retry delays are.
func TestDelayAfterLimiterFailuresIsCapped(t *testing.T) {
	c, err := New(func(context.Context, *kgo.Record) error { return nil }, nil,
		WithKafka(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t")),
		WithRetry(3, time.Second, time.Hour))
	require.NoError(t, err)
	for _, n := range []int{1, 2, 3, 10, 100, 1 << 20, int(^uint(0) >> 1)} {
		d := c.permitBackoff(n)
		assert.Positive(t, d, "after %d failures", n)
		assert.LessOrEqual(t, d, maxPermitDelay, "after %d failures", n)
	}
	assert.Equal(t, time.Second, c.permitBackoff(1))
	assert.Equal(t, maxPermitDelay, c.permitBackoff(100))
	_ = throttle.Forever
}
