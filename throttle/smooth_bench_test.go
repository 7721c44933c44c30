package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// plenty is a bucket that grants everything, with a period of an hour.
type plenty struct{}

func (plenty) Take(context.Context, string, int64, time.Duration) (Decision, error) {
	return Decision{Granted: true, Limit: 1 << 50, Remaining: 1 << 50, Reset: time.Hour}, nil
}

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
