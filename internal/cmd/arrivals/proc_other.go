//go:build !unix

package main

import (
	"errors"
	"os"
	"syscall"
)

var errNoStop = errors.New("-stop needs SIGSTOP and SIGCONT, which this OS lacks")

func sysProcAttr() *syscall.SysProcAttr { return nil }

func stopProcess(*os.Process) error { return errNoStop }
func contProcess(*os.Process) error { return errNoStop }
