//go:build !gubernator

package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/headway-go/headway/internal/cli"
)

// fakeBuild stands in for go build -tags gubernator: it writes script, a
// shell script, as the program built, and records the directory it was
// asked to build in.
func fakeBuild(t *testing.T, script string) *string {
	t.Helper()
	var built string
	orig := buildWithGubernator
	buildWithGubernator = func(_ context.Context, dir, bin string, _ io.Writer) error {
		built = dir
		return os.WriteFile(bin, []byte("#!/bin/sh\n"+script), 0o700)
	}
	t.Cleanup(func() { buildWithGubernator = orig })
	return &built
}

// TestGubernatorContendersAreBuiltWhenAsked: without -tags gubernator, a
// run that selects a Gubernator contender builds this program with the
// tag, from its source directory, and runs that build with the same
// arguments: its output and its exit code are the run's. A run that
// selects none builds nothing.
func TestGubernatorContendersAreBuiltWhenAsked(t *testing.T) {
	built := fakeBuild(t, `echo "| ran with $*"; exit 0`)
	args := []string{"-only", "x/time/rate,gubernator-global", "-duration", "200ms"}
	var out, errs bytes.Buffer
	if code := command(context.Background(), args, &out, &errs); code != cli.ExitOK {
		t.Fatalf("exit %d, want 0; stderr: %s", code, errs.String())
	}
	if want := "| ran with " + strings.Join(args, " "); !strings.Contains(out.String(), want) {
		t.Errorf("stdout %q lacks %q", out.String(), want)
	}
	if b, err := os.ReadFile(filepath.Join(*built, "go.mod")); err != nil || !bytes.HasPrefix(b, []byte(compareModule)) {
		t.Errorf("built in %q, not this module's directory (%v)", *built, err)
	}

	*built = ""
	out.Reset()
	if code := command(context.Background(), []string{"-only", "x/time/rate", "-mode", "limit", "-duration", "200ms", "-goroutines", "4"}, &out, &errs); code != cli.ExitOK {
		t.Fatalf("x/time/rate alone: exit %d; stderr: %s", code, errs.String())
	}
	if *built != "" || !strings.Contains(out.String(), "| x/time/rate") {
		t.Errorf("x/time/rate alone: built %q; stdout: %s", *built, out.String())
	}

	fakeBuild(t, `echo "compare: it failed" >&2; exit 1`)
	errs.Reset()
	if code := command(context.Background(), args, &out, &errs); code != cli.ExitFailed {
		t.Errorf("a build with Gubernator that exits 1: exit %d, want 1", code)
	}
	if !strings.Contains(errs.String(), "compare: it failed") {
		t.Errorf("its stderr was not passed on: %s", errs.String())
	}
}

// TestGubernatorBuildGetsTheSignal: SIGTERM to this program reaches the
// build with Gubernator that runs in its place, which prints the
// summary so far; the run exits as it does.
func TestGubernatorBuildGetsTheSignal(t *testing.T) {
	fakeBuild(t, `trap 'echo "| stopped"; exit 0' TERM
echo started
while :; do sleep 0.01; done`)
	cli.Terminate(t, command, []string{"-only", "gubernator", "-duration", "1m"}, "started", "| stopped", cli.ExitOK)
}
