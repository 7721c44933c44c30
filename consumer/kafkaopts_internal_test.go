package consumer

import (
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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
