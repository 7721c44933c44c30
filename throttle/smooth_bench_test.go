package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkSmoothTake measures Smooth's own cost: a pace that always has
// a slot (one a nanosecond) in front of a bucket that grants everything.
func BenchmarkSmoothTake(b *testing.B) {
	s, err := NewSmooth(plenty{}, 1<<40, time.Hour)
	require.NoError(b, err)
	ctx := context.Background()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, _ = s.Take(ctx, "", 1, 0)
		}
	})
}
