package main

import (
	"os"
	"os/exec"
	"testing"

	"go.uber.org/goleak"

	"github.com/headway-go/headway/internal/cli"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCommandLine checks the conventions every example tool keeps (see
// internal/cli): usage on -h, exit 2 with one line for bad usage before
// any redis-server starts, and the summary so far on SIGTERM.
func TestCommandLine(t *testing.T) {
	cli.Check(t, command, append(cli.Conventions("compare", "-mode=nonsense", "-goroutines=0", "-only=nobody", "-duration=x",
		"-base=nobody", "-demand=-1", "-demand=NaN"),
		cli.Case{Name: "demand needing too many goroutines", Args: []string{"-limit", "5000", "-demand", "4"}, Code: cli.ExitUsage, Stderr: "25000 goroutines"},
		cli.Case{Name: "ok", Args: []string{"-only", "x/time/rate", "-mode", "limit", "-duration", "200ms", "-goroutines", "4"}, Code: cli.ExitOK, Stdout: "x/time/rate"},
	))
	cli.Terminate(t, command, []string{"-only", "x/time/rate", "-mode", "limit", "-duration", "1m", "-goroutines", "4"}, "limit mode, round 1: x/time/rate", "| x/time/rate", cli.ExitOK)
}

// TestTerminateStopsBetweenRounds: SIGTERM in the first of several rounds
// ends the run there, with the tables of what ran and exit 0, as the
// convention says. (The next round's contender on Redis used to start
// with the signal's context, fail to reach Redis, and end the run with
// exit 1 and no table.)
func TestTerminateStopsBetweenRounds(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("HEADWAY_REQUIRE_REDIS") != "" {
			t.Fatal("HEADWAY_REQUIRE_REDIS is set and redis-server is not installed")
		}
		t.Skip("redis-server is not installed")
	}
	cli.Terminate(t, command, []string{"-only", "headway-tokenbucket", "-rounds", "3", "-mode", "limit", "-duration", "1m", "-goroutines", "4"},
		"limit mode, round 1: headway-tokenbucket", "| headway-tokenbucket", cli.ExitOK)
}
