package httpclient_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

// TestEstimateTokensCoversThePromptAndTheMaxTokens: the estimate is one
// request and the body's bytes ÷ 4 (rounded up) plus the largest
// max-tokens field the body names, or the default.
func TestEstimateTokensCoversThePromptAndTheMaxTokens(t *testing.T) {
	est, err := httpclient.EstimateTokens(4096)
	require.NoError(t, err)
	for _, tt := range []struct {
		name, body string
		max        int64
	}{
		{"OpenAI chat", `{"model":"gpt-4o","messages":[{"role":"user","content":"Say hello."}],"max_tokens":500}`, 500},
		{"Anthropic messages", `{"model":"claude","max_tokens":1024,"messages":[{"role":"user","content":"Hi"}]}`, 1024},
		{"OpenAI Responses", `{"model":"gpt-4o","input":"Hi","max_output_tokens":300}`, 300},
		{"the largest named", `{"max_tokens":100,"max_completion_tokens":700}`, 700},
		{"none named: the default", `{"model":"gpt-4o","messages":[]}`, 4096},
		{"not a number: the default", `{"max_tokens":"lots"}`, 4096},
		{"negative: the default", `{"max_tokens":-5}`, 4096},
		{"not JSON: by length, the default", `plain text prompt`, 4096},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1/v1", strings.NewReader(tt.body))
			require.NoError(t, err)
			c, err := est(req)
			require.NoError(t, err)
			assert.Equal(t, throttle.Cost{"requests": 1, "tokens": int64((len(tt.body)+3)/4) + tt.max}, c)
			// The body is still whole for the send.
			b, err := io.ReadAll(req.Body)
			require.NoError(t, err)
			assert.Equal(t, tt.body, string(b))
		})
	}
	req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1/v1", nil)
	require.NoError(t, err)
	c, err := est(req)
	require.NoError(t, err)
	assert.Equal(t, throttle.Cost{"requests": 1, "tokens": 4096}, c, "no body: the default")
}

// TestEstimateTokensRefusesWhatItCannotRead: a body it could only read by
// consuming it, one above 8 MiB, and a default below 1 are errors that
// say what to do.
func TestEstimateTokensRefusesWhatItCannotRead(t *testing.T) {
	_, err := httpclient.EstimateTokens(0)
	assert.ErrorIs(t, err, throttle.ErrInvalid)
	est, err := httpclient.EstimateTokens(10)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1/v1", io.NopCloser(strings.NewReader(`{}`)))
	require.NoError(t, err)
	_, err = est(req)
	assert.ErrorContains(t, err, "GetBody")
	big, err := http.NewRequest(http.MethodPost, "http://127.0.0.1/v1", strings.NewReader(strings.Repeat("x", 8<<20+1)))
	require.NoError(t, err)
	_, err = est(big)
	assert.ErrorContains(t, err, "larger than 8 MiB")
}

func ExampleEstimateTokens() {
	est, err := httpclient.EstimateTokens(4096) // when a body names no max tokens
	if err != nil {
		fmt.Println(err)
		return
	}
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"Say hello."}],"max_tokens":500}`
	req, _ := http.NewRequest(http.MethodPost, "https://api.openai.com/v1/chat/completions", strings.NewReader(body))
	cost, _ := est(req)
	fmt.Println(cost["requests"], cost["tokens"])
	// Output: 1 522
}
