package consumer

import (
	"cmp"
	"slices"
	"time"
)

// Stats is a snapshot of a [Consumer]'s work, from [Consumer.Stats].
// Counters run from the start of Run; gauges are read at the call.
type Stats struct {
	// Handled counts records whose handler returned nil.
	Handled int64
	// Retried counts attempts after a record's first (failed handler
	// calls, and permit timeouts under TimeoutFail).
	Retried int64
	// DeadLettered counts records written to the dead-letter topic.
	DeadLettered int64
	// Parked counts records written to the shaping topic (WithShaping).
	Parked int64
	// PermitTimeouts counts waits for a permit that ended without one:
	// the consumer's own (only with a finite WithPermitWait), and handler
	// calls that returned an error matching throttle.ErrTimeout under
	// TimeoutRetry.
	PermitTimeouts int64
	// PermitsStale counts permits not used because their time's margin
	// (throttle.Decision.Margin) had passed: held for want of a worker, or
	// a worker that came late (the record then takes another), and
	// permits passed to a handler that had not used them when the margin
	// passed (counted when the handler returns, whether or not it called
	// later: a call made then takes a permit of its own; a permit given up
	// for a provider's pause counts too when the handler waited out the
	// pause). A count that grows steadily outside pauses says the instance
	// cannot keep up with its permits' times (too few workers for the
	// limiter's pace, a starved process, a handler slow to make its call).
	PermitsStale int64
	// PermitsUnused counts permits the consumer took that no call used:
	// PermitsStale's, and those whose record went away before its call
	// (its partition revoked, the consumer stopping, the record parked),
	// or whose handler returned without using it (a call cut by a
	// revocation, a handler that made no call through the Limiter, a
	// Transport or an Acquire that gave it up for a provider's pause).
	// Each counts at the bucket as a call does, and the provider never
	// sees it: the permits a Limiter's Observer counts are the calls made
	// through it plus these.
	PermitsUnused int64
	// LimiterErrors counts failures of the limiter's store (a Redis
	// error), after which the partition backed off and asked again.
	LimiterErrors int64
	// Refused counts records the limiter or the concurrency cap refused
	// for their own key or cost (errors matching throttle.ErrInvalidKey
	// or throttle.ErrExceedsLimit): each failed at once, without retries,
	// and went to the dead-letter topic. A count that grows with every
	// record says the budgets WithLimiterFor chooses are wrong.
	Refused int64
	// Restored counts records finished as they came, not handled,
	// because the last commit's offset map said an earlier owner had
	// finished them (see WithQueueSize).
	Restored int64
	// PermitWait is the total time partitions have spent waiting for
	// permits.
	PermitWait time.Duration

	// Waiting is how many partitions have a record waiting for a permit
	// now; with WithFairness, queued for its tenant's turn too.
	Waiting int
	// WaitingRecords is how many records wait for a permit now; with
	// WithFairness, the records queued for their tenant's turn too.
	WaitingRecords int
	// InFlight is how many handler calls are running now.
	InFlight int
	// Active is how many records hold one of the WithMaxInFlight workers
	// now: waiting for a permit, in a handler call, between retries or
	// being dead-lettered.
	Active int
	// PeakInFlight is the most handler calls that ran at once since Run
	// started: at most WithMaxInFlight.
	PeakInFlight int
	// Buffered is how many records the consumer holds now: queued, in
	// work, or finished behind an unfinished record of their partition
	// (not yet committable). Records still inside the Kafka client are
	// not counted.
	Buffered int
	// BufferedBytes is what the records the consumer holds count for (see
	// WithQueueBytes): a finished record behind an unfinished one, 16
	// bytes.
	BufferedBytes int64
	// PeakBuffered is the most records one partition has held at once
	// since Run started, and PeakBufferedBytes the most bytes (see the
	// bounds in the package documentation).
	PeakBuffered      int
	PeakBufferedBytes int64
	// Partitions describes each partition the consumer owns now, sorted by
	// topic and partition.
	Partitions []PartitionStats
}

// PartitionStats describes one owned partition in [Stats].
type PartitionStats struct {
	Topic     string
	Partition int32
	// Buffered is how many of the partition's records the consumer holds,
	// and BufferedBytes what they count for (see WithQueueBytes).
	Buffered      int
	BufferedBytes int64
	// Waiting reports whether a record of the partition waits for a
	// permit.
	Waiting bool
	// Paused reports whether the partition's fetches are paused because
	// its queue is full.
	Paused bool
}

// Stats returns a snapshot of the consumer's counters and gauges. It is
// cheap enough to call every few milliseconds, and may be called before,
// during and after Run.
func (c *Consumer) Stats() Stats {
	s := Stats{
		Handled:           c.handled.Load(),
		Retried:           c.retried.Load(),
		DeadLettered:      c.deadLettered.Load(),
		Parked:            c.parked.Load(),
		PermitTimeouts:    c.permitTimeouts.Load(),
		PermitsStale:      c.permitsStale.Load(),
		PermitsUnused:     c.permitsUnused.Load(),
		LimiterErrors:     c.limiterErrors.Load(),
		Refused:           c.refused.Load(),
		Restored:          c.restoredSkips.Load(),
		PermitWait:        time.Duration(c.permitWait.Load()),
		WaitingRecords:    int(c.waitingRecords.Load()),
		InFlight:          int(c.inFlight.Load()),
		Active:            int(c.active.Load()),
		PeakInFlight:      int(c.peakInFlight.Load()),
		PeakBuffered:      int(c.peakBuffered.Load()),
		PeakBufferedBytes: c.peakBufferedBytes.Load(),
	}
	c.mu.Lock()
	s.Partitions = make([]PartitionStats, 0, len(c.parts))
	for _, p := range c.parts {
		p.mu.Lock()
		ps := PartitionStats{
			Topic:         p.topic,
			Partition:     p.id,
			Buffered:      p.span.len(),
			BufferedBytes: p.bytes,
			Waiting:       p.waiting.Load() > 0,
			Paused:        p.paused,
		}
		p.mu.Unlock()
		s.Partitions = append(s.Partitions, ps)
		s.Buffered += ps.Buffered
		s.BufferedBytes += ps.BufferedBytes
		if ps.Waiting {
			s.Waiting++
		}
	}
	c.mu.Unlock()
	slices.SortFunc(s.Partitions, func(a, b PartitionStats) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return s
}
