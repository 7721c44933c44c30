package consumer

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const (
	// idleFirst is when Run first checks that it owns a partition, and
	// idleMax the longest time between two checks.
	idleFirst = 5 * time.Second
	idleMax   = 5 * time.Minute
	// idleAssign is how long a consumer may own no partition, with its
	// brokers answering, before it warns.
	idleAssign = 10 * time.Second
)

// watchIdle warns, with growing intervals, while the consumer owns no
// partition: that no broker answers, or that none is assigned (naming the
// topics that do not exist). It returns when ctx ends.
func (c *Consumer) watchIdle(ctx context.Context, cl *kgo.Client) {
	first, most := c.cfg.idleFirst, max(c.cfg.idleFirst, idleMax)
	delay := first
	since := time.Now()
	for sleepCtx(ctx, delay) {
		c.mu.Lock()
		owned := len(c.parts)
		c.mu.Unlock()
		if owned > 0 {
			delay, since = first, time.Now()
		} else {
			c.explainIdle(ctx, cl, time.Since(since))
			delay = min(2*delay, most)
		}
	}
}

// explainIdle logs why the consumer has owned no partition for idle.
func (c *Consumer) explainIdle(ctx context.Context, cl *kgo.Client, idle time.Duration) {
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	seeds := cl.OptValue(kgo.SeedBrokers)
	if err := cl.Ping(pctx); err != nil {
		if ctx.Err() == nil {
			c.log.Warn("consumer: no Kafka broker answers; nothing is consumed", "brokers", seeds, "for", idle.Round(time.Second), "err", err)
		}
		return
	}
	if idle < c.cfg.idleAssign {
		return
	}
	group := cl.OptValue(kgo.ConsumerGroup)
	names, _ := asStrings(cl.OptValue(kgo.ConsumeTopics))
	if regex, ok := asBool(cl.OptValue(kgo.ConsumeRegex)); ok && !regex {
		if missing := missingTopics(pctx, cl, names); len(missing) > 0 {
			c.log.Warn("consumer: topics to consume do not exist; nothing is consumed", "missing", missing, "group", group, "for", idle.Round(time.Second))
			return
		}
	}
	c.log.Warn("consumer: no partition assigned; nothing is consumed (more members than partitions, or the group is rebalancing)",
		"group", group, "topics", names, "for", idle.Round(time.Second))
}

// missingTopics returns those of topics the cluster does not know, or
// nil when it cannot tell.
func missingTopics(ctx context.Context, cl *kgo.Client, topics []string) []string {
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false
	for _, t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil
	}
	var missing []string
	for _, t := range resp.Topics {
		if t.Topic != nil && t.ErrorCode == kerr.UnknownTopicOrPartition.Code {
			missing = append(missing, *t.Topic)
		}
	}
	return missing
}
