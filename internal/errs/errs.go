// Package errs builds the configuration errors of headway's packages, so
// that every refusal of a bad argument reads the same way and matches
// throttle.ErrInvalid.
package errs

import (
	"fmt"

	"github.com/headway-go/headway/throttle"
)

// Invalid returns an error that wraps [throttle.ErrInvalid] and names the
// bad field, its value and what is expected, for example:
//
//	bucket: limit = 0: invalid argument: must be at least 1
func Invalid(pkg, field string, value any, want string) error {
	return fmt.Errorf("%s: %s = %v: %w: %s", pkg, field, value, throttle.ErrInvalid, want)
}

// InvalidKey returns an error that wraps [throttle.ErrInvalidKey] (and so
// [throttle.ErrInvalid]) for a per-call key the store cannot hold, for
// example:
//
//	bucket: TokenBucket: key = "aaaa"… (513 bytes): invalid key: invalid argument: must be at most 512 bytes
func InvalidKey(pkg string, value any, want string) error {
	return fmt.Errorf("%s: key = %v: %w: %s", pkg, value, throttle.ErrInvalidKey, want)
}
