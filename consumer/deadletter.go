package consumer

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// producer writes the consumer's own records (dead letters, parked
// records). normal is a kgo client built from the user's options without
// the consumer and group ones; large, for a record normal refuses as too
// large, takes a record as large as a request to a broker may be
// (kgo.BrokerMaxWriteBytes, 100 MiB by default) and holds one at a time, so that a large record never shares a batch (and its fate)
// with another. The broker checks the compressed batch against the
// topic's max.message.bytes.
type producer struct {
	normal, large *kgo.Client
	// small is the largest record the normal client surely takes into a
	// batch (recordSize): what kgo checks against ProducerBatchMaxBytes,
	// less the batch's own header.
	small int
}

// largeHeadroom is what the large client leaves of kgo.BrokerMaxWriteBytes
// for the produce request around its one record's batch.
const largeHeadroom = 64 << 10

// newProducer builds the producer from the user's Kafka options.
func (c *Consumer) newProducer() (*producer, error) {
	base := c.producerBase()
	normal, err := kgo.NewClient(base...)
	if err != nil {
		return nil, fmt.Errorf("consumer: building the producer from WithKafka: %w", err)
	}
	if c.cfg.shaping != "" {
		def, _ := normal.OptValue(kgo.RecordPartitioner).(kgo.Partitioner)
		if def == nil {
			def = kgo.StickyKeyPartitioner(nil)
		}
		base = append(base, kgo.RecordPartitioner(shapingPartitioner{topic: c.cfg.shaping, ordering: c.cfg.ordering, def: def}))
		normal.Close()
		if normal, err = kgo.NewClient(base...); err != nil {
			return nil, fmt.Errorf("consumer: building the producer from WithKafka: %w", err)
		}
	}
	writeMax, _ := asInt(normal.OptValue(kgo.BrokerMaxWriteBytes))
	most := int32(min(max(writeMax-largeHeadroom, 1<<20), math.MaxInt32)) // room for the request around the batch
	large, err := kgo.NewClient(append(base, kgo.ProducerBatchMaxBytes(most), kgo.MaxBufferedRecords(1))...)
	if err != nil {
		normal.Close()
		return nil, fmt.Errorf("consumer: building the producer from WithKafka: %w", err)
	}
	batch, ok := asInt(normal.OptValue(kgo.ProducerBatchMaxBytes))
	if !ok {
		batch = 0 // unread: every record goes through the large client, one at a time
	}
	return &producer{normal: normal, large: large, small: int(batch) - 128}, nil
}

// producerBase returns the user's Kafka options without the consumer and
// group ones.
func (c *Consumer) producerBase() []kgo.Opt {
	var base []kgo.Opt
	for _, o := range c.cfg.kafka {
		switch o.(type) {
		case kgo.ConsumerOpt, kgo.GroupOpt:
			continue
		}
		base = append(base, o)
	}
	return base
}

// close fails the writes still waiting and closes the clients.
func (pr *producer) close() {
	if pr != nil {
		pr.normal.Close()
		pr.large.Close()
	}
}

// tooLarge reports whether err says a record (or its batch) is too large
// for the client or the broker.
func tooLarge(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge)
}

// write produces r and waits for the broker's answer: through the normal
// client, then, if that says r is too large, alone through the large one.
//
// The write's context is the consumer's, not the partition's, and has no
// deadline of its own: kgo fails a whole produce batch when its first
// record's context ends, and records of several partitions share batches,
// so a context that one partition's revocation (or a per-write timeout)
// could end would fail the other partitions' writes. A write ends when the
// broker answers, kgo's own delivery limits give up
// (kgo.RecordDeliveryTimeout, kgo.RecordRetries), or the producer closes
// at the end of Run. A revoked partition waits for its writes like for a
// handler call, and abandons them at the handler timeout (their records
// are then never committed).
func (c *Consumer) write(r *kgo.Record) error {
	err := c.prod.normal.ProduceSync(c.base, r).FirstErr()
	if tooLarge(err) {
		err = c.prod.large.ProduceSync(c.base, r).FirstErr()
	}
	return err
}

// exhausted deals with a record whose every attempt failed: to the
// dead-letter topic, or stop the consumer.
func (p *partition) exhausted(rec *kgo.Record, attempts int, lastErr error) bool {
	c := p.c
	herr := &HandlerError{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Attempts: attempts, Err: lastErr}
	if c.cfg.deadLetter == "" {
		c.fail(herr)
		return false
	}
	dropped, err := c.deadLetter(rec, attempts, lastErr)
	if err != nil {
		if p.soft.Err() != nil {
			return false
		}
		c.fail(fmt.Errorf("consumer: dead-lettering record %s[%d]@%d to %s: %w (record error: %w)", rec.Topic, rec.Partition, rec.Offset, c.cfg.deadLetter, err, lastErr))
		return false
	}
	c.deadLettered.Add(1)
	attrs := []any{"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "to", c.cfg.deadLetter, "attempts", attempts, "err", lastErr}
	if dropped != "" {
		attrs = append(attrs, "dropped", dropped)
	}
	c.log.Warn("consumer: record dead-lettered", attrs...)
	return true
}

// deadLetter writes the dead-letter copy of rec, and when it is too large
// to go, one without the value and the original headers, then one
// without the key too; it returns what was left out.
func (c *Consumer) deadLetter(rec *kgo.Record, attempts int, lastErr error) (dropped string, err error) {
	for _, leave := range [][]string{nil, {"value", "headers"}, {"value", "headers", "key"}} {
		dropped = strings.Join(leave, ",")
		err = c.write(deadLetterRecord(c.cfg.deadLetter, rec, attempts, lastErr, dropped))
		if !tooLarge(err) {
			return dropped, err
		}
	}
	return dropped, err
}

// deadLetterRecord builds the dead-letter copy of rec, without what
// dropped names ("value", "headers", "key", comma-separated).
func deadLetterRecord(topic string, rec *kgo.Record, attempts int, lastErr error, dropped string) *kgo.Record {
	dl := &kgo.Record{Topic: topic, Timestamp: rec.Timestamp}
	headers := make([]kgo.RecordHeader, 0, len(rec.Headers)+6)
	if !strings.Contains(dropped, "headers") {
		headers = append(headers, rec.Headers...)
	}
	if !strings.Contains(dropped, "value") {
		dl.Value = rec.Value
	}
	if !strings.Contains(dropped, "key") {
		dl.Key = rec.Key
	}
	headers = append(headers,
		kgo.RecordHeader{Key: HeaderTopic, Value: []byte(rec.Topic)},
		kgo.RecordHeader{Key: HeaderPartition, Value: strconv.AppendInt(nil, int64(rec.Partition), 10)},
		kgo.RecordHeader{Key: HeaderOffset, Value: strconv.AppendInt(nil, rec.Offset, 10)},
		kgo.RecordHeader{Key: HeaderError, Value: errorText(lastErr)},
		kgo.RecordHeader{Key: HeaderAttempts, Value: strconv.AppendInt(nil, int64(attempts), 10)},
	)
	if dropped != "" {
		headers = append(headers, kgo.RecordHeader{Key: HeaderDropped, Value: []byte(dropped)})
	}
	dl.Headers = headers
	return dl
}
