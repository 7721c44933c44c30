//go:build !unix

package redisenv

import (
	"errors"
	"os"
	"syscall"
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

var errNoSignals = errors.New("redisenv: Pause and Resume need SIGSTOP and SIGCONT, which this OS lacks")

func signalStop(*os.Process) error { return errNoSignals }
func signalCont(*os.Process) error { return errNoSignals }

func processStopped(int) (bool, error) { return false, errStateUnknown }
