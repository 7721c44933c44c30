package provider

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/guarantee"
)

// TestPeriodsMeterAgreesWithTheChecker: the online meter accepts a request
// exactly when the offline checker finds the accepted requests plus this
// one keep the guarantee.
func TestPeriodsMeterAgreesWithTheChecker(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for c := range 3000 {
		limit := int64(1 + rng.IntN(4))
		interval := time.Duration(5+rng.IntN(10)) * time.Millisecond
		var m periodsMeter
		var accepted []time.Time
		at := time.Unix(1000, 0)
		for i := range 40 {
			at = at.Add(time.Duration(rng.IntN(4000)) * time.Microsecond)
			got := m.admit(at.UnixNano(), limit, int64(interval))
			want := guarantee.Periods(append(accepted[:len(accepted):len(accepted)], at), limit, interval, 0).Violations == 0
			if got != want {
				t.Fatalf("case %d, request %d: meter says %v, checker %v (limit %d, interval %v, accepted %d)", c, i, got, want, limit, interval, len(accepted))
			}
			if got {
				accepted = append(accepted, at)
			}
		}
	}
}
