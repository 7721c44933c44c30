//go:build gubernator

package main

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/headway-go/headway/internal/cli"
)

// TestGubernatorOneDaemon runs the real thing briefly: one daemon on a
// loopback port, asked over gRPC until it refuses, then closed, leaving
// no goroutine behind.
func TestGubernatorOneDaemon(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ct := gubernatorContender("g", "", gubernatorOpts{nodes: 1})
	acq, err := ct.build(setup{key: "k", limit: 3, interval: time.Minute, calls: &counter{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var decided decision
	for i := range 4 {
		ok, err := acq.acquire(ctx, 0, &decided)
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 3; ok != want {
			t.Errorf("acquire %d: granted %v, want %v (limit 3 per minute)", i+1, ok, want)
		}
	}
	if err := acq.close(); err != nil {
		t.Errorf("close: %v", err)
	}
}

// TestGubernatorCommandLine: a Gubernator daemon in the process, asks
// paced at twice the limit, ratios to the first contender that runs.
func TestGubernatorCommandLine(t *testing.T) {
	cli.Check(t, command, []cli.Case{
		{Name: "gubernator", Args: []string{"-only", "x/time/rate,gubernator", "-mode", "limit", "-limit", "10", "-demand", "2", "-duration", "300ms", "-goroutines", "4"},
			Code: cli.ExitOK, Stdout: "| gubernator "},
	})
}
