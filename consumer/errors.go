package consumer

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// MaxErrorHeader is the most bytes of [HeaderError] a dead-letter record
// carries: a longer error text (a panic's stack, a provider's answer) is
// cut, and ends with "…".
const MaxErrorHeader = 8 << 10

// Headers added to a dead-letter record (see [WithDeadLetter]). Numbers are
// written in decimal.
const (
	// HeaderTopic is the topic the record was consumed from.
	HeaderTopic = "headway-topic"
	// HeaderPartition is the partition the record was consumed from.
	HeaderPartition = "headway-partition"
	// HeaderOffset is the record's offset in that partition.
	HeaderOffset = "headway-offset"
	// HeaderError is the text of the last attempt's error, and the stack
	// of a panic ([PanicError]); at most [MaxErrorHeader] bytes.
	HeaderError = "headway-error"
	// HeaderAttempts is how many attempts were made.
	HeaderAttempts = "headway-attempts"
	// HeaderDropped, present only when the record as it was could not be
	// written (the topic's max.message.bytes), names what was left out:
	// "value,headers" (the original headers), or "value,headers,key".
	HeaderDropped = "headway-dropped"
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

// PanicError is the error of an attempt whose handler panicked. The panic
// is recovered in the goroutine that called the handler (a panic in a
// goroutine the handler started cannot be), logged with its stack, and the
// attempt is retried and dead-lettered like any failed one.
type PanicError struct {
	// Value is what the handler passed to panic.
	Value any
	// Stack is the stack of the panicking goroutine.
	Stack []byte
}

// Error implements error.
func (e *PanicError) Error() string {
	return fmt.Sprintf("consumer: handler panicked: %v", e.Value)
}

// Unwrap returns Value when it is an error, else nil.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// errorText is the text of err for the dead-letter header: with a panic's
// stack, at most MaxErrorHeader bytes, cut on a UTF-8 boundary.
func errorText(err error) []byte {
	text := err.Error()
	var perr *PanicError
	if errors.As(err, &perr) && len(perr.Stack) > 0 {
		text += "\n\n" + string(perr.Stack)
	}
	if len(text) <= MaxErrorHeader {
		return []byte(text)
	}
	const cut = "…"
	n := MaxErrorHeader - len(cut)
	for n > 0 && !utf8.RuneStart(text[n]) {
		n--
	}
	return []byte(text[:n] + cut)
}
