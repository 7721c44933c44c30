package httpserver

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"
)

// Tenant keys (see NewMiddleware): a name kept as it is never begins
// with digestPrefix, and a digest always does, so the two forms cannot
// meet and a tenant who picks its own name cannot choose the key of
// another (unless SHA-256 collides).

// maxTenantLen is the longest tenant used in a key as it is.
const maxTenantLen = 128

// digestPrefix begins the key of every tenant not kept as it is.
const digestPrefix = "sha256:"

// tenantKey is the form of tenant in a bucket key: tenant itself when
// keptAsIs, otherwise digestPrefix and the hex SHA-256 of its bytes.
func tenantKey(tenant string) string {
	if keptAsIs(tenant) {
		return tenant
	}
	sum := sha256.Sum256([]byte(tenant))
	return digestPrefix + hex.EncodeToString(sum[:])
}

// keptAsIs reports whether tenant can be a key as it is: at most
// maxTenantLen bytes of UTF-8 without control characters (C0, DEL, C1:
// no line break or terminal escape in a key) and without '{' or '}' (a
// Redis Cluster hash tag, in a bucket of the user's own that does not
// escape them), and not beginning with digestPrefix (the form of the
// others).
//
// The test is by code point, not by Unicode category (unicode.IsPrint):
// instances that share a store must agree on every tenant's key whatever
// Go built them, and a category changes when a Unicode version assigns
// a character that an older Go's tables do not know.
func keptAsIs(tenant string) bool {
	if len(tenant) > maxTenantLen || strings.HasPrefix(tenant, digestPrefix) || !utf8.ValidString(tenant) {
		return false
	}
	for _, r := range tenant {
		if r < 0x20 || 0x7f <= r && r <= 0x9f || r == '{' || r == '}' {
			return false
		}
	}
	return true
}
