module github.com/headway-go/headway/internal/cmd/compare

go 1.26.0

require (
	github.com/go-redis/redis_rate/v10 v10.0.1
	github.com/go-redsync/redsync/v4 v4.18.1
	github.com/headway-go/headway v0.0.0
	github.com/redis/go-redis/v9 v9.23.0
	golang.org/x/time v0.16.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/jonboulle/clockwork v0.5.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.uber.org/goleak v1.3.0
	golang.org/x/sys v0.48.0 // indirect
)

replace github.com/headway-go/headway => ../../..
