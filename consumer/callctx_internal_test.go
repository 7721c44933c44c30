package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type ctxKey struct{}

func waitDone(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("context not done within 5 s")
	}
}

// A handler call's context keeps the context.Context contract without a
// timer per call: it reports its deadline, carries Run's values, ends at
// the deadline whether one waits on Done, asks Err, or derives a context
// from it, and ends with Canceled when cancelled first.
func TestCallContextKeepsTheContextContract(t *testing.T) {
	parent := context.WithValue(context.Background(), ctxKey{}, "run")

	t.Run("deadline through Done", func(t *testing.T) {
		c := newCallCtx(parent, nil, time.Now(), 20*time.Millisecond)
		dl, ok := c.Deadline()
		assert.True(t, ok)
		assert.WithinDuration(t, time.Now().Add(20*time.Millisecond), dl, 20*time.Millisecond)
		assert.Equal(t, "run", c.Value(ctxKey{}))
		assert.NoError(t, c.Err())
		waitDone(t, c)
		assert.ErrorIs(t, c.Err(), context.DeadlineExceeded)
		c.cancel(context.Canceled)
		assert.ErrorIs(t, c.Err(), context.DeadlineExceeded, "the first error stays")
	})
	t.Run("deadline through Err alone", func(t *testing.T) {
		c := newCallCtx(parent, nil, time.Now(), time.Millisecond)
		require.Eventually(t, func() bool { return c.Err() != nil }, 5*time.Second, time.Millisecond)
		assert.ErrorIs(t, c.Err(), context.DeadlineExceeded)
		select {
		case <-c.Done():
		default:
			t.Fatal("Done not closed after Err reported the deadline")
		}
	})
	t.Run("deadline through a derived context", func(t *testing.T) {
		c := newCallCtx(parent, nil, time.Now(), 20*time.Millisecond)
		child, cancel := context.WithCancel(c)
		defer cancel()
		waitDone(t, child)
		assert.ErrorIs(t, child.Err(), context.DeadlineExceeded, "a child ends with its parent's error")
		assert.Equal(t, "run", child.Value(ctxKey{}))
	})
	t.Run("cancelled before the deadline", func(t *testing.T) {
		c := newCallCtx(parent, nil, time.Now(), time.Hour)
		done := c.Done()
		fired := make(chan struct{})
		context.AfterFunc(c, func() { close(fired) })
		stopped := context.AfterFunc(c, func() { t.Error("a stopped AfterFunc ran") })
		assert.True(t, stopped())
		c.cancel(context.Canceled)
		<-done
		<-fired
		assert.ErrorIs(t, c.Err(), context.Canceled)
		late := make(chan struct{})
		context.AfterFunc(c, func() { close(late) })
		<-late
	})
	t.Run("a shorter derived deadline", func(t *testing.T) {
		c := newCallCtx(parent, nil, time.Now(), time.Hour)
		child, cancel := context.WithTimeout(c, 10*time.Millisecond)
		defer cancel()
		waitDone(t, child)
		assert.ErrorIs(t, child.Err(), context.DeadlineExceeded)
		assert.NoError(t, c.Err())
		c.cancel(context.Canceled)
	})
}
