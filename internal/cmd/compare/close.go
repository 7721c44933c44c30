package main

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// daemonCloseWait bounds the close of one run's daemons.
const daemonCloseWait = 5 * time.Second

// errCloseTimeout reports a close that did not return in time.
var errCloseTimeout = errors.New("did not return in time; left running")

// closeWithin runs fn and waits at most d for it to return.
//
// Gubernator v2.13.0's Daemon.Close can block forever after GLOBAL
// traffic: closing stops its global manager, whose loop stops its sync
// timer (an Interval) and waits for the timer's goroutine, and that
// goroutine can be stuck sending a tick into a full channel that only the
// stopped loop reads. A harness that waited would hang; this one gives up
// after d and reports it, leaving that goroutine and whatever it holds
// behind (a leak until the process exits, which it then does).
func closeWithin(d time.Duration, fn func()) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return fmt.Errorf("%w (%v)", errCloseTimeout, d)
	}
}

// closeAll runs every close at once, each bounded by d (see closeWithin),
// and names, by index, those that did not return.
func closeAll(d time.Duration, closes []func()) error {
	errs := make([]error, len(closes))
	var wg sync.WaitGroup
	for i, fn := range closes {
		wg.Go(func() {
			if err := closeWithin(d, fn); err != nil {
				errs[i] = fmt.Errorf("gubernator daemon %d: Close %w", i, err)
			}
		})
	}
	wg.Wait()
	var msgs []string
	for _, err := range errs {
		if err != nil {
			msgs = append(msgs, err.Error())
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return errors.New(strings.Join(msgs, "; "))
}
