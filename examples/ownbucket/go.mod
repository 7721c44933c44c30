module example.com/ownbucket

go 1.26.0

replace github.com/headway-go/headway => ../..

require (
	github.com/headway-go/headway v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
)

require github.com/jonboulle/clockwork v0.5.0 // indirect
