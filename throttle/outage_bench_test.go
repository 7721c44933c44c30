package throttle

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// recovered is a store that grants everything with a period of an hour,
// and fails while down.
type recovered struct{ down atomic.Bool }

func (s *recovered) Take(context.Context, string, int64, time.Duration) (Decision, error) {
	if s.down.Load() {
		return Decision{}, &BackendError{Op: "take", Err: errors.New("connection refused")}
	}
	return Decision{Granted: true, Limit: 1 << 40, Remaining: 1 << 39, Reset: time.Hour}, nil
}

func (s *recovered) Fallback() (int64, time.Duration, int64) { return 1 << 40, time.Hour, 1 }

// BenchmarkLimiterAcquireAfterOutage: the shared decisions of a tenant's
// key under FailLocal once the store is back from an outage during which
// 1,000 other keys were granted locally: the cost of what the Limiter
// keeps of that outage, paid by every key.
func BenchmarkLimiterAcquireAfterOutage(b *testing.B) {
	s := &recovered{}
	l := New(s, WithFailurePolicy(FailLocal), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer l.Close()
	ctx := context.Background()
	for i := range 1000 {
		if err := l.Key(strconv.Itoa(i)).Acquire(ctx, 0); err != nil {
			b.Fatal(err)
		}
	}
	s.down.Store(true)
	for i := range 1000 {
		if err := l.Key(strconv.Itoa(i)).Acquire(ctx, 0); err != nil {
			b.Fatal(err)
		}
	}
	s.down.Store(false)
	lim := l.Key("tenant")
	if err := lim.Acquire(ctx, 0); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := lim.Acquire(ctx, 0); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
