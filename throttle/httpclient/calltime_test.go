package httpclient_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

// callBase is a base RoundTripper that counts its sends and answers
// "ok", or, with block, waits for the request's context to end.
type callBase struct {
	sent  atomic.Int64
	block bool
}

func (b *callBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.sent.Add(1)
	if b.block {
		<-req.Context().Done()
		return nil, req.Context().Err()
	}
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
}

// slotFree reports whether slots has a slot of the unkeyed budget free
// now, giving it back at once.
func slotFree(slots throttle.Slots) bool {
	release, err := slots.Hold(context.Background(), "", 0)
	if err != nil {
		return false
	}
	release()
	return true
}

// TestCallTimeTakesNothingWithoutRoomForTheCall: with less than the
// call's time left before the deadline, the request takes no slot and no
// permit, sends nothing, and fails with ErrTimeout at once.
func TestCallTimeTakesNothingWithoutRoomForTheCall(t *testing.T) {
	b, err := throttle.NewLocal(1, time.Hour)
	require.NoError(t, err)
	lim := throttle.New(b)
	slots, err := throttle.NewLocalSlots(1)
	require.NoError(t, err)
	base := &callBase{}
	tr := mustTransport(t, lim, httpclient.WithBase(base), httpclient.WithConcurrency(slots), httpclient.WithCallTime(time.Minute))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://provider.test/", nil)
	require.NoError(t, err)
	_, err = tr.RoundTrip(req)
	require.Error(t, err)
	assert.ErrorIs(t, err, throttle.ErrTimeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Zero(t, base.sent.Load(), "nothing sent")
	assert.True(t, slotFree(slots), "no slot held")
	assert.NoError(t, lim.Acquire(context.Background(), 0), "the one permit was not taken")
}

// TestCallTimeShortensTheWait: a permit that would come before the
// deadline, but too late to leave the call its time, is not waited for.
func TestCallTimeShortensTheWait(t *testing.T) {
	clk := clockwork.NewFakeClock()
	b, err := throttle.NewLocal(1, 2*time.Second, throttle.WithClock(clk))
	require.NoError(t, err)
	lim := throttle.New(b, throttle.WithClock(clk))
	require.NoError(t, lim.Acquire(context.Background(), 0)) // the next permit comes in 2 s
	base := &callBase{}
	tr := mustTransport(t, lim, httpclient.WithBase(base), httpclient.WithCallTime(29*time.Second))

	// 30 s left: without the call's time, the Transport would wait the
	// 2 s (on the fake clock, never advanced: until the deadline).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://provider.test/", nil)
	require.NoError(t, err)
	_, err = tr.RoundTrip(req)
	require.Error(t, err)
	assert.ErrorIs(t, err, throttle.ErrTimeout)
	assert.NoError(t, ctx.Err(), "it did not wait for the deadline")
	assert.Zero(t, base.sent.Load())
}

// TestCallTimeAbandonedCallKeepsItsSlot: a call whose context ends after
// it was sent keeps its slot until the call's time after the send, when
// the provider is done with it; a call closed while its context lives
// gives it back at once.
func TestCallTimeAbandonedCallKeepsItsSlot(t *testing.T) {
	for _, tt := range []struct {
		name   string
		atSend bool // the context ends during the send, not before Close
	}{{"during the send", true}, {"before the body is closed", false}} {
		t.Run(tt.name, func(t *testing.T) {
			clk := clockwork.NewFakeClock()
			b, err := throttle.NewLocal(1000, time.Second, throttle.WithClock(clk))
			require.NoError(t, err)
			lim := throttle.New(b, throttle.WithClock(clk))
			slots, err := throttle.NewLocalSlots(1)
			require.NoError(t, err)
			base := &callBase{block: tt.atSend}
			tr := mustTransport(t, lim, httpclient.WithBase(base), httpclient.WithConcurrency(slots), httpclient.WithCallTime(5*time.Second))

			ctx, cancel := context.WithCancel(context.Background())
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://provider.test/", nil)
			require.NoError(t, err)
			if tt.atSend {
				go func() {
					for base.sent.Load() == 0 {
						time.Sleep(time.Millisecond)
					}
					cancel()
				}()
				_, err = tr.RoundTrip(req)
				require.ErrorIs(t, err, context.Canceled)
			} else {
				resp, err := tr.RoundTrip(req)
				require.NoError(t, err)
				cancel()
				require.NoError(t, resp.Body.Close())
			}
			assert.False(t, slotFree(slots), "the provider may still run the call")
			clk.Advance(5*time.Second - time.Millisecond)
			assert.False(t, slotFree(slots))
			clk.Advance(time.Millisecond)
			require.Eventually(t, func() bool { return slotFree(slots) }, 5*time.Second, time.Millisecond, "given back the call's time after the send")

			// A call read and closed while its context lives gives its
			// slot back at once.
			req, err = http.NewRequestWithContext(context.Background(), http.MethodGet, "http://provider.test/", nil)
			require.NoError(t, err)
			base.block = false
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			assert.True(t, slotFree(slots))
		})
	}
}

// A negative call time is refused, naming the option.
func TestNewTransportRefusesANegativeCallTime(t *testing.T) {
	_, err := httpclient.NewTransport(fastLimiter(t), httpclient.WithCallTime(-time.Second))
	require.Error(t, err)
	assert.True(t, errors.Is(err, throttle.ErrInvalid))
	assert.Contains(t, err.Error(), "WithCallTime")
}

// slowBase answers "ok" after advancing clk by d: a call of d on the
// Limiter's clock.
type slowBase struct {
	clk  *clockwork.FakeClock
	d    atomic.Int64
	sent atomic.Int64
}

func (b *slowBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.sent.Add(1)
	b.clk.Advance(time.Duration(b.d.Load()))
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
}

// newCallTimeLearner builds, on a fake clock, a Transport with
// WithCallTimeLearned (floor 100 ms) over a slowBase whose calls take
// 2 s, on a Limiter with room for 1000 calls an hour. It returns the
// clock, the base, and do, which sends a GET with left before its
// deadline, reads the answer and returns the error of Do.
func newCallTimeLearner(t *testing.T) (*clockwork.FakeClock, *slowBase, func(left time.Duration) error) {
	t.Helper()
	clk := clockwork.NewFakeClock()
	b, err := throttle.NewLocal(1000, time.Hour, throttle.WithClock(clk))
	require.NoError(t, err)
	base := &slowBase{clk: clk}
	base.d.Store(int64(2 * time.Second))
	tr := mustTransport(t, throttle.New(b, throttle.WithClock(clk)), httpclient.WithBase(base), httpclient.WithCallTimeLearned(100*time.Millisecond))
	client := &http.Client{Transport: tr}
	do := func(left time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), left)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://provider.test/", nil)
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return err
	}
	return clk, base, do
}

