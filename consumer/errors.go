package consumer

import (
	"fmt"
)

// Headers added to a dead-letter record (see [WithDeadLetter]). Numbers are
// written in decimal.
const (
	// HeaderTopic is the topic the record was consumed from.
	HeaderTopic = "headway-topic"
	// HeaderPartition is the partition the record was consumed from.
	HeaderPartition = "headway-partition"
	// HeaderOffset is the record's offset in that partition.
	HeaderOffset = "headway-offset"
	// HeaderError is the text of the last attempt's error.
	HeaderError = "headway-error"
	// HeaderAttempts is how many attempts were made.
	HeaderAttempts = "headway-attempts"
)

// HandlerError reports a record whose every attempt failed, when no
// dead-letter topic is set: [Consumer.Run] returns it, and the record's
// offset is not committed, so the record is consumed again after a
// restart. errors.Is and errors.As see the last attempt's error through it.
type HandlerError struct {
	// Topic, Partition and Offset locate the record.
	Topic     string
	Partition int32
	Offset    int64
	// Attempts is how many attempts were made.
	Attempts int
	// Err is the last attempt's error: the handler's, or a
	// [throttle.ErrTimeout] under [TimeoutFail].
	Err error
}

// Error implements error.
func (e *HandlerError) Error() string {
	return fmt.Sprintf("consumer: record %s[%d]@%d failed %d attempt(s): %v", e.Topic, e.Partition, e.Offset, e.Attempts, e.Err)
}

// Unwrap returns the last attempt's error.
func (e *HandlerError) Unwrap() error { return e.Err }
