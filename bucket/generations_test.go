package bucket

import (
	"strconv"
	"testing"
	"time"
)

// TestConcurrencyGenerationsAreForgottenAndBounded: an instance passes
// the generation it was told of a key only while Redis may still have it
// (nine tenths of max(1 h, 4 leases) after the script that told it), a
// late reply does not replace a newer one, and the memory stays bounded
// however many keys it used.
func TestConcurrencyGenerationsAreForgottenAndBounded(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	for _, tc := range []struct {
		lease time.Duration
		after time.Duration
		want  string
	}{
		{300 * time.Millisecond, 0, "g1"},
		{300 * time.Millisecond, 53 * time.Minute, "g1"},
		{300 * time.Millisecond, 54 * time.Minute, ""},
		{time.Hour, 3 * time.Hour, "g1"},
		{time.Hour, 216 * time.Minute, ""}, // 0.9 × 4 h
	} {
		g := newGenerations(tc.lease)
		g.heard("k", "g1", t0)
		if got := g.told("k", t0.Add(tc.after)); got != tc.want {
			t.Errorf("lease %v, %v after: told %q, want %q", tc.lease, tc.after, got, tc.want)
		}
	}

	g := newGenerations(time.Second)
	g.heard("k", "g2", t0.Add(time.Second))
	g.heard("k", "g1", t0) // the reply of an earlier script, late
	if got := g.told("k", t0.Add(2*time.Second)); got != "g2" {
		t.Errorf("after a late reply: told %q, want g2 (the later script's)", got)
	}

	// Many keys: the idle ones are swept, and the map never exceeds its bound.
	for i := range 3 * maxGenerations {
		g.heard(strconv.Itoa(i), "g", t0.Add(time.Duration(i)*time.Millisecond))
		if n := len(g.byKey); n > maxGenerations {
			t.Fatalf("%d keys remembered after %d used, want at most %d", n, i+1, maxGenerations)
		}
	}
	g.heard("late", "g", t0.Add(2*time.Hour))
	if n := len(g.byKey); n != 1 {
		t.Errorf("%d keys remembered after all but one were idle for 2 h, want 1", n)
	}
}
