// Package consumer calls a [Handler], func(ctx context.Context, rec
// *kgo.Record) error, for each Kafka record once a [throttle.Limiter]
// allows it; most callers give the handler's HTTP client the same Limiter:
//
//	lim := throttle.New(b) // b: a bucket the fleet shares, from package bucket
//	tr, err := httpclient.NewTransport(lim)
//	if err != nil { ... }
//	client := &http.Client{Transport: tr}
//	handle := func(ctx context.Context, rec *kgo.Record) error {
//		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(rec.Value))
//		if err != nil {
//			return err
//		}
//		resp, err := client.Do(req) // uses the permit the consumer took for this attempt
//		if err != nil {
//			return err // retried (WithRetry), then dead-lettered
//		}
//		defer resp.Body.Close()
//		...
//	}
//	c, err := consumer.New(handle, lim,
//		consumer.WithKafka(
//			kgo.SeedBrokers("localhost:9092"),
//			kgo.ConsumerGroup("mailer"),
//			kgo.ConsumeTopics("outbox"),
//		),
//		consumer.WithDeadLetter("outbox.dlt"),
//		consumer.WithShaping("outbox.shaping", time.Second), // with per-key budgets (WithLimiterFor)
//	)
//	if err != nil { ... }
//	err = c.Run(ctx) // until ctx ends
//
// The handler's ctx holds the attempt's permit
// ([throttle.Keyed.ContextWithPermit]): a Transport of throttle/httpclient
// on the same Limiter uses it for the attempt's first request, made with
// that ctx, instead of taking a second one. With a nil Limiter the
// consumer takes none (the Transport does).
//
// # Guarantees
//
//   - At least once: a record's offset is committed only once it and every
//     record before it in its partition were handled, dead-lettered or
//     parked (the watermark), so every record is handled at least once,
//     across rebalances, crashes and restarts.
//   - Order ([WithOrdering]): by default, records with the same key are
//     handled one at a time, in offset order, retries included; keys and
//     partitions run concurrently. A parked key keeps its order (see
//     [WithShaping]).
//   - A permit per attempt: the handler is never called without one; a
//     retry takes a new one.
//   - Never a silent drop: a record whose attempts all failed (an error or
//     a panic) goes to the dead-letter topic ([WithDeadLetter]), without
//     its value if that cannot go, or stops the consumer, and then Run
//     returns a [*HandlerError] and nothing from that record on is
//     committed. A record whose own key or cost the limiter or the
//     concurrency cap refuses fails so at once (see [Consumer.Run]): one
//     odd record never stops the consumer when a dead-letter topic is
//     set.
//
// # Fair share among tenants
//
// By default, records take the limiter's permits in the order workers
// reach them, so one tenant's backlog is every other tenant's wait.
// [WithFairness] makes an instance hand each permit, when it comes, to
// the next record of the tenant whose turn it is (weighted, with urgent
// records first within a share of the limit, and with [UrgentReserve]
// on a part of the limit of their own); see it for what holds within an
// instance and across a group.
//
// # Bounds
//
// Held per partition: at most [WithQueueSize] records (4096) and
// [WithQueueBytes] bytes (1 MiB; an unfinished record counts its key,
// value and headers and [RecordOverhead], a finished one behind it 16
// bytes: the consumer keeps its offset, not the record), then fetching
// pauses until it holds half of both; plus what one poll brings: by default what
// the client fetched for the partition, at most kgo.FetchMaxPartitionBytes
// of records (lowered to a quarter of the queue bytes) or one record batch
// if larger; with [WithPollSize], at most that many records. The consumer
// copies each record, so this is what it keeps in memory, not the fetched
// batches; the client itself buffers at most one fetch response per
// broker (kgo.FetchMaxBytes).
//
// In flight: at most [WithMaxInFlight] records per instance (128) between
// being taken by a worker and being finished: waiting for a permit, in a
// handler call, between retries, or being written to Kafka (a record
// being parked takes its key's queued records along in the same write).
//
// How long one key holds its partition (its unfinished record keeps the
// watermark, and the records behind it stay held): with [WithShaping],
// at most its bound plus one handler call ([WithHandlerTimeout]) and one
// write to the shaping topic, from when a worker takes the first of a run
// of its records; the instance's in-flight bound may delay that first
// take, for every key alike. Without it, as long as its records wait for
// permits ([WithPermitWait], throttle.Forever by default) and retries; the
// partition then stops at its queue bound. Records parked in the shaping
// topic wait there in place, without a bound.
//
// Redelivery after a crash: the next owner of a partition handles again
// the records from the last committed offset on: those the dead member
// held (the bound above) and those that passed the watermark since its
// last commit (marked every 50 ms, committed every kgo.AutoCommitInterval,
// 5 s by default); records it had parked but not committed are parked
// again. A revocation or shutdown commits the watermark first, with the
// offsets finished past it in the commit's metadata (at most 4,000 bytes
// of ranges; what does not fit is handled again): the next owner does not
// handle those again. A map that does not parse, is not for the committed
// offset, or names offsets at or past the partition's end when the next
// owner reads it (no owner can have finished a record not yet written)
// is ignored with a warning: any client may commit for the group, and at
// least once holds whatever it wrote.
//
// # Revocation and shutdown
//
// When a partition is revoked, its permit waits and retry delays end at
// once; its handler calls and Kafka writes in flight may finish within
// the handler timeout; its watermark is committed, and only then does the
// rebalance go on. A call still running at the timeout has its context
// cancelled and is abandoned: its record is never committed, and a later
// ownership of the partition starts only once it has returned, so calls for
// one key never overlap. When Run's ctx ends, every partition is stopped
// so, the watermarks committed, the group left, and Run returns after every
// goroutine it started (handler calls included) has returned.
//
// The consumer builds its own kgo client with kgo.BlockRebalanceOnPoll and
// its own partition callbacks; a rebalance waits only for handler calls,
// Kafka writes and one commit, so the handler timeout must be at most half
// the group's rebalance timeout (New checks). A handler may call
// [Consumer.Stats] and cancel Run's ctx, but must not wait for Run to
// return. A new group starts at the oldest record
// (kgo.ConsumeResetOffset, which WithKafka may override).
package consumer
