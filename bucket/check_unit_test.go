package bucket

import (
	"testing"
	"time"

	"github.com/headway-go/headway/throttle"
)

// The checkers must catch what they claim to; a checker that passes
// everything would make the load tests worthless.
func TestCheckers(t *testing.T) {
	at := func(ms ...int64) []grant {
		var gs []grant
		for _, m := range ms {
			gs = append(gs, grant{lo: m * 1000, hi: m*1000 + 100})
		}
		return gs
	}
	tests := []struct {
		name  string
		check checker
		gs    []grant
		ok    bool
	}{
		{"periods ok", checkPeriods(2, 100*time.Millisecond, 0), at(0, 1, 100, 101, 200, 201), true},
		{"periods late refill ok", checkPeriods(1, 100*time.Millisecond, 0), at(140, 150, 250), true},
		{"periods second split ok", checkPeriods(2, 100*time.Millisecond, 0), at(0, 100, 150, 199), true},
		{"periods 3 in one", checkPeriods(2, 100*time.Millisecond, 0), at(0, 10, 20), false},
		{"periods refill too soon", checkPeriods(2, 100*time.Millisecond, 0), at(0, 1, 50, 51, 99, 120), false},
		{"windows ok", checkWindows([]throttle.Tier{{Limit: 2, Period: 100 * time.Millisecond}}), at(98, 99, 100, 101), true},
		{"windows 3 in one", checkWindows([]throttle.Tier{{Limit: 2, Period: 100 * time.Millisecond}}), at(100, 150, 199), false},
		{"sliding ok", checkSliding([]throttle.Tier{{Limit: 2, Period: 100 * time.Millisecond}}), at(0, 50, 101, 151), true},
		{"sliding 3 in 100ms", checkSliding([]throttle.Tier{{Limit: 2, Period: 100 * time.Millisecond}}), at(0, 50, 90), false},
		{"gcra ok", checkGCRA(10, 100*time.Millisecond, 2), at(0, 0, 11, 22, 33), true},
		{"gcra too fast", checkGCRA(10, 100*time.Millisecond, 2), at(0, 0, 1, 2), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.check(tt.gs, 0)
			if (err == nil) != tt.ok {
				t.Fatalf("check = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}
