package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat: USER_HZ,
// 100 on Linux (sysconf(_SC_CLK_TCK), which Go cannot ask without cgo).
const clockTick = 10 * time.Millisecond

// procCPU returns the CPU time (user and system, all threads) that process
// pid has used so far, from /proc/<pid>/stat: Linux only.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads utime and stime, fields 14 and 15 of a /proc/<pid>/stat
// line. Field 2, the command in parentheses, may hold spaces and
// parentheses itself: the fields are counted after its last ')'.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat %q: no command field", stat)
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3, the state
	if len(f) < 13 {
		return 0, fmt.Errorf("stat %q: %d fields after the command, want at least 13", stat, len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("stat: CPU time %q: not a count of ticks", s)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}

// redisPID returns the pid of the redis-server at addr when it runs on this
// machine, as INFO reports it and /proc confirms (a redis-server by that
// pid); 0 when it cannot be told.
func redisPID(ctx context.Context, addr string) int {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return 0
	}
	for l := range strings.SplitSeq(info, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(l), "process_id:")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(v)
		if err != nil {
			return 0
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || !strings.HasPrefix(string(comm), "redis-server") {
			return 0
		}
		return pid
	}
	return 0
}

// cpuMeter reads the CPU time of the processes one contender's run keeps
// busy: this one (the callers, and Gubernator's daemons, which run in it)
// and, for a contender on Redis, the redis-server.
type cpuMeter struct{ pids []int }

// newCPUMeter measures this process and, when useRedis, the redis-server
// of pid redisPID; a meter of nothing (which reads nothing) when that pid
// is not known.
func newCPUMeter(useRedis bool, redisPID int) cpuMeter {
	if !useRedis {
		return cpuMeter{pids: []int{os.Getpid()}}
	}
	if redisPID == 0 {
		return cpuMeter{}
	}
	return cpuMeter{pids: []int{os.Getpid(), redisPID}}
}

// read returns their CPU time so far, and false when it cannot be read.
func (m cpuMeter) read() (time.Duration, bool) {
	if len(m.pids) == 0 {
		return 0, false
	}
	var sum time.Duration
	for _, pid := range m.pids {
		d, err := procCPU(pid)
		if err != nil {
			return 0, false
		}
		sum += d
	}
	return sum, true
}
