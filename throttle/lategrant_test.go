package throttle_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/internal/cli"
	"github.com/headway-go/headway/throttle"
)

// placed grants every permit 10 ms ahead with a margin of 1 ms, as a
// bucket that places permits does.
type placed struct{}

func (placed) Take(context.Context, string, int64, time.Duration) (throttle.Decision, error) {
	return throttle.Decision{Granted: true, Delay: 10 * time.Millisecond, Margin: time.Millisecond}, nil
}

// TestALateGrantAloneIsNotWarnedOfButASecondWithinAMinuteIs: a caller
// that wakes past its permit's margin does not use it; one such grant
// alone (a cold start, one stall) logs nothing, a second within a minute
// warns once, and a third in that minute not again.
func TestALateGrantAloneIsNotWarnedOfButASecondWithinAMinuteIs(t *testing.T) {
	clock := clockwork.NewFakeClock()
	var logs cli.SyncBuffer
	lim := throttle.New(placed{}, throttle.WithClock(clock), throttle.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	defer lim.Close()
	late := func() {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		done := result(func() error { return lim.Acquire(ctx, time.Second) })
		waitForSleepers(t, clock, 1)
		clock.Advance(20 * time.Millisecond) // woken 10 ms past its time: 9 ms past its margin
		// The late grant is dropped and the caller asks anew: stop it there.
		waitForSleepers(t, clock, 1)
		cancel()
		require.Error(t, <-done)
	}
	warnings := func() int { return strings.Count(logs.String(), "later than its margin") }
	late()
	require.Zero(t, warnings(), "one late grant alone: %s", logs.String())
	late()
	require.Equal(t, 1, warnings(), "a second within a minute warns")
	late()
	require.Equal(t, 1, warnings(), "at most once a minute")
}
