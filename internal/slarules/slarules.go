// Package slarules holds the rules an SLA's fields must follow, shared by
// throttle/httpserver's middleware (which checks SLAs built in Go) and its YAML loader
// (which checks them as it reads YAML, to name the line at fault).
package slarules

// ValidID reports whether id may name an SLA: 1 to 128 characters among
// ASCII letters, digits, '.', '_' and '-' (it becomes part of bucket keys
// and header values).
func ValidID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ValidMethod reports whether m may be matched as an HTTP method: 1 to 32
// upper-case ASCII letters.
func ValidMethod(m string) bool {
	if m == "" || len(m) > 32 {
		return false
	}
	for i := 0; i < len(m); i++ {
		if c := m[i]; c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}
