package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
)

// slowStore is a bucket whose store answers a check after delay.
type slowStore struct {
	throttle.Bucket
	delay time.Duration
}

func (s slowStore) Check(ctx context.Context) error {
	select {
	case <-time.After(s.delay): // the store's answer: a fault's duration
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A check at start, with a context without a deadline, waits for a store
// slower than the store timeout that bounds each Acquire (a healthy store
// on a busy machine): an app is not stopped by a check that gave up too
// soon. A deadline of the caller's own still bounds it.
func TestCheckWaitsLongerThanTheStoreTimeout(t *testing.T) {
	local, err := throttle.NewLocal(10, time.Second)
	require.NoError(t, err)
	lim := throttle.New(slowStore{Bucket: local, delay: 3 * throttle.DefaultStoreTimeout})
	defer lim.Close()
	require.NoError(t, lim.Check(context.Background()))

	hung := throttle.New(slowStore{Bucket: local, delay: time.Hour})
	defer hung.Close()
	ctx, cancel := context.WithTimeout(context.Background(), throttle.DefaultStoreTimeout)
	defer cancel()
	require.ErrorIs(t, hung.Check(ctx), context.DeadlineExceeded)
}
