package buildinfo

import (
	"runtime/debug"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestVersionOf(t *testing.T) {
	for _, tt := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"main module", debug.BuildInfo{Main: debug.Module{Path: Module, Version: "(devel)"}}, "(devel)"},
		{"dependency", debug.BuildInfo{Main: debug.Module{Path: "example.com/app"}, Deps: []*debug.Module{{Path: "other", Version: "v9"}, {Path: Module, Version: "v0.3.1"}}}, "v0.3.1"},
		{"replaced", debug.BuildInfo{Main: debug.Module{Path: "example.com/app"}, Deps: []*debug.Module{{Path: Module, Version: "v0.3.1", Replace: &debug.Module{Path: "../headway", Version: "v0.3.2"}}}}, "v0.3.2"},
		{"absent", debug.BuildInfo{Main: debug.Module{Path: "example.com/app"}}, ""},
	} {
		if got := versionOf(&tt.bi); got != tt.want {
			t.Errorf("%s: versionOf = %q, want %q", tt.name, got, tt.want)
		}
	}
	if Version() == "" {
		t.Error("Version() is empty in a test binary of the module itself")
	}
}
