package docscheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// root is the repository's root, seen from this package's directory.
const root = "../.."

// docFiles returns README.md and docs/*.md, relative to root.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(more) == 0 {
		t.Fatal("no docs/*.md found")
	}
	for _, f := range more {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, rel)
	}
	return files
}

func extractAll(t *testing.T) ([]Command, []Program) {
	t.Helper()
	var cmds []Command
	var progs []Program
	for _, f := range docFiles(t) {
		text, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		c, p, err := Extract(f, string(text))
		if err != nil {
			t.Error(err)
		}
		cmds = append(cmds, c...)
		progs = append(progs, p...)
	}
	return cmds, progs
}

// TestReadmeKeepsItsShape checks what a new reader relies on: the README is
// short, shows Go code early, and names the two commands CI runs.
func TestReadmeKeepsItsShape(t *testing.T) {
	text, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(text), "\n")
	if n := len(lines); n > 301 { // a final newline leaves one empty element
		t.Errorf("README.md has %d lines; keep it at most 300 (move the detail to docs/)", n-1)
	}
	first := -1
	for i, l := range lines {
		if strings.TrimSpace(l) == "```go" {
			first = i + 1
			break
		}
	}
	if first < 0 || first > 80 {
		t.Errorf("README.md's first Go block is at line %d; it must be within the first 80", first)
	}
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"go run ./examples/pipeline", "go test -race -count=1 -p 4 ./..."} {
		if !bytes.Contains(text, []byte(c)) {
			t.Errorf("README.md does not show %q", c)
		}
		if !bytes.Contains(ci, []byte(c)) {
			t.Errorf(".ci/run does not run %q, which the README shows", c)
		}
	}
}

// TestDocCommandsNameWhatExists checks every go command of the README's and
// docs' sh blocks: its packages exist and load without errors (go list), a
// go run names a main package and only flags the program defines, and the
// -run, -bench and -fuzz patterns of a go test match a test of its packages.
func TestDocCommandsNameWhatExists(t *testing.T) {
	cmds, _ := extractAll(t)
	if len(cmds) < 20 {
		t.Fatalf("found %d go commands in README.md and docs/; expected at least 20 (is the extraction broken?)", len(cmds))
	}

	// One go list per directory the commands run in.
	byDir := map[string][]string{}
	for _, c := range cmds {
		byDir[c.Dir] = append(byDir[c.Dir], c.Pkgs...)
	}
	patterns := map[string][]listedPkg{} // by dir and pattern
	for dir, pkgs := range byDir {
		pkgs = unique(pkgs)
		abs, err := filepath.Abs(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		listed := goList(t, abs, pkgs...)
		for _, p := range pkgs {
			base, all := strings.CutSuffix(p, "/...")
			base = filepath.Join(abs, base)
			for _, l := range listed {
				if l.Dir == base || all && strings.HasPrefix(l.Dir, base+string(filepath.Separator)) {
					patterns[dir+"\x00"+p] = append(patterns[dir+"\x00"+p], l)
				}
			}
		}
	}

	for _, c := range cmds {
		where := fmt.Sprintf("%s:%d: %s", c.File, c.Line, c.Text)
		for _, p := range c.Pkgs {
			pl := patterns[c.Dir+"\x00"+p]
			if len(pl) == 0 {
				t.Errorf("%s\n\t%s matches no package", where, p)
				continue
			}
			for _, l := range pl {
				if msg := l.problem(); msg != "" {
					t.Errorf("%s\n\t%s: %s", where, l.ImportPath, msg)
				}
				if c.Sub == "run" && l.Name != "main" {
					t.Errorf("%s\n\t%s is package %s, not a program", where, l.ImportPath, l.Name)
				}
			}
			if c.Sub == "run" && len(pl) == 1 {
				defined := stringLiterals(t, pl[0].Dir)
				for _, f := range c.ProgFlags() {
					if !defined[f] {
						t.Errorf("%s\n\tflag -%s: %s defines no flag of that name", where, f, pl[0].ImportPath)
					}
				}
			}
		}
		if c.Sub != "test" {
			continue
		}
		var names []string
		for _, p := range c.Pkgs {
			for _, l := range patterns[c.Dir+"\x00"+p] {
				names = append(names, testFuncs(t, l.Dir)...)
			}
		}
		for flag, prefixes := range map[string][]string{
			"run":   {"Test", "Example", "Fuzz"},
			"bench": {"Benchmark"},
			"fuzz":  {"Fuzz"},
		} {
			pat, ok := c.Flags[flag]
			if !ok {
				continue
			}
			if msg := matchesSome(pat, prefixes, names); msg != "" {
				t.Errorf("%s\n\t-%s %s: %s", where, flag, pat, msg)
			}
		}
	}
}

// TestDocProgramsCompile builds every Go block of the README and docs that
// is a whole program (starts with "package main"), in this module, so that
// what a reader pastes compiles against the API as it is.
func TestDocProgramsCompile(t *testing.T) {
	_, progs := extractAll(t)
	readme := 0
	for _, p := range progs {
		if p.File == "README.md" {
			readme++
		}
	}
	if readme < 4 {
		t.Fatalf("README.md has %d Go blocks that are whole programs; expected its 4 recipes", readme)
	}
	absRoot, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	overlay := map[string]string{}
	var pkgs []string
	where := map[string]Program{} // the overlay's file name → its block
	for i, p := range progs {
		if f, err := format.Source([]byte(p.Source)); err == nil && string(f) != p.Source {
			t.Errorf("%s:%d: the program is not gofmt'ed", p.File, p.Line)
		}
		src := filepath.Join(tmp, fmt.Sprintf("prog%d.go", i))
		if err := os.WriteFile(src, []byte(p.Source), 0o600); err != nil {
			t.Fatal(err)
		}
		// A directory under testdata, which no ./... pattern matches; it
		// exists only in the overlay.
		rel := fmt.Sprintf("internal/docscheck/testdata/docprog%d", i)
		overlay[filepath.Join(absRoot, rel, "main.go")] = src
		pkgs = append(pkgs, "./"+rel)
		where[filepath.Base(src)] = p
	}
	ov, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	ovFile := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ovFile, ov, 0o600); err != nil {
		t.Fatal(err)
	}
	// Several packages at once: go build compiles them and discards the
	// result. (go vet cannot run in a directory that exists only in the
	// overlay.)
	_, diag, err := goCmd(t, absRoot, append([]string{"build", "-overlay", ovFile}, pkgs...)...)
	if err != nil {
		t.Errorf("the docs' programs do not compile (%v):\n%s", err, translate(diag, where))
	}
}