// TestCallTimeLearnedFromRecentCalls: with WithCallTimeLearned, the room
// a call needs before its deadline is what recent calls took (their 90th
// percentile), not a fixed time: after calls of 2 s, a request with 1.5 s
// left before its deadline takes nothing and sends nothing; one with 5 s
// is sent. Before 10 calls, the floor applies; calls that get faster
// lower it again.
func TestCallTimeLearnedFromRecentCalls(t *testing.T) {
	_, base, do := newCallTimeLearner(t)
	for i := range 9 {
		require.NoError(t, do(time.Second), "call %d: fewer than 10 calls counted, the floor (100 ms) applies", i)
	}
	require.NoError(t, do(time.Minute))
	sent := base.sent.Load()
	err := do(1500 * time.Millisecond)
	require.ErrorIs(t, err, throttle.ErrTimeout, "10 calls of 2 s counted: 1.5 s is no room")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, sent, base.sent.Load(), "nothing sent")
	require.NoError(t, do(5*time.Second), "5 s leaves room for a call of 2 s")

	base.d.Store(int64(200 * time.Millisecond))
	for range 100 {
		require.NoError(t, do(time.Minute))
	}
	require.NoError(t, do(time.Second), "the calls got faster: 1 s is room again")
}

// TestCallTimeLearnedForgetsOldCalls: a learned call time longer than
// what the callers leave before their deadlines sends nothing, so no
// faster call could ever lower it: the calls counted are those of the
// last 5 minutes, and once too few remain the floor applies again: a
// provider that recovered is called again.
func TestCallTimeLearnedForgetsOldCalls(t *testing.T) {
	clk, base, do := newCallTimeLearner(t)
	for range 10 {
		require.NoError(t, do(time.Minute))
	}
	base.d.Store(int64(200 * time.Millisecond)) // the provider recovers
	require.ErrorIs(t, do(1500*time.Millisecond), throttle.ErrTimeout, "10 calls of 2 s counted")
	clk.Advance(4 * time.Minute)
	require.ErrorIs(t, do(1500*time.Millisecond), throttle.ErrTimeout, "the calls of 2 s are recent yet")
	clk.Advance(time.Minute)
	require.NoError(t, do(1500*time.Millisecond), "5 minutes on, the slow calls are forgotten: the floor applies")
}

// limitedFirst is a provider on loopback whose first call is answered,
// once less than left is left before deadline, with 429 and
// Retry-After-Ms: 100; every later call with 200. It counts the calls
// that reach it.
func limitedFirst(t *testing.T, deadline time.Time, left time.Duration) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) > 1 {
			return
		}
		// The first call takes its time at the provider: until less
		// than left is left before the caller's deadline.
		select {
		case <-time.After(time.Until(deadline.Add(-left)) + time.Millisecond):
		case <-r.Context().Done():
		}
		w.Header().Set("Retry-After-Ms", "100")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

