package consumer

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

// The dead-letter error header is bounded: a long error text is cut on a
// character boundary and marked; a short one is kept whole; a panic's
// stack follows its message.
func TestErrorHeaderIsBounded(t *testing.T) {
	short := errors.New("refused")
	assert.Equal(t, "refused", string(errorText(short)))

	long := errors.New(strings.Repeat("é", MaxErrorHeader)) // 2 bytes each
	got := errorText(long)
	assert.LessOrEqual(t, len(got), MaxErrorHeader)
	assert.True(t, utf8.Valid(got))
	assert.True(t, strings.HasSuffix(string(got), "…"))

	p := errorText(&PanicError{Value: "boom", Stack: []byte("goroutine 1 [running]:")})
	assert.Equal(t, "consumer: handler panicked: boom\n\ngoroutine 1 [running]:", string(p))
}
