package bucket

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/headway-go/headway/internal/redisenv"
)

// TestMain quiets the library's logs (HEADWAY_TEST_LOG=1 shows them) and
// fails the package if any goroutine outlives its tests.
//
// The tests that wait on real durations (a fault, a lease, a failover)
// call t.Parallel: each starts servers of its own, and two of them side
// by side halve the package's time. Two kinds do not, and run first,
// alone: the load tests (many greedy callers: TestGuarantees,
// TestCrowdOnOneKey, TestRestart, the leased fleets and the like), and
// the tests that judge their callers with the process's measured
// lateness (the stall meter: TestRedisPausedUnderLoad,
// TestFleetPausedStaysWithinTheLimit, TestLiveLimitChange). Beside
// another test's greedy callers, a caller waits behind dozens of
// runnable goroutines at each of its wake-ups, several times what the
// stall meter measures as one stall.
func TestMain(m *testing.M) {
	redisenv.QuietLogs()
	goleak.VerifyTestMain(m)
}
