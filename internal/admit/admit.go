// Package admit is the one order in which a call is admitted under a
// concurrency cap and a limiter: its slot first, then its permit with
// what is left of the wait, and the slot back when no permit comes. The
// consumer and httpclient's Transport both admit their calls this way.
package admit

import (
	"time"

	"github.com/headway-go/headway/throttle"
)

// SlotThenPermit holds a slot with hold, waiting at most wait, then takes
// a permit with acquire, waiting at most what is left of wait by now's
// clock (throttle.Forever stays Forever). A nil hold holds nothing and
// takes nothing off the wait. It returns the slot's release (nil when
// none is held). When hold fails nothing is held; when acquire fails or
// panics, the slot is released before SlotThenPermit returns.
func SlotThenPermit(wait time.Duration, now func() time.Time, hold func(time.Duration) (func(), error), acquire func(time.Duration) error) (func(), error) {
	var release func()
	if hold != nil {
		start := now()
		r, err := hold(wait)
		if err != nil {
			return nil, err
		}
		release = r
		if wait != throttle.Forever {
			wait = max(wait-now().Sub(start), 0)
		}
	}
	admitted := false
	defer func() {
		if !admitted && release != nil {
			release()
		}
	}()
	if err := acquire(wait); err != nil {
		return nil, err
	}
	admitted = true
	return release, nil
}
