package consumer

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A map reads back as written; one too long for maxOffsetMap keeps the
// ranges that fit, from the first, so that only records are left out
// (handled again), never added.
func TestOffsetMapRoundTripsAndKeepsAPrefixWhenLong(t *testing.T) {
	runs := []offRun{{100, 100}, {102, 5000}, {5002, 5002}, {1 << 40, 1<<40 + 7}}
	base, got, ok := decodeOffsetMap(encodeOffsetMap(99, runs))
	require.True(t, ok)
	assert.EqualValues(t, 99, base)
	assert.Equal(t, runs, got)

	var many []offRun
	for i := range int64(5000) {
		many = append(many, offRun{10 + 3*i, 11 + 3*i})
	}
	text := encodeOffsetMap(10, many)
	assert.LessOrEqual(t, len(text), maxOffsetMap)
	_, got, ok = decodeOffsetMap(text)
	require.True(t, ok)
	require.NotEmpty(t, got)
	assert.Less(t, len(got), len(many))
	assert.Equal(t, many[:len(got)], got)

	_, got, ok = decodeOffsetMap(encodeOffsetMap(7, nil))
	assert.True(t, ok)
	assert.Empty(t, got)
}

// Metadata that is not a map (kgo's member ID, a damaged one) restores
// nothing.
func TestOffsetMapRefusesOtherMetadata(t *testing.T) {
	for _, s := range []string{"", "member-1", offsetMapPrefix, offsetMapPrefix + "z", offsetMapPrefix + "a:1", offsetMapPrefix + "a:1.0",
		offsetMapPrefix + "a:-1.2", offsetMapPrefix + "a:1.2,", offsetMapPrefix + "-a:1.2", offsetMapPrefix + "a:zzzzzzzzzzzzzz.1"} {
		_, _, ok := decodeOffsetMap(s)
		assert.False(t, ok, "%q", s)
	}
}

func FuzzDecodeOffsetMap(f *testing.F) {
	f.Add(encodeOffsetMap(99, []offRun{{100, 100}, {102, 5000}}))
	f.Add(offsetMapPrefix + "a:1.2")
	f.Fuzz(func(t *testing.T, s string) {
		base, runs, ok := decodeOffsetMap(s)
		if !ok {
			return
		}
		next := base
		for _, r := range runs {
			if r.first < next || r.last < r.first {
				t.Fatalf("decodeOffsetMap(%q) = %d, %v: ranges out of order", s, base, runs)
			}
			next = r.last + 1
		}
	})
}
