package redisenv

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/redis/go-redis/v9"
)

// clientLogLines is how many lines of go-redis's own log a test process
// prints in full; after that it prints one line in every clientLogEvery.
const (
	clientLogLines = 5
	clientLogEvery = 1000
)

// quietClientLog replaces go-redis's process-wide logger, once, with one that
// keeps the first few lines and then a sample. Tests that pause, kill or
// restart a server make every pooled connection log each failed dial: tens
// of thousands of identical lines that bury the test's own failure message
// in a CI log cut to its last kilobytes.
var quietClientLog = sync.OnceFunc(func() { redis.SetLogger(&sampledLog{}) })

// sampledLog is a go-redis logger that prints to stderr the first
// clientLogLines lines and then one line in every clientLogEvery, saying how
// many it left out.
type sampledLog struct {
	mu sync.Mutex
	n  int
}

func (l *sampledLog) Printf(_ context.Context, format string, v ...any) {
	l.mu.Lock()
	l.n++
	n := l.n
	l.mu.Unlock()
	switch {
	case n <= clientLogLines:
		fmt.Fprintf(os.Stderr, "redis: "+format+"\n", v...)
	case (n-clientLogLines)%clientLogEvery == 0:
		fmt.Fprintf(os.Stderr, "redis: (%d similar client log lines left out) "+format+"\n", append([]any{clientLogEvery - 1}, v...)...)
	}
}

// QuietLogs makes slog's default logger print only errors, for a test
// binary's TestMain, unless HEADWAY_TEST_LOG is set (then it prints from
// debug on). The library logs each outage's start and end at warn and
// info; the fault tests cause hundreds, and a CI log cut to its last
// kilobytes would show those instead of the failing test's message.
func QuietLogs() {
	level := slog.LevelError
	if os.Getenv("HEADWAY_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
}
