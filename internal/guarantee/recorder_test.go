package guarantee

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRecorderConcurrent(t *testing.T) {
	var rec Recorder // the zero value is ready
	const goroutines, each = 16, 5000
	before := time.Now()
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range each {
				rec.Record()
			}
		})
	}
	// Snapshots while recording do not disturb it.
	for range 10 {
		_ = rec.Times()
		_ = rec.Len()
	}
	wg.Wait()
	after := time.Now()

	require.Equal(t, goroutines*each, rec.Len())
	ts := rec.Times()
	require.Len(t, ts, goroutines*each)
	assert.True(t, slices.IsSortedFunc(ts, time.Time.Compare))
	assert.False(t, ts[0].Before(before))
	assert.False(t, ts[len(ts)-1].After(after))
	// Wall-clock readings only: comparisons judge them on the clock a
	// Redis server's TIME reads, not on the monotonic clock.
	for _, x := range []time.Time{ts[0], ts[len(ts)-1]} {
		assert.True(t, x == x.Round(0), "%v carries a monotonic reading", x)
	}
}

func TestRecorderRecordAt(t *testing.T) {
	var rec Recorder
	want := secs(3, 1, 2, 2, 0.5)
	for _, w := range want {
		rec.RecordAt(w)
	}
	got := rec.Times()
	slices.SortFunc(want, time.Time.Compare)
	require.Len(t, got, len(want))
	for i := range want {
		assert.True(t, want[i].Equal(got[i]), "%v != %v", want[i], got[i])
		assert.Equal(t, want[i].UnixNano(), got[i].UnixNano())
	}
	// The times feed the checkers directly.
	assert.Equal(t, 2, Sliding(got, 1, time.Second, 0).Violations) // 1 and the second 2
}

func TestRecorderEmpty(t *testing.T) {
	var rec Recorder
	assert.Zero(t, rec.Len())
	assert.Empty(t, rec.Times())
	assert.Zero(t, Sliding(rec.Times(), 1, time.Second, 0).Violations)
}

func BenchmarkRecord(b *testing.B) {
	var rec Recorder
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rec.Record()
		}
	})
}