// TestCallTimeHoldsForTheTransportsRetry: a call time is left before the
// deadline at every send of a call, the Transport's own retry included.
// Deadline 2 s, call time 1 s: the first send is answered 429 with
// Retry-After-Ms: 100 after less than 1 s is left; the retry would go
// with less than the call's time left, a second permit for a call the
// deadline will cut. It is not sent: the provider's answer is returned,
// as for any pause the request's wait cannot hold.
func TestCallTimeHoldsForTheTransportsRetry(t *testing.T) {
	const call = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 2*call)
	defer cancel()
	deadline, _ := ctx.Deadline()
	srv, calls := limitedFirst(t, deadline, call)
	tr := mustTransport(t, fastLimiter(t), httpclient.WithCallTime(call))
	t.Cleanup(tr.CloseIdleConnections)

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "the provider's answer, not sent again")
	assert.Equal(t, "100", resp.Header.Get("Retry-After-Ms"))
	assert.EqualValues(t, 1, calls.Load(), "calls that reached the provider")
}

// TestCallTimeBoundsTheRetrysWaitForAPermit: a retry waits for its
// permit only until the call's time before the deadline, counting the
// time the first call took at the provider. Deadline 3 s, call time 1 s,
// one permit per 2.2 s: the first send is answered 429 with
// Retry-After-Ms: 100 when less than 2.4 s is left; the next permit comes
// 2.2 s after the first, when less than 0.8 s is left. The retry fails at
// once with ErrTimeout, nothing sent.
func TestCallTimeBoundsTheRetrysWaitForAPermit(t *testing.T) {
	const call = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 3*call)
	defer cancel()
	deadline, _ := ctx.Deadline()
	srv, calls := limitedFirst(t, deadline, 2400*time.Millisecond)
	b, err := throttle.NewLocal(1, 2200*time.Millisecond)
	require.NoError(t, err)
	tr := mustTransport(t, throttle.New(b), httpclient.WithCallTime(call))
	t.Cleanup(tr.CloseIdleConnections)

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("status %d after %d calls at the provider; want ErrTimeout: the retry's permit comes with less than the call's time left", resp.StatusCode, calls.Load())
	}
	assert.ErrorIs(t, err, throttle.ErrTimeout)
	assert.Contains(t, err.Error(), "call's time")
	assert.NoError(t, ctx.Err(), "it did not wait for the deadline")
	assert.EqualValues(t, 1, calls.Load(), "calls that reached the provider")
}

// TestCallTimeOfForeverSendsNothing: a call time no deadline can hold
// (throttle.Forever) sends nothing, with time left or with the deadline
// already past: the room before the deadline does not overflow.
func TestCallTimeOfForeverSendsNothing(t *testing.T) {
	base := &callBase{}
	tr := mustTransport(t, fastLimiter(t), httpclient.WithBase(base), httpclient.WithCallTime(throttle.Forever))
	for _, left := range []time.Duration{time.Hour, -time.Hour} {
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(left))
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://provider.test/", nil)
		require.NoError(t, err)
		_, err = tr.RoundTrip(req)
		cancel()
		assert.ErrorIs(t, err, throttle.ErrTimeout, "%v left", left)
		assert.ErrorIs(t, err, context.DeadlineExceeded, "%v left", left)
	}
	assert.Zero(t, base.sent.Load(), "nothing sent")
}

// lateSlots is a Slots whose Hold grants a slot, but returns late past
// its wait: a caller that a busy machine runs again long after its grant.
type lateSlots struct {
	throttle.Slots
	late time.Duration
}

func (s lateSlots) Hold(ctx context.Context, key string, maxWait time.Duration) (func(), error) {
	release, err := s.Slots.Hold(ctx, key, maxWait)
	time.Sleep(s.late) // the caller runs again this late: what is tested
	return release, err
}

// TestCallTimeChecksTheRoomAgainBeforeTheSend: a slot and permit granted
// within the wait, but to a caller run again with less than the call's
// time left (by more than min(call/4, 10 ms)), send nothing: the slot is
// given back, and the error matches ErrTimeout and
// context.DeadlineExceeded, as a wait cut by the call's time does.
func TestCallTimeChecksTheRoomAgainBeforeTheSend(t *testing.T) {
	b, err := throttle.NewLocal(1, time.Hour)
	require.NoError(t, err)
	lim := throttle.New(b)
	slots, err := throttle.NewLocalSlots(1)
	require.NoError(t, err)
	base := &callBase{}
	const call = 200 * time.Millisecond
	tr := mustTransport(t, lim, httpclient.WithBase(base), httpclient.WithCallTime(call),
		httpclient.WithConcurrency(lateSlots{Slots: slots, late: 150 * time.Millisecond}))

	ctx, cancel := context.WithTimeout(context.Background(), call+100*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://provider.test/", nil)
	require.NoError(t, err)
	_, err = tr.RoundTrip(req)
	require.Error(t, err)
	assert.ErrorIs(t, err, throttle.ErrTimeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Zero(t, base.sent.Load(), "sent with less than the call's time left")
	assert.True(t, slotFree(slots), "the slot was not given back")
}
