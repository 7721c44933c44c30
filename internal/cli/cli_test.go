package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tool is a small tool built on Command: -n must be positive, -fail makes
// the run fail its check, -setup makes it fail setup, -wait runs until a
// signal and then prints its summary.
func tool(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := New("tool", "tool counts to n.")
	n := c.Flags.Int("n", 3, "how far to count")
	fail := c.Flags.Bool("fail", false, "fail the run's own check")
	setup := c.Flags.Bool("setup", false, "fail the setup")
	wait := c.Flags.Bool("wait", false, "run until stopped")
	validate := func() error {
		if *n < 1 {
			return fmt.Errorf("-n %d: must be at least 1", *n)
		}
		return nil
	}
	return c.Run(ctx, args, stdout, stderr, validate, func(ctx context.Context) error {
		switch {
		case *setup:
			return Usagef("starting the server: %w", errors.New("port taken"))
		case *fail:
			return Failedf("counted %d, want %d", *n-1, *n)
		case *wait:
			fmt.Fprintln(stdout, "running")
			<-ctx.Done()
			fmt.Fprintln(stdout, "summary: stopped")
			return nil
		}
		fmt.Fprintln(stdout, "summary: counted", *n)
		return nil
	})
}

func TestConventions(t *testing.T) {
	cases := append(Conventions("tool", "-n=0", "-n=x"),
		Case{Name: "ok", Args: []string{"-n", "2"}, Code: ExitOK, Stdout: "counted 2"},
		Case{Name: "failed check", Args: []string{"-fail"}, Code: ExitFailed, Stderr: "tool: counted 2, want 3"},
		Case{Name: "setup error", Args: []string{"-setup"}, Code: ExitUsage, Stderr: "port taken"},
		Case{Name: "value named", Args: []string{"-n=0"}, Code: ExitUsage, Stderr: "-n 0: must be at least 1"},
	)
	Check(t, tool, cases)
}

func TestTerminate(t *testing.T) {
	Terminate(t, tool, []string{"-wait"}, "running", "summary: stopped", ExitOK)
}

func TestMarks(t *testing.T) {
	base := errors.New("base")
	if err := Usagef("x: %w", base); !errors.Is(err, ErrUsage) || !errors.Is(err, base) || errors.Is(err, ErrFailed) || err.Error() != "x: base" {
		t.Errorf("Usagef: %v", err)
	}
	if err := Failedf("y"); !errors.Is(err, ErrFailed) || errors.Is(err, ErrUsage) || err.Error() != "y" {
		t.Errorf("Failedf: %v", err)
	}
}
