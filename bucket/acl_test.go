package bucket

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle/buckettest"
)

// redisCommands are the Redis commands the package needs, as ACL SETUSER
// names them: the scripts' own commands (a script runs each under the
// caller's user), the scripts' loading, the Go side's few direct calls
// (live limits, state, the cap's subscription and its health check, the
// cap's Check), and Redsync's for the Counter's Resetter. The ACL tests
// run under a user with exactly these; docs/operations.md ("Redis user
// and commands") states the same list, and TestRedisCommandsAreDocumented
// checks it against this one and against the scripts.
var redisCommands = []string{
	// Scripts: EVALSHA, EVAL after NOSCRIPT, SCRIPT LOAD.
	"evalsha", "eval", "script|load",
	// Inside the scripts, and the few direct calls.
	"time", "get", "set", "del", "exists", "type", "incr", "incrby", "decrby",
	"pexpire", "pttl", "hget", "hgetall", "hmget", "hset", "hincrby",
	"zadd", "zcard", "zcount", "zpopmin", "zrange", "zrangebyscore", "zrem",
	"zremrangebyscore", "zscore",
	// The schedules of the TokenBucket and the Budget (schedule.lua).
	"lindex", "llen", "lrange", "lset", "lpush", "rpush", "ltrim",
	// The Concurrency cap's wake-ups: PUBLISH (scripts, Check), its
	// subscription and the subscription's health check.
	"publish", "subscribe", "ping",
}

// managedUser is the Redis user of the ACL tests: as a managed service
// gives one, no channel rights (Redis 7's acl-pubsub-default), only the
// keys under the default prefix and only redisCommands.
func managedUser(t *testing.T, srv *redisenv.Server) func() redis.UniversalClient {
	t.Helper()
	u := redisenv.User{Name: "headway", Password: "secret", Commands: redisCommands, Keys: []string{defaultPrefix + ":*"}}
	redisenv.NewUser(t, srv, u)
	return func() redis.UniversalClient { return srv.UserClient(u) }
}

// TestConformanceUnderACLUser runs the conformance suite of every bucket
// under a Redis user with only the documented commands, keys under the
// prefix, and no channel: a missing command would fail a take (NOPERM).
func TestConformanceUnderACLUser(t *testing.T) {
	t.Parallel()
	srv := redisenv.New(t)
	client := managedUser(t, srv)
	for name, spec := range conformanceSpecs(client) {
		t.Run(name, func(t *testing.T) { buckettest.Run(t, spec) })
	}
}

// TestConcurrencyGuaranteesUnderACLUser runs the cap's guarantee checks
// under a Redis user with only the documented commands and no channel
// rights: no wake-up arrives, and every guarantee still holds, waiters
// told of their slots by their renewals (a 300 ms lease: every 100 ms).
func TestConcurrencyGuaranteesUnderACLUser(t *testing.T) {
	t.Parallel()
	srv := redisenv.New(t)
	env := capEnv{client: managedUser(t, srv), admin: srv.Client(), addr: srv.Addr(), opts: []ConcurrencyOption{WithLease(300 * time.Millisecond)}, rounds: 5}
	t.Run("NeverMoreThanCapacity", func(t *testing.T) { checkNeverMoreThanCapacity(t, env) })
	t.Run("ArrivalOrder", func(t *testing.T) { checkArrivalOrder(t, env) })
	t.Run("DeadHolder", func(t *testing.T) { checkDeadHolder(t, env) })
	t.Run("DeadWaiter", func(t *testing.T) { checkDeadWaiter(t, env) })
	t.Run("GivingUp", func(t *testing.T) { checkGivingUp(t, env) })
}

// TestRedisCommandsAreDocumented: the ACL SETUSER line of
// docs/operations.md ("Redis user and commands") allows exactly
// redisCommands, with no channel, and every command the Lua scripts call
// is among them.
func TestRedisCommandsAreDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Redis user and commands\n")
	if !ok {
		t.Fatal(`docs/operations.md has no section "## Redis user and commands"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var line string
	for l := range strings.Lines(section) {
		if strings.HasPrefix(l, "ACL SETUSER ") {
			line = l
			break
		}
	}
	if line == "" {
		t.Fatal(`section "Redis user and commands" has no line starting "ACL SETUSER "`)
	}
	var documented []string
	for _, f := range strings.Fields(line) {
		if c, ok := strings.CutPrefix(f, "+"); ok {
			documented = append(documented, c)
		}
		if strings.HasPrefix(f, "&") || f == "allchannels" {
			t.Errorf("the documented user has channel rights (%s): the required list must work without", f)
		}
	}
	if !slices.Contains(strings.Fields(line), "resetchannels") {
		t.Errorf("the documented user must say resetchannels: %s", line)
	}
	want := slices.Sorted(slices.Values(redisCommands))
	slices.Sort(documented)
	if !slices.Equal(documented, want) {
		t.Errorf("docs/operations.md allows %v;\nthe ACL tests' redisCommands are %v", documented, want)
	}
	// Every command a script calls is listed.
	files, err := filepath.Glob("lua/*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts found: %v", err)
	}
	call := regexp.MustCompile(`redis\.p?call\(\s*['"]([A-Za-z]+)['"]`)
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range call.FindAllStringSubmatch(string(src), -1) {
			if c := strings.ToLower(m[1]); !slices.Contains(redisCommands, c) {
				t.Errorf("%s calls %s, which redisCommands (and docs/operations.md) do not list", f, m[1])
			}
		}
	}
}
