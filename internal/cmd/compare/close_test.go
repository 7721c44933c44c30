package main

import (
	"errors"
	"testing"
	"time"
)

// TestCloseWithinReturnsWhenCloseBlocks is the harness's guard against
// Gubernator's Daemon.Close blocking forever after GLOBAL traffic: a close
// that never returns is reported after the deadline, not waited for.
func TestCloseWithinReturnsWhenCloseBlocks(t *testing.T) {
	if err := closeWithin(time.Second, func() {}); err != nil {
		t.Errorf("a close that returns at once: %v", err)
	}
	release := make(chan struct{})
	defer close(release) // lets the stuck close end, for goleak
	start := time.Now()
	err := closeWithin(50*time.Millisecond, func() { <-release })
	if !errors.Is(err, errCloseTimeout) {
		t.Errorf("a close that blocks: err = %v, want errCloseTimeout", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("closeWithin returned after %v, its deadline was 50ms", took)
	}
}

// TestClusterCloseNamesTheStuckDaemons: a cluster's close waits for every
// daemon at once, one deadline in all, and names those that did not return.
func TestClusterCloseNamesTheStuckDaemons(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	start := time.Now()
	err := closeAll(50*time.Millisecond, []func(){
		func() {},
		func() { <-release },
		func() { <-release },
	})
	if took := time.Since(start); took > time.Second {
		t.Errorf("closeAll returned after %v, its deadline was 50ms", took)
	}
	want := "gubernator daemon 1: Close did not return in time; left running (50ms); " +
		"gubernator daemon 2: Close did not return in time; left running (50ms)"
	if err == nil || err.Error() != want {
		t.Errorf("err = %v, want %q", err, want)
	}
}
