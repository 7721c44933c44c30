package bucket

// redisCommands are the Redis commands the package needs, as ACL SETUSER
// names them: the scripts' own commands (a script runs each under the
// caller's user), the scripts' loading, the Go side's few direct calls
// (live limits, state, the cap's subscription and its health check), and
// Redsync's for the Counter's Resetter. docs/operations.md ("Redis user
// and commands") states the same list; TestOperationsDocListsRedisCommands
// checks both against each other and against the scripts.
var redisCommands = []string{
	// Scripts: EVALSHA, EVAL after NOSCRIPT, SCRIPT LOAD.
	"evalsha", "eval", "script|load",
	// Inside the scripts.
	"time", "get", "set", "del", "exists", "type", "incr", "incrby", "decrby",
	"pexpire", "pttl", "hget", "hgetall", "hmget", "hset", "hincrby",
	"zadd", "zcard", "zcount", "zpopmin", "zrange", "zrangebyscore", "zrem",
	"zremrangebyscore", "zscore", "publish",
	// The Concurrency cap's wake-ups: its subscription and the
	// subscription's health check.
	"subscribe", "ping",
}
