package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHungAdaptivePaceFallsBackWithinTheStoreTimeout: an adaptive pace
// whose store does not answer is given up after the store timeout, and the
// caller is paced locally and asks the bucket, whatever its wait: a
// Forever caller is not kept for good, and a caller with a long maxWait
// does not spend it all on the pace (and time out) before the failure
// policy can decide.
func TestHungAdaptivePaceFallsBackWithinTheStoreTimeout(t *testing.T) {
	for _, maxWait := range []time.Duration{Forever, time.Minute} {
		loc, err := NewLocal(10, time.Second)
		require.NoError(t, err)
		lim := New(&failingAdaptive{Local: loc}, WithStoreTimeout(20*time.Millisecond))
		lim.note(lim.root, AdaptiveState{Rate: 5, At: time.Now()}, lim.tb.now()) // adapting
		// A safety net only: the pace's fallback comes long before.
		stop, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err = lim.Acquire(ContextWithWaitStop(context.Background(), stop), maxWait)
		cancel()
		assert.NoError(t, err, "maxWait %v", maxWait)
		require.NoError(t, lim.Close())
	}
}
