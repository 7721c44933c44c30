// Package docscheck reads the Markdown files of the repository (README.md
// and docs/*.md) for what a reader would run or paste: the go commands of
// their sh blocks, and their Go blocks that are whole programs. Its test
// checks that each command names packages, flags and tests that exist, and
// that each program compiles, so that the docs cannot drift from the code.
package docscheck

import (
	"bufio"
	"fmt"
	"strings"
)

// Command is one go command found in a sh block.
type Command struct {
	File string // the Markdown file, as given to Extract
	Line int    // 1-based line of the command in File
	Text string // the line as written
	Dir  string // directory the command runs in, relative to the repository root ("." unless the line starts with "cd dir &&")
	Sub  string // run, test, build, vet or list
	// Pkgs are the package arguments (./x, ./x/..., or . after cd).
	Pkgs []string
	// Flags are the go tool's own flags with their values (-run, -bench,
	// -fuzz, ...), by name without the dash; boolean flags map to "".
	Flags map[string]string
	// Args are the program's arguments after the package of a go run.
	Args []string
}

// ProgFlags returns the names of the flags a go run passes to its program
// (-name, -name=value, --name), without dashes or values.
func (c Command) ProgFlags() []string {
	var names []string
	for _, a := range c.Args {
		if !strings.HasPrefix(a, "-") || a == "-" {
			continue
		}
		name := strings.TrimLeft(a, "-")
		if i := strings.IndexByte(name, '='); i >= 0 {
			name = name[:i]
		}
		if name != "" {
			names = append(names, name)
		}
	}
	return names
}

// Program is a Go block that starts with "package main".
type Program struct {
	File   string
	Line   int // 1-based line of the block's first line of code
	Source string
}

// goValueFlags are the go tool's flags (build and test) that take a value.
var goValueFlags = map[string]bool{
	"run": true, "bench": true, "benchtime": true, "count": true, "p": true,
	"fuzz": true, "fuzztime": true, "timeout": true, "parallel": true,
	"cpu": true, "tags": true, "o": true, "skip": true, "list": true,
	"ldflags": true, "gcflags": true, "mod": true, "coverprofile": true,
	"cpuprofile": true, "memprofile": true, "shuffle": true,
}

// Extract returns the go commands of the sh blocks of a Markdown text and
// its Go blocks that are whole programs. Lines of an sh block that are not
// go commands (or that run something else, such as docker) are left out;
// a go command it cannot read is an error, naming its line.
func Extract(file, text string) ([]Command, []Program, error) {
	var (
		cmds     []Command
		progs    []Program
		fence    string // the info string of the open block, "" outside one
		inBlock  bool
		block    []string
		blockAt  int
		lineNo   int
		firstErr error
	)
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			if !inBlock {
				inBlock, fence, block, blockAt = true, strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), nil, lineNo+1
				continue
			}
			inBlock = false
			switch fence {
			case "go":
				if len(block) > 0 && strings.HasPrefix(strings.TrimSpace(firstCode(block)), "package main") {
					progs = append(progs, Program{File: file, Line: blockAt, Source: strings.Join(block, "\n") + "\n"})
				}
			case "sh", "bash", "shell":
				for i, l := range block {
					c, ok, err := parseCommand(l)
					if err != nil && firstErr == nil {
						firstErr = fmt.Errorf("%s:%d: %w", file, blockAt+i, err)
					}
					if ok {
						c.File, c.Line, c.Text = file, blockAt+i, strings.TrimSpace(l)
						cmds = append(cmds, c)
					}
				}
			}
			continue
		}
		if inBlock {
			block = append(block, line)
		}
	}
	if inBlock && firstErr == nil {
		firstErr = fmt.Errorf("%s:%d: a code block is never closed", file, blockAt-1)
	}
	return cmds, progs, firstErr
}

// firstCode returns the first line of a block that is neither blank nor a
// comment.
func firstCode(block []string) string {
	for _, l := range block {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "//") {
			continue
		}
		return t
	}
	return ""
}

// parseCommand reads one line of an sh block. ok is false for a line that
// is not a go command.
func parseCommand(line string) (c Command, ok bool, err error) {
	words, err := splitWords(line)
	if err != nil {
		return c, false, err
	}
	c.Dir = "."
	// cd dir && ...
	if len(words) >= 3 && words[0] == "cd" && words[2] == "&&" {
		c.Dir = words[1]
		words = words[3:]
	}
	// Leading VAR=value assignments.
	for len(words) > 0 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-") {
		words = words[1:]
	}
	// A trailing & runs it in the background; the rest of an && or ; chain
	// is not read.
	for i, w := range words {
		if w == "&" || w == "&&" || w == ";" || w == "|" {
			words = words[:i]
			break
		}
	}
	if len(words) < 2 || words[0] != "go" {
		return c, false, nil
	}
	c.Sub = words[1]
	switch c.Sub {
	case "run", "test", "build", "vet", "list":
	default:
		return c, false, nil
	}
	c.Flags = map[string]string{}
	rest := words[2:]
	for len(rest) > 0 {
		w := rest[0]
		if !strings.HasPrefix(w, "-") {
			break
		}
		name := strings.TrimLeft(w, "-")
		rest = rest[1:]
		if i := strings.IndexByte(name, '='); i >= 0 {
			c.Flags[name[:i]] = name[i+1:]
			continue
		}
		if goValueFlags[name] {
			if len(rest) == 0 {
				return c, false, fmt.Errorf("go %s: flag -%s has no value", c.Sub, name)
			}
			c.Flags[name], rest = rest[0], rest[1:]
			continue
		}
		c.Flags[name] = ""
	}
	if c.Sub == "run" {
		if len(rest) == 0 {
			return c, false, fmt.Errorf("go run names no package")
		}
		c.Pkgs, c.Args = rest[:1], rest[1:]
	} else {
		c.Pkgs = rest
	}
	if len(c.Pkgs) == 0 {
		return c, false, fmt.Errorf("go %s names no package", c.Sub)
	}
	for _, p := range c.Pkgs {
		if p != "." && !strings.HasPrefix(p, "./") {
			return c, false, fmt.Errorf("go %s: %q is not a relative package path (./...)", c.Sub, p)
		}
	}
	return c, true, nil
}

// splitWords splits a shell line into words: single and double quotes
// group, a # outside quotes starts a comment.
func splitWords(line string) ([]string, error) {
	var (
		words []string
		cur   strings.Builder
		in    bool // cur holds a word
		quote rune
	)
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
				continue
			}
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == '#' && !in:
			return words, nil
		case r == ' ' || r == '\t':
			if in {
				words, in = append(words, cur.String()), false
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unclosed quote in %q", line)
	}
	if in {
		words = append(words, cur.String())
	}
	return words, nil
}
