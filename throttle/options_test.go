package throttle_test

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/throttle"
)

// TestOptionNotReadIsRefused gives every option of package throttle to
// every constructor: one that reads the option accepts it; one that does
// not refuses it with an error matching throttle.ErrInvalid that names the
// option and the constructor (New, which does not fail, returns it from
// every call of its Limiter), rather than ignoring it.
func TestOptionNotReadIsRefused(t *testing.T) {
	local, err := throttle.NewLocal(10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctors := map[string]func(throttle.Option) error{
		"New": func(o throttle.Option) error {
			lim := throttle.New(local, o)
			defer lim.Close()
			return lim.Acquire(context.Background(), 0)
		},
		"NewLocal": func(o throttle.Option) error {
			_, err := throttle.NewLocal(10, time.Second, o)
			return err
		},
		"NewSmooth": func(o throttle.Option) error {
			_, err := throttle.NewSmooth(local, 10, time.Second, o)
			return err
		},
	}
	options := []struct {
		name  string
		opt   throttle.Option
		reads []string
	}{
		{"WithClock", throttle.WithClock(clockwork.NewRealClock()), []string{"New", "NewLocal", "NewSmooth"}},
		{"WithLogger", throttle.WithLogger(slog.Default()), []string{"New"}},
		{"WithObserver", throttle.WithObserver(nil), []string{"New"}},
		{"WithFailurePolicy", throttle.WithFailurePolicy(throttle.FailClosed), []string{"New"}},
		{"WithStoreTimeout", throttle.WithStoreTimeout(time.Second), []string{"New"}},
		{"WithLeasing", throttle.WithLeasing(throttle.Leasing{}), []string{"New"}},
		{"WithLocalBurst", throttle.WithLocalBurst(2), []string{"NewLocal"}},
		{"WithSmoothInstances", throttle.WithSmoothInstances(2), []string{"NewSmooth"}},
	}
	for _, o := range options {
		for ctor, build := range ctors {
			reads := false
			for _, r := range o.reads {
				reads = reads || r == ctor
			}
			err := build(o.opt)
			switch {
			case reads && err != nil:
				t.Errorf("%s(%s): %v, want accepted", ctor, o.name, err)
			case !reads && err == nil:
				t.Errorf("%s(%s) accepted an option it does not read", ctor, o.name)
			case !reads && !errors.Is(err, throttle.ErrInvalid):
				t.Errorf("%s(%s): %v, want an error matching throttle.ErrInvalid", ctor, o.name, err)
			case !reads && (!strings.Contains(err.Error(), o.name) || !strings.Contains(err.Error(), ctor)):
				t.Errorf("%s(%s): %q does not name the option and the constructor", ctor, o.name, err)
			}
		}
	}
	if err := ctors["NewLocal"](nil); err != nil {
		t.Errorf("a nil option: %v, want ignored", err)
	}
}

// TestMisplacedOptions builds testdata/misplaced_options.go, whose lines
// marked `// want "..."` give an option to a constructor that does not
// read it, and checks that the compiler refuses exactly those lines, each
// with the error named: an option of package throttle given to a
// constructor of another package does not compile.
func TestMisplacedOptions(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program with the go command")
	}
	const file = "testdata/misplaced_options.go"
	want := map[int]string{}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	wantRE := regexp.MustCompile(`// want "([^"]+)"`)
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		if m := wantRE.FindStringSubmatch(sc.Text()); m != nil {
			want[line] = m[1]
		}
	}
	f.Close()
	if len(want) < 2 {
		t.Fatalf("%s: only %d lines marked want", file, len(want))
	}

	goCmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.Command(goCmd, "build", "-gcflags=-e", "-o", os.DevNull, file)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("%s compiled; every misplaced option should have been refused", file)
	}
	got := map[int]string{}
	errRE := regexp.MustCompile(`misplaced_options\.go:(\d+):\d+: (.*)`)
	for _, l := range strings.Split(string(out), "\n") {
		if m := errRE.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			got[n] += m[2]
		}
	}
	for line, msg := range want {
		if !strings.Contains(got[line], msg) {
			t.Errorf("%s:%d: error %q, want one containing %q", file, line, got[line], msg)
		}
	}
	for line, msg := range got {
		if _, ok := want[line]; !ok {
			t.Errorf("%s:%d: unexpected error %q (an option where it belongs was refused)", file, line, msg)
		}
	}
}
