// Package buildinfo tells the module's packages which version of
// headway the running program was built with, for the instrumentation
// scope of its metrics.
package buildinfo

import (
	"runtime/debug"
	"sync"
)

// Module is headway's module path.
const Module = "github.com/headway-go/headway"

var version = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	return versionOf(bi)
})

// Version returns the version of headway the program was built with, as
// the go command recorded it ("v1.2.3", a pseudo-version, or "(devel)"
// when headway is the main module), or "" when the program carries no
// build information.
func Version() string { return version() }

func versionOf(bi *debug.BuildInfo) string {
	if bi.Main.Path == Module {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == Module {
			if d.Replace != nil && d.Replace.Version != "" {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	return ""
}
