// Package cli gives headway's example tools the command-line conventions Go
// users expect, in one place. It is not part of headway's API.
//
// Every tool:
//
//   - prints its usage and exits 0 on -h or -help;
//   - exits 2 with a one-line reason on an unknown flag, a bad flag value, a
//     stray positional argument, or a setup error (flags are validated
//     before anything starts);
//   - exits 1 when the run finished but failed its own check (a limit
//     broken, records lost, every call failed) or failed while running;
//   - exits 0 otherwise;
//   - stops cleanly on SIGINT or SIGTERM, printing the summary so far; its
//     exit code then says whether what ran passed the check (0 or 1). A
//     second signal kills it.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Exit codes, the same in every tool.
const (
	// ExitOK: the run passed its own check (for a run stopped by a
	// signal: what ran passed it).
	ExitOK = 0
	// ExitFailed: the run failed its own check, or failed while running.
	ExitFailed = 1
	// ExitUsage: bad command line or setup error; nothing ran.
	ExitUsage = 2
)

// ErrUsage marks an error in the command line or the setup; [Command.Run]
// exits [ExitUsage] on it. Make one with [Usagef].
var ErrUsage = errors.New("usage")

// ErrFailed marks a run that finished but failed its own check;
// [Command.Run] exits [ExitFailed] on it. Make one with [Failedf].
var ErrFailed = errors.New("the run failed its own check")

// codeError carries the mark (ErrUsage or ErrFailed) that decides the
// exit code, and reads as err.
type codeError struct{ mark, err error }

func (e *codeError) Error() string   { return e.err.Error() }
func (e *codeError) Unwrap() []error { return []error{e.mark, e.err} }

// Usagef returns an error, matching [ErrUsage], that reads as the formatted
// message (which may wrap an error with %w).
func Usagef(format string, args ...any) error {
	return &codeError{ErrUsage, fmt.Errorf(format, args...)}
}

// Failedf returns an error, matching [ErrFailed], that reads as the
// formatted message (which may wrap an error with %w).
func Failedf(format string, args ...any) error {
	return &codeError{ErrFailed, fmt.Errorf(format, args...)}
}

// usage marks err, if any, as a usage error.
func usage(err error) error {
	if err == nil || errors.Is(err, ErrUsage) {
		return err
	}
	return &codeError{ErrUsage, err}
}

// Command is one tool: its name, what it does, and its flags.
type Command struct {
	// Flags is where the tool defines its flags, before [Command.Run].
	Flags *flag.FlagSet

	name, synopsis string
}

// New returns a Command named name (as typed on the command line) whose
// usage starts with synopsis, one sentence on what the tool does.
func New(name, synopsis string) *Command {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // Run prints the one-line reasons and the usage
	return &Command{Flags: fs, name: name, synopsis: synopsis}
}

// Usage writes the tool's usage: the synopsis, the flags with their
// defaults, and the exit codes.
func (c *Command) Usage(w io.Writer) {
	fmt.Fprintf(w, "usage: %s [flags]\n\n%s\n\nflags:\n", c.name, c.synopsis)
	c.Flags.SetOutput(w)
	c.Flags.PrintDefaults()
	c.Flags.SetOutput(io.Discard)
	fmt.Fprintf(w, "\nSIGINT or SIGTERM stops the run and prints the summary so far.\nexit status: %d the run passed its own check, %d it failed it (or failed while running),\n%d bad usage or setup error (nothing ran).\n",
		ExitOK, ExitFailed, ExitUsage)
}

// Run parses args (os.Args[1:]) with the Command's flags, rejects
// positional arguments, calls validate (if not nil) and then run with a
// context that SIGINT and SIGTERM cancel, and returns the exit code, for
// os.Exit. Errors are printed to stderr as one line, "name: reason".
// validate's errors count as usage errors; run's as [ExitFailed] unless
// they match [ErrUsage]. A run that returns nil, even after a signal,
// exits [ExitOK]: the run's check decides.
func (c *Command) Run(ctx context.Context, args []string, stdout, stderr io.Writer, validate func() error, run func(ctx context.Context) error) int {
	if err := c.Flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.Usage(stdout)
			return ExitOK
		}
		return c.fail(stderr, usage(err))
	}
	if rest := c.Flags.Args(); len(rest) > 0 {
		return c.fail(stderr, Usagef("unexpected argument %q: the tool takes only flags, and flags after it were not read", rest[0]))
	}
	if validate != nil {
		if err := validate(); err != nil {
			return c.fail(stderr, usage(err))
		}
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal gets the default: the process ends
	}()
	return c.fail(stderr, run(ctx))
}

// fail prints err, if any, as one line and returns its exit code.
func (c *Command) fail(stderr io.Writer, err error) int {
	if err == nil {
		return ExitOK
	}
	line := strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; ")
	if errors.Is(err, ErrUsage) {
		fmt.Fprintf(stderr, "%s: %s (see %s -h)\n", c.name, line, c.name)
		return ExitUsage
	}
	fmt.Fprintf(stderr, "%s: %s\n", c.name, line)
	return ExitFailed
}
