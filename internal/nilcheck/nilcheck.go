// Package nilcheck tells whether a value handed to this module as an
// interface is nil underneath.
package nilcheck

import "reflect"

// IsNil reports whether v, a value handed to this module as an interface
// (a throttle.Bucket, a throttle.Slots), is nil or holds a nil pointer,
// map, slice, function or channel: a *bucket.TokenBucket left nil by a
// constructor whose error was not checked is no bucket either, and
// calling it would panic far from the mistake.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return r.IsNil()
	}
	return false
}
