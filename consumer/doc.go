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
// their partition. Each partition hands records whose turn has come (see
// Ordering below) to workers, each holding one of the instance's in-flight
// slots ([WithMaxInFlight], default 128): a worker waits for a permit
// ([throttle.Keyed.Acquire], by default with [throttle.Forever]), calls the
// [Handler], retries under [WithRetry], and finishes the record when the
// handler has returned nil or the record went to the dead-letter topic.
// Many records of one partition are in flight at once, so a fleet reaches
// its limit even when each call takes long: 500 calls/s at 100 ms each
// need about 50 calls in flight across the fleet.
//
// Offsets are committed by watermark: per partition, only up to the first
// record not yet finished. A record finished out of order waits, in
// memory, until every record before it has finished; then the whole run
// is marked at once. Marked offsets are committed by kgo's autocommit
// (every 5 s by default), on every revocation and at shutdown; nothing
// unfinished, and nothing behind an unfinished record, is ever committed.
//
// # Ordering
//
// [WithOrdering] says which records must not overlap:
//
//   - [ByKey] (the default): records with the same Kafka key are handled
//     one at a time, in offset order, retries included; different keys
//     run concurrently. Records without a key share one key. This is what
//     a pipeline that calls an API per entity usually wants: per-entity
//     order, concurrency across entities.
//   - [ByPartition]: a partition's records one at a time, in offset order
//     (at most one record per call latency per partition).
//   - [Unordered]: any records concurrently.
//
// A record whose attempt failed keeps its place: under ByKey it holds
// back only the later records of its key, and the partition goes on with
// other keys. Since nothing after it is committed, the records behind it
// stay buffered: once the partition holds [WithQueueSize] records, its
// fetching is paused (see Bounds) and the partition waits for it.
//
// # Guarantees
//
//   - At least once: a record's offset is committed only after it and
//     every record before it in its partition succeeded or were
//     dead-lettered, so every record is handled (or dead-lettered) at
//     least once, across rebalances, crashes and restarts.
//   - Redelivery is bounded: after a crash or a lost session, the next
//     owner of a partition handles again only the records from its last
//     committed watermark on: the records the dead member held (at most
//     queue size + poll size, 512 by default, finished or not) plus those
//     that passed the watermark since its last commit (at most one
//     autocommit interval's worth). A clean revocation or shutdown
//     commits the watermark first, so only the records not finished by
//     then (and those behind them) are handled again.
//   - Order: as the Ordering says, per key, per partition or none;
//     partitions never wait for each other.
//   - A permit per attempt: the handler is never called without a permit
//     of its own; a retry takes a new permit.
//   - Never a silent drop: a record whose every attempt failed goes to the
//     dead-letter topic ([WithDeadLetter]) or stops the consumer, and then
//     [Consumer.Run] returns a [*HandlerError] and neither the record nor
//     anything after it in its partition is committed.
//
// # Bounds
//
// In flight: at most [WithMaxInFlight] records per instance (128 by
// default) hold a slot at once: waiting for a permit, in a handler call,
// between retries, or being dead-lettered; see Stats.Active and
// Stats.PeakInFlight.
//
// Buffered: a partition that holds [WithQueueSize] records (default 256:
// queued, in flight, or finished behind an unfinished one) has its fetches
// paused until it holds half as many; while paused, none of its records
// are polled, and what the client had already fetched for it is dropped
// and fetched again later. Since one poll takes at most [WithPollSize]
// records (default 256), the consumer holds at most
//
//	queue size + poll size records per partition (512 by default),
//
// see Stats.PeakBuffered. Besides these, the Kafka client buffers at most
// one fetch response per broker, each at most kgo.FetchMaxBytes (50 MiB by
// default) and per partition at most kgo.FetchMaxPartitionBytes (1 MiB by
// default) or one record batch if that is larger; lower those through
// [WithKafka] to bound memory in bytes.
//
// # Revocation and shutdown
//
// When a partition is revoked in a rebalance, its permit waits and retry
// delays end at once; its handler calls and dead-letter writes in flight
// are allowed to finish, within the handler timeout
// ([WithHandlerTimeout], default 10 s); its queued records are dropped
// (they are not committed, so the next owner reads them); and its
// watermark is committed before the rebalance goes on. Calls still
// running at the timeout have their context cancelled and are abandoned:
// their records are never committed, and the partition, if it comes back
// to this member, starts only once they have returned, so calls for one
// key never overlap, however many rebalances happen meanwhile. A lost
// partition (the group session ended without a rebalance) is stopped the
// same way but not committed, since a commit can no longer succeed.
//
// When Run's context ends, every partition is stopped as if revoked, the
// watermarks are committed, the group is left, and Run returns after the
// last goroutine it started, handler calls included, has returned. A
// rebalance that arrives during this shutdown waits, like any other, for
// the revoked partitions' calls (or abandons them at the timeout) before
// it hands them on.
//
// # Callbacks and deadlocks
//
// The consumer builds its own kgo client, with kgo.BlockRebalanceOnPoll
// and its own OnPartitionsAssigned, OnPartitionsRevoked and
// OnPartitionsLost callbacks. Its poll loop never blocks between a poll and
// kgo's AllowRebalance, so rebalances are never held up by it; a rebalance
// waits only for in-flight handler calls (and dead-letter writes) and one
// commit. Hence the handler
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
