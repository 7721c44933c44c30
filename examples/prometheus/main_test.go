package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/headway-go/headway/internal/cli"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCommandLine checks the conventions every example tool keeps (see
// internal/cli): usage on -h, exit 2 with one line for bad usage, a run's
// scrape, and the scrape so far on SIGTERM.
func TestCommandLine(t *testing.T) {
	cli.Check(t, command, append(cli.Conventions("prometheus", "-addr=192.0.2.1:9464", "-duration=0s", "-limit=0", "-records=x"),
		cli.Case{Name: "ok", Args: []string{"-addr", "127.0.0.1:0", "-duration", "500ms", "-records", "50"}, Code: cli.ExitOK, Stdout: "headway"},
	))
	cli.Terminate(t, command, []string{"-addr", "127.0.0.1:0", "-duration", "1m", "-records", "50"}, "serving metrics at", "headway", cli.ExitOK)
}
