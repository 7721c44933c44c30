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

// InvalidKey returns the error for a key passed to a call (not to a
// constructor) that the bucket refuses: [Invalid]'s error for field "key",
// which also matches [throttle.ErrKeyRefused], with the same text.
func InvalidKey(pkg string, value any, want string) error {
	return keyRefused{Invalid(pkg, "key", value, want)}
}

// keyRefused marks a configuration-style error as the fault of one key.
type keyRefused struct{ error }

func (e keyRefused) Unwrap() error { return e.error }

func (e keyRefused) Is(target error) bool { return target == throttle.ErrKeyRefused }
