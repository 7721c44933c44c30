package redisenv

import (
	"bytes"
	"fmt"
	"os"
	"syscall"
)

// sysProcAttr puts redis-server in its own process group, so a terminal's
// signals reach only the test binary, and has the kernel kill it if the test
// binary dies without calling Close.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

func signalStop(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }
func signalCont(p *os.Process) error { return p.Signal(syscall.SIGCONT) }

// processStopped reports whether the process is stopped by a signal, from
// the state field of /proc/PID/stat.
func processStopped(pid int) (bool, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false, err
	}
	// The state follows the command name, which is in parentheses and may
	// itself contain them.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 >= len(data) {
		return false, fmt.Errorf("unexpected /proc/%d/stat: %q", pid, data)
	}
	return data[i+2] == 'T', nil
}
