// Package consumer consumes Kafka records (franz-go) as a consumer-group
// member and handles each one only once a permit from a
// [throttle.Limiter] allows it, so that a fleet of workers stays under a
// provider's rate limit.
//
//	c, err := consumer.New(handle, lim,
//		consumer.WithKafka(
//			kgo.SeedBrokers("localhost:9092"),
//			kgo.ConsumerGroup("mailer"),
//			kgo.ConsumeTopics("outbox"),
//		),
//		consumer.WithDeadLetter("outbox.dlt"),
//	)
//	if err != nil { ... }
//	err = c.Run(ctx) // until ctx ends
//
// # How records flow
//
// One poll loop takes records from the Kafka client and queues them on
// their partition; one goroutine per assigned partition takes them in
// order, waits for a permit ([throttle.Keyed.Acquire], by default with
// [throttle.Forever]), calls the [Handler], and marks the record for
// commit once the handler has returned nil (or the record went to the
// dead-letter topic). Marked offsets are committed by kgo's autocommit
// (every 5 s by default), on every revocation and at shutdown; nothing
// unmarked is ever committed.
//
// # Guarantees
//
//   - At least once: a record's offset is committed only after its handler
//     succeeded or it was dead-lettered, so every record is handled (or
//     dead-lettered) at least once, across rebalances, crashes and
//     restarts. Records are handled twice only when work done is not yet
//     committed when a partition changes hands without a clean revocation
//     (a crash, a lost session, a failed commit, a handler abandoned after
//     the handler timeout).
//   - Order per partition: a partition's records are handled one at a
//     time, in offset order, including retries. Partitions proceed
//     independently: one that waits for permits, retries, or has a slow
//     handler never holds up another.
//   - A permit per attempt: the handler is never called without a permit
//     of its own; a retry takes a new permit.
//   - Never a silent drop: a record whose every attempt failed goes to the
//     dead-letter topic ([WithDeadLetter]) or stops the consumer, and then
//     [Consumer.Run] returns a [*HandlerError] and the record's offset is
//     not committed.
//
// # Bounded buffer
//
// A partition whose queue reaches its size ([WithQueueSize], default 64)
// has its fetches paused until its goroutine has worked the queue down to
// half; while paused, none of its records are polled, and what the client
// had already fetched for it is dropped and fetched again later. Since one
// poll takes at most [WithPollSize] records (default 64), the consumer
// holds at most
//
//	queue size + poll size records per partition (128 by default),
//
// counting the one waiting for a permit or being handled; see
// Stats.PeakBuffered. Besides these, the Kafka client buffers at most one
// fetch response per broker, each at most kgo.FetchMaxBytes (50 MiB by
// default) and per partition at most kgo.FetchMaxPartitionBytes (1 MiB by
// default) or one record batch if that is larger; lower those through
// [WithKafka] to bound memory in bytes.
//
// # Revocation and shutdown
//
// When a partition is revoked in a rebalance, its permit waits and retry
// delays end at once; a handler call in flight is allowed to finish,
// within the handler timeout ([WithHandlerTimeout], default 10 s); the
// partition's goroutine exits, its queued records are dropped (they are not
// committed, so the next owner reads them), and the marked offsets are
// committed before the rebalance goes on. A handler still running at the
// timeout has its context cancelled and is abandoned: its result is never
// committed. A lost partition (the group session ended without a
// rebalance) is stopped the same way but not committed, since a commit can
// no longer succeed.
//
// When Run's context ends, every partition is stopped as if revoked, the
// marked offsets are committed, the group is left, and Run returns after
// the last goroutine it started, handler calls included, has returned.
//
// # Callbacks and deadlocks
//
// The consumer builds its own kgo client, with kgo.BlockRebalanceOnPoll
// and its own OnPartitionsAssigned, OnPartitionsRevoked and
// OnPartitionsLost callbacks. Its poll loop never blocks between a poll and
// kgo's AllowRebalance, so rebalances are never held up by it; a rebalance
// waits only for in-flight handler calls and one commit. Hence the handler
// timeout must be at most half the group's rebalance timeout
// (kgo.RebalanceTimeout, default 60 s), which Run checks: otherwise a
// member with a slow handler would be kicked out of the group. A handler
// may call [Consumer.Stats] and cancel Run's context, but must not wait for
// Run to return: Run waits for it.
//
// Kafka settings worth knowing: the consumer starts a new group at the
// oldest record (kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), which
// WithKafka may override); kgo's defaults of a 3 s heartbeat and a 45 s
// session timeout set how fast a rebalance starts after a member joins or
// dies.
package consumer
