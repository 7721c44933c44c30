package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"

	"github.com/headway-go/headway/internal/cli"
)

// Gubernator's contenders.
//
// Gubernator brings a large tree of dependencies (gRPC, the etcd and
// Kubernetes clients, OpenTelemetry exporters): about 310 MB of modules
// more to download, and two minutes more of compiling on 2 cores, for a
// build from empty caches. So the code that runs it (gubernator.go) is
// built only when asked, with -tags gubernator: vetting and testing this
// module (CI) neither downloads nor compiles it. Built without the tag,
// this program knows the contenders' names, and when one is selected it
// builds itself with the tag (go build, in its source directory) and runs
// that build with the same arguments in its place: one run, the same
// tables. `go test -tags gubernator ./...` tests the Gubernator
// contenders.

// gubernatorOpts says how a Gubernator contender is run.
type gubernatorOpts struct {
	nodes  int  // daemons, peers of each other
	leaky  bool // LEAKY_BUCKET (burst = limit, its default); else TOKEN_BUCKET
	global bool // GLOBAL; else BATCHING, the default
}

// gubernatorContender is a contender that runs Gubernator daemons in this
// process, with their default settings, and asks them through their gRPC
// client, as a service written in any language would.
func gubernatorContender(name, note string, o gubernatorOpts) contender {
	g := periods
	if o.leaky {
		g = gcra // burst = limit, its default
	}
	return contender{
		name: name, note: note, guarantee: g, gubernator: true,
		build: func(s setup) (acquirer, error) { return buildGubernator(o, s) },
	}
}

// needsGubernatorBuild reports whether c selects a Gubernator contender
// that this build cannot run.
func (c *config) needsGubernatorBuild() bool {
	return !gubernatorBuilt && slices.ContainsFunc(c.selected(), func(ct contender) bool { return ct.gubernator })
}

// buildWithGubernator builds this program with -tags gubernator from its
// source in dir, to bin, writing the go command's output to out. Tests
// stand in for the go command here.
var buildWithGubernator = func(ctx context.Context, dir, bin string, out io.Writer) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", "gubernator", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build -tags gubernator in %s: %w", dir, err)
	}
	return nil
}

// runWithGubernator builds this program with Gubernator's contenders and
// runs that build with args in its place: its output is this run's, a
// SIGTERM this process gets is passed on (a terminal's SIGINT reaches it
// directly, as it is in the same process group), and how it ended is how
// this run ends.
func runWithGubernator(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	dir, err := sourceDir()
	if err != nil {
		return cli.Usagef("%w", err)
	}
	tmp, err := os.MkdirTemp("", "compare-gubernator-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "compare")
	fmt.Fprintf(stderr, "compare: building with Gubernator's contenders (go build -tags gubernator in %s; the first build downloads and compiles its dependencies)\n", dir)
	if err := buildWithGubernator(ctx, dir, bin, stderr); err != nil {
		if ctx.Err() != nil {
			return nil // stopped by a signal before anything ran
		}
		return err
	}

	// Registered before ctx is looked at and the build started, so that
	// no SIGTERM in between is lost (cli stops catching signals once the
	// first came; while this is registered, a second SIGTERM is passed on
	// too, and the build, which gets it as its second, ends at once).
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	defer signal.Stop(term)
	if ctx.Err() != nil {
		return nil
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("running the build with Gubernator: %w", err)
	}
	done := make(chan struct{})
	forwarded := make(chan struct{})
	go func() {
		defer close(forwarded)
		for {
			select {
			case s := <-term:
				_ = cmd.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	err = cmd.Wait()
	close(done)
	<-forwarded
	st := cmd.ProcessState
	switch {
	case st == nil:
		return fmt.Errorf("running the build with Gubernator: %w", err)
	case st.Success():
		return nil
	case st.ExitCode() == cli.ExitUsage:
		return cli.Usagef("the build with Gubernator refused the arguments")
	}
	return cli.Failedf("the build with Gubernator: %v", st)
}

// compareModule starts the go.mod of this program's module.
const compareModule = "module github.com/headway-go/headway/internal/cmd/compare\n"

// sourceDir returns the directory of this program's source: the one this
// file was compiled in (go run and go build record it), or else the
// working directory, whichever holds this module's go.mod.
func sourceDir() (string, error) {
	var dirs []string
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		dirs = append(dirs, filepath.Dir(file))
	}
	if wd, err := os.Getwd(); err == nil {
		dirs = append(dirs, wd)
	}
	for _, d := range dirs {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && bytes.HasPrefix(b, []byte(compareModule)) {
			return d, nil
		}
	}
	return "", errors.New("gubernator's contenders are built only when asked, from this program's source, which is not where it was built nor here: run go run -tags gubernator . in internal/cmd/compare")
}
