package bucket

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts, one per file under lua/, each with a header comment
// giving its KEYS/ARGV contract and its guarantee; a script built on a
// library file (schedule.lua) is that file and its own, in that order
// (uses). Most go out through eval or evalNoRetry (call.go), heartbeat.lua
// as plain EVAL (call.go); the others with Script.Run (EVALSHA, and EVAL
// after NOSCRIPT: a restart, a failover).
var (
	//go:embed lua/schedule.lua
	srcSchedule string
	//go:embed lua/pause.lua
	srcPause string
	//go:embed lua/tb_take.lua
	srcTBTake string
	//go:embed lua/tb_giveback.lua
	srcTBGiveBack string
	//go:embed lua/window.lua
	srcWindow string
	//go:embed lua/sliding.lua
	srcSliding string
	//go:embed lua/gcra.lua
	srcGCRA string
	//go:embed lua/counter_take.lua
	srcCounterTake string
	//go:embed lua/counter_reset.lua
	srcCounterReset string
	//go:embed lua/state.lua
	srcState string
	//go:embed lua/budget.lua
	srcBudget string

	scriptPause        = redis.NewScript(srcPause)
	scriptTBTake       = redis.NewScript(srcSchedule + srcTBTake)
	scriptTBGiveBack   = redis.NewScript(srcSchedule + srcTBGiveBack)
	scriptWindow       = redis.NewScript(srcWindow)
	scriptSliding      = redis.NewScript(srcSliding)
	scriptGCRA         = redis.NewScript(srcGCRA)
	scriptCounterTake  = redis.NewScript(srcCounterTake)
	scriptCounterReset = redis.NewScript(srcCounterReset)
	scriptState        = redis.NewScript(srcState)
	scriptBudget       = redis.NewScript(srcSchedule + srcBudget)
)

// uses lists the library files each script built on one is made of,
// before its own, for tests.
var uses = map[string][]string{
	"tb_take.lua":     {"schedule.lua"},
	"tb_giveback.lua": {"schedule.lua"},
	"budget.lua":      {"schedule.lua"},
}

// scripts lists every script by file name, for tests.
var scripts = map[string]*redis.Script{
	"pause.lua":         scriptPause,
	"tb_take.lua":       scriptTBTake,
	"tb_giveback.lua":   scriptTBGiveBack,
	"window.lua":        scriptWindow,
	"sliding.lua":       scriptSliding,
	"gcra.lua":          scriptGCRA,
	"counter_take.lua":  scriptCounterTake,
	"counter_reset.lua": scriptCounterReset,
	"state.lua":         scriptState,
	"budget.lua":        scriptBudget,
}
