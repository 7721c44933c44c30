package main

import (
	"os"
	"syscall"
)

// sysProcAttr puts a child in its own process group, so that a terminal's
// signals reach only the parent (which stops the children itself), and has
// the kernel kill it if the parent dies without stopping it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

func stopProcess(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }
func contProcess(p *os.Process) error { return p.Signal(syscall.SIGCONT) }
