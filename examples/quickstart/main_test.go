package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/headway-go/headway/internal/cli"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCommandLine checks the conventions every example tool keeps (see
// internal/cli): usage on -h, exit 2 with one line for bad usage, a run's
// summary, and the summary on SIGTERM.
func TestCommandLine(t *testing.T) {
	cli.Check(t, command, append(cli.Conventions("quickstart", "-rate=0", "-limit=0", "-interval=-1s", "-workers=none"),
		cli.Case{Name: "ok", Args: []string{"-rate", "50", "-limit", "5", "-interval", "100ms", "-duration", "300ms"}, Code: cli.ExitOK, Stdout: "requests served"},
	))
	cli.Terminate(t, command, []string{"-duration", "1m"}, "requests/s for", "requests served", cli.ExitOK)
}
