package bucket

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/headway-go/headway/internal/redisenv"
)

// TestMain quiets the library's logs (HEADWAY_TEST_LOG=1 shows them) and
// fails the package if any goroutine outlives its tests.
func TestMain(m *testing.M) {
	redisenv.QuietLogs()
	goleak.VerifyTestMain(m)
}
