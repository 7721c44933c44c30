//go:build unix && !linux

package redisenv

import (
	"os"
	"syscall"
)

// sysProcAttr puts redis-server in its own process group, so a terminal's
// signals reach only the test binary.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func signalStop(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }
func signalCont(p *os.Process) error { return p.Signal(syscall.SIGCONT) }

// processStopped cannot observe the state here; signal delivery to a local
// process is prompt enough that reporting what was asked for is close.
func processStopped(int) (bool, error) { return false, errStateUnknown }
