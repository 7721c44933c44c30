// Package redisenv starts throwaway Redis servers for headway's own tests and
// example programs. It is not part of headway's API and users should not
// import it.
//
// [Start] runs a real redis-server on a free 127.0.0.1 port in a fresh
// temporary directory, with persistence off. When no redis-server binary is
// installed, Start falls back to an in-process stand-in built on miniredis,
// says so once through log/slog at WARN level, and [Server.Kind] reports it;
// setting HEADWAY_REQUIRE_REDIS=1 turns that fallback into an error, which is
// what CI does. [StartCluster] runs a real three-master Redis Cluster and has
// no stand-in.
//
// [New] and [NewCluster] are the forms tests use: they take a [testing.TB],
// register Close with t.Cleanup and fail (or, for a cluster without a binary,
// skip) the test when the server cannot start.
//
// Every process the package starts is killed and reaped by Close, and every
// goroutine it starts ends by then, so tests can run goleak.
package redisenv
