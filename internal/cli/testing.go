package cli

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Main is a tool's main function in a form tests can call: it returns the
// exit code instead of calling os.Exit.
type Main func(ctx context.Context, args []string, stdout, stderr io.Writer) int

// Case is one row of a tool's command-line table test.
type Case struct {
	Name string
	Args []string
	Code int
	// Stdout and Stderr, when not empty, must appear in the output.
	Stdout, Stderr string
}

// Conventions returns the rows every tool must pass: -h and -help print
// the usage and exit 0; an unknown flag, a stray positional argument before
// other flags, and badValue (a flag with a value the tool rejects, like
// "-limit=0") exit 2 with a one-line reason.
func Conventions(name string, badValue ...string) []Case {
	cs := []Case{
		{Name: "-h", Args: []string{"-h"}, Code: ExitOK, Stdout: "usage: " + name},
		{Name: "-help", Args: []string{"-help"}, Code: ExitOK, Stdout: "exit status"},
		{Name: "unknown flag", Args: []string{"-no-such-flag"}, Code: ExitUsage, Stderr: "no-such-flag"},
		{Name: "stray argument", Args: []string{"stray", "-h"}, Code: ExitUsage, Stderr: `unexpected argument "stray"`},
	}
	for _, b := range badValue {
		cs = append(cs, Case{Name: "bad value " + b, Args: []string{b}, Code: ExitUsage})
	}
	return cs
}

// Check runs each case through main and checks its exit code and output;
// a failing exit must explain itself in exactly one line on stderr.
func Check(t *testing.T, main Main, cases []Case) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			var out, errs bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			code := main(ctx, c.Args, &out, &errs)
			if code != c.Code {
				t.Fatalf("%v: exit %d, want %d\nstdout: %s\nstderr: %s", c.Args, code, c.Code, out.String(), errs.String())
			}
			if c.Stdout != "" && !strings.Contains(out.String(), c.Stdout) {
				t.Errorf("%v: stdout lacks %q:\n%s", c.Args, c.Stdout, out.String())
			}
			if c.Stderr != "" && !strings.Contains(errs.String(), c.Stderr) {
				t.Errorf("%v: stderr lacks %q:\n%s", c.Args, c.Stderr, errs.String())
			}
			if code == ExitUsage {
				if lines := strings.Count(strings.TrimSpace(errs.String()), "\n") + 1; lines != 1 || out.Len() != 0 {
					t.Errorf("%v: want one line on stderr and nothing on stdout, got stderr %q, stdout %q", c.Args, errs.String(), out.String())
				}
			}
		})
	}
}

// SyncBuffer is a bytes.Buffer safe for a writer and a reader at once (a
// tool writing its output while a test reads it).
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Terminate runs main with args, sends this process SIGTERM once stdout or
// stderr contains started, and checks that main then returns code within a
// minute with summary on stdout. main must be running under [Command.Run]
// (which catches the signal) by the time it prints started; the test must
// not run in parallel with others.
func Terminate(t *testing.T, main Main, args []string, started, summary string, code int) {
	t.Helper()
	var out, errs SyncBuffer
	done := make(chan int, 1)
	go func() { done <- main(context.Background(), args, &out, &errs) }()
	deadline := time.After(time.Minute)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(out.String(), started) && !strings.Contains(errs.String(), started) {
		select {
		case got := <-done:
			t.Fatalf("%v ended (exit %d) before printing %q:\nstdout: %s\nstderr: %s", args, got, started, out.String(), errs.String())
		case <-deadline:
			t.Fatalf("%v did not print %q within a minute:\nstdout: %s\nstderr: %s", args, started, out.String(), errs.String())
		case <-tick.C: // output arrives from another goroutine; poll it
		}
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-done:
		if got != code {
			t.Errorf("after SIGTERM: exit %d, want %d\nstderr: %s", got, code, errs.String())
		}
		if !strings.Contains(out.String(), summary) {
			t.Errorf("after SIGTERM: stdout lacks the summary %q:\n%s", summary, out.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("%v did not stop within a minute of SIGTERM:\nstdout: %s", args, out.String())
	}
}
