package consumer

import (
	"context"
	"errors"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/headway-go/headway/throttle"
)

// reportAnswer passes the provider's answer that a handler's error
// carries ([throttle.AnswerError]) to the record's limiter, so that the
// fleet adapts to a provider that refused the call, as it does for calls
// through the Transport of throttle/httpclient: a retry time pauses the bucket for the
// whole fleet, a refusal without one lowers the fleet's adaptive rate.
// The record is then retried as any failed attempt is, and its next
// permit comes at the adapted pace.
func (c *Consumer) reportAnswer(ctx context.Context, rec *kgo.Record, err error) {
	var ae *throttle.AnswerError
	if !errors.As(err, &ae) {
		return
	}
	a := ae.Answer
	k, err := c.limiterOf(rec)
	if err != nil || k.Limiter() == nil {
		return
	}
	if rerr := k.Report(ctx, a); rerr != nil {
		c.log.Warn("consumer: reporting the provider's answer failed", "topic", rec.Topic, "partition", rec.Partition, "err", rerr)
	}
}
