package throttle_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestMisplacedOptions builds testdata/misplaced_options.go, whose lines
// marked `// want "..."` give an option to a constructor that does not
// read it, and checks that the compiler refuses exactly those lines, each
// with the error named. Options are typed per constructor so that such a
// mistake is caught here rather than ignored at run time.
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
	if len(want) < 10 {
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
