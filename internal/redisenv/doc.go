// Package redisenv starts throwaway Redis servers for headway's own tests and
// example programs. It is not part of headway's API and users should not
// import it.
//
// [Start] runs a real redis-server on a free 127.0.0.1 port in a fresh
// temporary directory, with persistence off. When no redis-server binary is
// installed, Start falls back to an in-process stand-in built on miniredis,
// says so once through log/slog at WARN level, and [Server.Kind] reports it;
// setting HEADWAY_REQUIRE_REDIS=1 ([RequireEnv]) turns that fallback into an
// error, which is what CI does, and HEADWAY_REDIS_STANDIN=1 ([StandInEnv])
// forces it even when redis-server is installed, which CI also does in a
// second run to prove the path of a machine with only Go. [StartCluster]
// runs a real three-master Redis Cluster and has no stand-in.
//
// The stand-in keeps Redis's time: keys expire as the wall clock passes and
// TIME (in Lua too) is the wall clock, read as a command arrives and
// standing still while it runs, so that a key a script sees alive stays
// alive until it ends, as in Redis; so the buckets' server-clock
// guarantees hold on it. Tests that need a real process (to pause it with
// SIGSTOP, kill or restart it, or to form a Cluster) call [NeedReal] or
// [NewCluster], which skip on the stand-in saying what to install, and fail
// under HEADWAY_REQUIRE_REDIS=1.
//
// [Server.AddUser] and [NewUser] make a Redis ACL user as a managed
// service gives one (only the listed commands and keys, no channel
// rights), for tests of what headway needs of Redis.
//
// [New] and [NewCluster] are the forms tests use: they take a [testing.TB],
// register Close with t.Cleanup and fail (or, for a cluster without a binary,
// skip) the test when the server cannot start. They also sample go-redis's
// own log (the first lines, then one in a thousand): a test that pauses or
// restarts a server would otherwise print every failed dial of every pooled
// connection and bury its own failure message.
//
// Every process the package starts is killed and reaped by Close, and every
// goroutine it starts ends by then, so tests can run goleak.
package redisenv
