//go:build unix && !linux

package main

import (
	"os"
	"syscall"
)

// sysProcAttr puts a child in its own process group, so that a terminal's
// signals reach only the parent, which stops the children itself.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func stopProcess(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }
func contProcess(p *os.Process) error { return p.Signal(syscall.SIGCONT) }
