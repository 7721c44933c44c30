package slarules

import "testing"

func TestRules(t *testing.T) {
	for id, want := range map[string]bool{"get-product": true, "a.b_c-1": true, "": false, "with space": false, "é": false, string(make([]byte, 129)): false} {
		if got := ValidID(id); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", id, got, want)
		}
	}
	for m, want := range map[string]bool{"GET": true, "PURGE": true, "get": false, "": false, "GET ": false} {
		if got := ValidMethod(m); got != want {
			t.Errorf("ValidMethod(%q) = %v, want %v", m, got, want)
		}
	}
}
