package consumer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/consumer"
	"github.com/headway-go/headway/internal/kafkaenv"
	"github.com/headway-go/headway/throttle"
)

// TestHandlerAnswerAdaptsTheLimiter: a handler whose provider refused a
// call without a retry time returns the answer in its error; the record's
// limiter lowers its adaptive rate, and the record is retried and handled.
func TestHandlerAnswerAdaptsTheLimiter(t *testing.T) {
	t.Parallel()
	kc := kafkaenv.New(t, kafkaenv.Topic("in", 1))
	produce(t, kc, "in", 1, 5, func(_ int32, i int) string { return "k" })

	h := newHandled(5)
	var refused atomic.Bool
	handler := func(ctx context.Context, rec *kgo.Record) error {
		if refused.CompareAndSwap(false, true) {
			return &throttle.AnswerError{Answer: throttle.Answer{Refused: true}, Err: errTest}
		}
		return h.handler("a")(ctx, rec)
	}
	lim := limiter(t, 100, time.Second)
	c, err := consumer.New(handler, lim, append(base(kc, "g", "in"),
		consumer.WithRetry(3, time.Millisecond, 4*time.Millisecond))...)
	require.NoError(t, err)
	r := start(t, c)
	h.waitFull(t, 10*time.Second)
	require.NoError(t, r.stop(t))

	s, err := lim.Key("").AdaptiveState(context.Background())
	require.NoError(t, err)
	assert.InDelta(t, 90, s.Rate, 1e-9, "the refusal the handler carried lowered the rate")
	assert.EqualValues(t, 1, c.Stats().Retried)
}
