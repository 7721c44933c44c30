package consumer

import (
	"context"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The forms franz-go has returned from OptValue for the options the
// consumer reads back (v1.22.2: the topics as a map; v1.22.3: a slice), and
// forms it might return, are all understood; anything else is reported as
// unread rather than as an empty setting.
func TestOptionReadersAcceptEveryFormFranzGoReturned(t *testing.T) {
	t.Parallel()
	type named string
	for _, tc := range []struct {
		name string
		in   any
		want []string
		ok   bool
	}{
		{"slice (v1.22.3)", []string{"b", "a"}, []string{"b", "a"}, true},
		{"map of regexps (v1.22.2)", map[string]*regexp.Regexp{"b": nil, "a": nil}, []string{"a", "b"}, true},
		{"set", map[string]struct{}{"a": {}}, []string{"a"}, true},
		{"one string", "a", []string{"a"}, true},
		{"named strings", []named{"a"}, []string{"a"}, true},
		{"empty slice", []string{}, []string{}, true},
		{"nil", nil, nil, false},
		{"ints", []int{1}, nil, false},
		{"map by int", map[int]string{1: "a"}, nil, false},
	} {
		got, ok := asStrings(tc.in)
		assert.Equal(t, tc.ok, ok, tc.name)
		assert.Equal(t, tc.want, got, tc.name)
	}

	for _, in := range []any{int32(7), int64(7), 7, uint16(7), 7 * time.Nanosecond} {
		n, ok := asInt(in)
		assert.True(t, ok, "%T", in)
		assert.Equal(t, int64(7), n, "%T", in)
	}
	for _, in := range []any{nil, "7", uint64(1 << 63), 7.0} {
		_, ok := asInt(in)
		assert.False(t, ok, "%T", in)
	}
	if s, ok := asString("g"); assert.True(t, ok) {
		assert.Equal(t, "g", s)
	}
	_, ok := asString(nil)
	assert.False(t, ok)
	if b, ok := asBool(true); assert.True(t, ok) {
		assert.True(t, b)
	}
	_, ok = asBool("true")
	assert.False(t, ok)
}

// A callback option is read back as the function the user gave, also when
// franz-go returns it under a type of its own with the same signature;
// a value of another form is reported, not taken for "no callback".
func TestOptionReadersReadACallbackInAnyFuncTypeOfItsSignature(t *testing.T) {
	t.Parallel()
	type fetchedFn func(context.Context, *kgo.Client, *kmsg.OffsetFetchResponse) error
	errMine := errors.New("mine")
	mine := func(context.Context, *kgo.Client, *kmsg.OffsetFetchResponse) error { return errMine }

	for _, in := range []any{mine, fetchedFn(mine)} {
		fn, ok := asFunc[onFetchedFn](in)
		if assert.True(t, ok, "%T", in) && assert.NotNil(t, fn, "%T", in) {
			assert.ErrorIs(t, fn(context.Background(), nil, nil), errMine)
		}
	}
	for _, in := range []any{nil, onFetchedFn(nil)} {
		fn, ok := asFunc[onFetchedFn](in)
		assert.True(t, ok, "%T", in)
		assert.Nil(t, fn, "%T", in)
	}
	for _, in := range []any{"f", func() {}, struct{ f onFetchedFn }{mine}} {
		_, ok := asFunc[onFetchedFn](in)
		assert.False(t, ok, "%T", in)
	}
}
