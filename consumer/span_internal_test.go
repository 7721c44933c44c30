package consumer

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A finished record costs what the byte bound counts for it: its span
// entry.
func TestSpanEntryCostsWhatTheBoundCounts(t *testing.T) {
	assert.EqualValues(t, unsafe.Sizeof(spanEntry{}), spanEntryBytes)
}

// The span keeps offsets in order, finishes records by sequence number
// in any order, pops only the finished front, and keeps sequence numbers
// across the compaction of its buffer.
func TestSpanPopsTheFinishedFront(t *testing.T) {
	var q span
	const n = 5000
	seqs := make([]int64, n)
	for i := range n {
		seqs[i] = q.push(int64(10+2*i), int32(i/1000)) // offsets with gaps
	}
	assert.Equal(t, n, q.len())
	_, ok := q.popDone()
	require.False(t, ok, "nothing finished")

	// Finish everything but record 0, back to front: nothing pops.
	for i := n - 1; i >= 1; i-- {
		q.finish(seqs[i])
	}
	_, ok = q.popDone()
	require.False(t, ok, "the front is unfinished")

	q.finish(seqs[0])
	last, ok := q.popDone()
	require.True(t, ok)
	assert.Equal(t, spanEntry{off: 10 + 2*(n-1), epoch: (n - 1) / 1000, done: true}, last)
	assert.Zero(t, q.len())

	// Sequence numbers go on after a pop and a compaction.
	for i := range 3000 {
		seqs[i] = q.push(int64(20000+i), 9)
	}
	for i := range 2000 {
		q.finish(seqs[i])
	}
	last, ok = q.popDone()
	require.True(t, ok)
	assert.EqualValues(t, 21999, last.off)
	s := q.push(30000, 9) // after the compaction
	q.finish(seqs[2999])
	q.finish(s)
	_, ok = q.popDone()
	require.False(t, ok, "records 2000 to 2998 are unfinished")
	for i := 2000; i < 2999; i++ {
		q.finish(seqs[i])
	}
	last, ok = q.popDone()
	require.True(t, ok)
	assert.EqualValues(t, 30000, last.off)
	assert.Zero(t, q.len())
}
