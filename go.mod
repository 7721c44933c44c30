module github.com/headway-go/headway

go 1.26.0

require github.com/jonboulle/clockwork v0.5.0