// translate rewrites "…/progN.go:L:C" in the go tool's output into the
// Markdown file and line the code came from.
func translate(out string, where map[string]Program) string {
	re := regexp.MustCompile(`\S*/(prog\d+\.go):(\d+)(:\d+)?`)
	return re.ReplaceAllStringFunc(out, func(m string) string {
		s := re.FindStringSubmatch(m)
		p, ok := where[s[1]]
		if !ok {
			return m
		}
		n, _ := strconv.Atoi(s[2])
		return fmt.Sprintf("%s:%d", p.File, p.Line+n-1)
	})
}

// TestExtract checks the reading of commands and programs on a sample.
func TestExtract(t *testing.T) {
	md := "text `go run ./not/a/command`\n" +
		"```sh\n" +
		"go run ./examples/pipeline -records 600 -limit=5   # a comment\n" +
		"HEADWAY_REDIS_STANDIN=1 go test -race -run 'TestA|TestB' -count=1 ./bucket/ ./throttle/...\n" +
		"cd internal/cmd/compare && go run . -rounds 3\n" +
		"go run ./examples/provider &\n" +
		"docker compose up -d\n" +
		"```\n" +
		"```go\n" +
		"// a comment first\n" +
		"package main\n" +
		"\n" +
		"func main() {}\n" +
		"```\n" +
		"```go\n" +
		"lim := throttle.New(b)\n" +
		"```\n" +
		"```\n" +
		"go run ./in/an/output/block\n" +
		"```\n"
	cmds, progs, err := Extract("x.md", md)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		Line  int
		Dir   string
		Sub   string
		Pkgs  []string
		Flags map[string]string
		Args  []string
	}
	var have []got
	for _, c := range cmds {
		have = append(have, got{c.Line, c.Dir, c.Sub, c.Pkgs, c.Flags, c.Args})
	}
	want := []got{
		{3, ".", "run", []string{"./examples/pipeline"}, map[string]string{}, []string{"-records", "600", "-limit=5"}},
		{4, ".", "test", []string{"./bucket/", "./throttle/..."}, map[string]string{"race": "", "run": "TestA|TestB", "count": "1"}, nil},
		{5, "internal/cmd/compare", "run", []string{"."}, map[string]string{}, []string{"-rounds", "3"}},
		{6, ".", "run", []string{"./examples/provider"}, map[string]string{}, []string{}},
	}
	if !reflect.DeepEqual(have, want) {
		t.Errorf("commands:\n got %+v\nwant %+v", have, want)
	}
	if f := cmds[0].ProgFlags(); !reflect.DeepEqual(f, []string{"records", "limit"}) {
		t.Errorf("ProgFlags = %q, want [records limit]", f)
	}
	if len(progs) != 1 || progs[0].Line != 10 || !strings.Contains(progs[0].Source, "func main() {}") {
		t.Errorf("programs = %+v, want the one block at line 10", progs)
	}

	for _, bad := range []string{
		"```sh\ngo run\n```\n",
		"```sh\ngo test -run\n```\n",
		"```sh\ngo run github.com/x/y\n```\n",
		"```sh\ngo run './x\n```\n",
		"```go\npackage main\n",
	} {
		if _, _, err := Extract("bad.md", bad); err == nil {
			t.Errorf("Extract(%q) found no error", bad)
		}
	}
}

