package throttle

import (
	"errors"
	"fmt"
)

var (
	// ErrTimeout is returned by Acquire when no permit can be had within
	// the wait the caller allowed: maxWait, or the context's deadline if
	// that comes first. When the bucket can tell in advance that the
	// permit comes too late, Acquire returns ErrTimeout at once rather than
	// sleeping in vain. If the context's deadline was the bound, the error
	// also matches context.DeadlineExceeded.
	ErrTimeout = errors.New("throttle: no permit within the allowed wait")

	// ErrExceedsLimit is returned when a call asks for more permits than
	// the bucket can ever grant at once (n above its limit or burst).
	// Waiting would never help: split the call or raise the limit.
	ErrExceedsLimit = errors.New("throttle: more permits asked than the bucket can ever grant")

	// ErrInvalid is wrapped by every error about a bad argument or a bad
	// configuration. The message names the field and the value.
	ErrInvalid = errors.New("invalid argument")

	// ErrInvalidKey is wrapped by the error of a call whose per-call key
	// (a tenant's, given to [Limiter.Key]) the bucket cannot store: too
	// long, say. It is that call's problem, not the configuration's:
	// other keys work. It also matches [ErrInvalid]; test for it first to
	// tell the two apart.
	ErrInvalidKey = fmt.Errorf("invalid key: %w", ErrInvalid)
)

// BackendError reports that a bucket's store (Redis) failed. It wraps the
// store's error, so errors.Is(err, context.DeadlineExceeded) and the like
// still work through it.
type BackendError struct {
	// Op is what the bucket was doing: "take", "refill", "pause", ...
	Op string
	// Key is the store key involved, if any.
	Key string
	// Err is the underlying error.
	Err error
}

// Error implements error.
func (e *BackendError) Error() string {
	if e.Key != "" {
		return fmt.Sprintf("throttle: bucket store %s %q: %v", e.Op, e.Key, e.Err)
	}
	return fmt.Sprintf("throttle: bucket store %s: %v", e.Op, e.Err)
}

// Unwrap returns the underlying error.
func (e *BackendError) Unwrap() error { return e.Err }

// invalid returns an error that wraps [ErrInvalid] and names the bad field,
// its value and what is expected, for example:
//
//	throttle: NewLocal: limit = 0: invalid argument: must be at least 1
//
// Package internal/errs has the same for the module's other packages.
func invalid(pkg, field string, value any, want string) error {
	return fmt.Errorf("%s: %s = %v: %w: %s", pkg, field, value, ErrInvalid, want)
}
