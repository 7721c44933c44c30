package bucket_test

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestLeaseDebugSkew(t *testing.T) {
	const limit, interval = 1000, 200 * time.Millisecond
	total := 1.5 * 5000.0
	demand := []float64{0.9 * total, 0.1 * total / 3, 0.1 * total / 3, 0.1 * total / 3}
	times, calls := leaseFleet(t, limit, interval, demand, 3*time.Second)
	start := times[0]
	bins := map[int]int{}
	for _, tm := range times {
		bins[int(tm.Sub(start)/(10*time.Millisecond))]++
	}
	var sb strings.Builder
	for i := 0; i < 300; i++ {
		fmt.Fprintf(&sb, "%d ", bins[i])
		if i%20 == 19 {
			sb.WriteString("\n")
		}
	}
	t.Log("calls", calls, "grants", len(times), "\n", sb.String())
}
