package admit

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/headway-go/headway/throttle"
)

func TestSlotThenPermit(t *testing.T) {
	errHold, errAcquire := errors.New("hold"), errors.New("acquire")
	for name, tc := range map[string]struct {
		wait, holdTakes     time.Duration
		noHold              bool
		holdErr, acquireErr error
		wantAcquireWait     time.Duration // -1: acquire is not called
		wantReleased        bool          // released before SlotThenPermit returned
		wantRelease         bool          // a release is returned
	}{
		"the permit has the rest of the wait":    {wait: 5 * time.Second, holdTakes: 2 * time.Second, wantAcquireWait: 3 * time.Second, wantRelease: true},
		"a slot that takes the whole wait":       {wait: time.Second, holdTakes: 3 * time.Second, wantAcquireWait: 0, wantRelease: true},
		"Forever stays Forever":                  {wait: throttle.Forever, holdTakes: time.Hour, wantAcquireWait: throttle.Forever, wantRelease: true},
		"no slot to hold takes nothing off":      {wait: 5 * time.Second, noHold: true, wantAcquireWait: 5 * time.Second},
		"no slot: no permit is asked for":        {wait: time.Second, holdErr: errHold, wantAcquireWait: -1},
		"no permit: the slot goes back":          {wait: time.Second, acquireErr: errAcquire, wantAcquireWait: time.Second, wantReleased: true},
		"no permit and no slot: nothing to free": {wait: time.Second, noHold: true, acquireErr: errAcquire, wantAcquireWait: time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			clock := time.Unix(0, 0)
			released := 0
			var hold func(time.Duration) (func(), error)
			if !tc.noHold {
				hold = func(d time.Duration) (func(), error) {
					assert.Equal(t, tc.wait, d, "the slot waits the whole wait")
					clock = clock.Add(tc.holdTakes)
					if tc.holdErr != nil {
						return nil, tc.holdErr
					}
					return func() { released++ }, nil
				}
			}
			acquireWait := time.Duration(-1)
			release, err := SlotThenPermit(tc.wait, func() time.Time { return clock }, hold, func(d time.Duration) error {
				acquireWait = d
				return tc.acquireErr
			})
			assert.Equal(t, tc.wantAcquireWait, acquireWait)
			switch {
			case tc.holdErr != nil:
				assert.ErrorIs(t, err, tc.holdErr)
			case tc.acquireErr != nil:
				assert.ErrorIs(t, err, tc.acquireErr)
			default:
				assert.NoError(t, err)
			}
			assert.Equal(t, tc.wantRelease, release != nil, "a release is returned")
			if tc.wantReleased {
				assert.Equal(t, 1, released, "the slot was given back")
			} else {
				assert.Zero(t, released, "the slot is still held")
			}
		})
	}
}

func TestSlotThenPermitReleasesWhenAcquirePanics(t *testing.T) {
	released := false
	assert.Panics(t, func() {
		_, _ = SlotThenPermit(time.Second, time.Now,
			func(time.Duration) (func(), error) { return func() { released = true }, nil },
			func(time.Duration) error { panic("acquire") })
	})
	assert.True(t, released, "the slot went back")
}
