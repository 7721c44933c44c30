package main

import (
	"os"
	"runtime"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// Fields 14 and 15 (utime, stime) are 250 and 50 ticks; the command
	// holds spaces and a ')'.
	line := "4242 (redis-server *:6379) x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 50 0 0 20 0 5 0 100 1000000 2000 18446744073709551615"
	got, err := parseStatCPU(line)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3 * time.Second; got != want {
		t.Errorf("CPU = %v, want %v", got, want)
	}
	for _, bad := range []string{"", "12 (x) S 1 2", "12 (x) S 1 2 3 4 5 6 7 8 9 10 ten 12"} {
		if _, err := parseStatCPU(bad); err == nil {
			t.Errorf("parseStatCPU(%q): no error", bad)
		}
	}
}

func TestCPUMeterReadsThisProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	if _, ok := newCPUMeter(true, 0).read(); ok {
		t.Error("a contender on Redis whose redis-server is unknown: CPU read anyway")
	}
	m := newCPUMeter(false, 0)
	before, ok := m.read()
	if !ok {
		t.Fatal("cannot read this process's CPU time")
	}
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	after, _ := m.read()
	if after < before {
		t.Errorf("CPU time went back: %v, then %v", before, after)
	}
	if _, err := procCPU(os.Getpid()); err != nil {
		t.Error(err)
	}
}