// TestMatchesSome checks the reading of -run and -bench patterns.
func TestMatchesSome(t *testing.T) {
	names := []string{"TestFleetPaused", "BenchmarkFirstTake", "FuzzKeys"}
	for _, c := range []struct {
		pat      string
		prefixes []string
		ok       bool
	}{
		{"^$", []string{"Test"}, true}, // runs nothing, on purpose
		{"TestFleet", []string{"Test"}, true},
		{"TestFleetPaused/local", []string{"Test"}, true},
		{"TestGone", []string{"Test"}, false},
		{"FirstTake|Gone", []string{"Benchmark"}, true},
		{"FirstTake", []string{"Test"}, false},
		{"^FuzzKeys$", []string{"Fuzz"}, true},
		{"(", []string{"Test"}, false},
	} {
		if msg := matchesSome(c.pat, c.prefixes, names); (msg == "") != c.ok {
			t.Errorf("matchesSome(%q, %v) = %q; want ok=%v", c.pat, c.prefixes, msg, c.ok)
		}
	}
}

// matchesSome says what is wrong when pat (a go test -run or -bench
// pattern) matches no name with one of prefixes; "" when it matches one,
// or matches the empty name (a pattern meant to run nothing, such as ^$).
func matchesSome(pat string, prefixes, names []string) string {
	top := strings.Split(pat, "/")[0]
	re, err := regexp.Compile(top)
	if err != nil {
		return "not a regular expression: " + err.Error()
	}
	if re.MatchString("") {
		return ""
	}
	for _, n := range names {
		for _, p := range prefixes {
			if strings.HasPrefix(n, p) && re.MatchString(n) {
				return ""
			}
		}
	}
	return fmt.Sprintf("matches no %s function of the package", strings.Join(prefixes, "/"))
}

type listedPkg struct {
	ImportPath string
	Dir        string
	Name       string
	Error      *struct{ Err string }
	DepsErrors []struct{ Err string }
}

func (l listedPkg) problem() string {
	if l.Error != nil {
		return l.Error.Err
	}
	if len(l.DepsErrors) > 0 {
		return l.DepsErrors[0].Err
	}
	return ""
}

// goList lists the packages that patterns name, run in dir.
func goList(t *testing.T, dir string, patterns ...string) []listedPkg {
	t.Helper()
	out, diag, err := goCmd(t, dir, append([]string{"list", "-e", "-json=ImportPath,Dir,Name,Error,DepsErrors"}, patterns...)...)
	if err != nil {
		t.Errorf("go list %s in %s: %v\n%s", patterns, dir, err, diag)
		return nil
	}
	var pkgs []listedPkg
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var p listedPkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list %s: %v", patterns, err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// goCmd runs the go command in dir and returns what it wrote to stdout,
// the only data a caller may parse, and to stderr, which is for people:
// on a machine with an empty module cache it starts with "go: downloading"
// lines.
func goCmd(t *testing.T, dir string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	// On a fresh machine the go command downloads and builds every
	// dependency first: allow it the test's own time.
	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Minute)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(-10*time.Second))
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=") // the user's flags (-race, -mod) are not the docs'
	var out, diag strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &diag
	err = cmd.Run()
	return out.String(), diag.String(), err
}

// stringLiterals returns the string literals of a directory's non-test Go
// files: a flag a program defines appears among them by its name.
func stringLiterals(t *testing.T, dir string) map[string]bool {
	t.Helper()
	lits := map[string]bool{}
	forEachFile(t, dir, false, func(f *ast.File) {
		ast.Inspect(f, func(n ast.Node) bool {
			if b, ok := n.(*ast.BasicLit); ok && b.Kind == token.STRING {
				if s, err := strconv.Unquote(b.Value); err == nil {
					lits[s] = true
				}
			}
			return true
		})
	})
	return lits
}

// testFuncs returns the names of the top-level functions of a directory's
// test files.
func testFuncs(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	forEachFile(t, dir, true, func(f *ast.File) {
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil {
				names = append(names, fn.Name.Name)
			}
		}
	})
	sort.Strings(names)
	return names
}

func forEachFile(t *testing.T, dir string, tests bool, fn func(*ast.File)) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") != tests {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("parse %s: %v", name, err)
		}
		fn(f)
	}
}

func unique(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
