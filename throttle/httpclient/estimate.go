package httpclient

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/headway-go/headway/internal/errs"
	"github.com/headway-go/headway/throttle"
)

// maxEstimatedBody is the most of a request body EstimateTokens reads.
const maxEstimatedBody = 8 << 20

// EstimateTokens returns an estimate for [WithCost] that covers what OpenAI
// and Anthropic admit an LLM call against: one request, and the prompt's
// tokens plus the most the answer may generate,
//
//	{"requests": 1, "tokens": ⌈body bytes ÷ 4⌉ + max tokens}
//
// Providers admit a call by its prompt, estimated at about four characters
// a token, plus its max_tokens, before it runs; an estimate of max_tokens
// alone is refused now and then by a provider counting tokens closely. The
// prompt is counted from the whole request body (the JSON around the
// messages too: a little more than the provider counts, never less, for
// text), and the max tokens are read from it: max_tokens (OpenAI's Chat
// Completions, Anthropic's Messages), max_completion_tokens (OpenAI's
// newer name) or max_output_tokens (OpenAI's Responses API), the largest
// named; defaultMax when the body names none (the model's own limit is the
// provider's default). The settlement ([WithCost]) gives back what the
// answer's usage shows was not used.
//
// The body is read through req.GetBody, which http.NewRequest sets for a
// body of bytes.Buffer, bytes.Reader or strings.Reader; a request with a
// body and no GetBody fails, unsent, with an error saying so. A body that
// is not a JSON object counts by its length alone, with defaultMax; one of
// more than 8 MiB fails. defaultMax must be at least 1.
func EstimateTokens(defaultMax int64) (func(*http.Request) (throttle.Cost, error), error) {
	if defaultMax < 1 {
		return nil, errs.Invalid("httpclient", "EstimateTokens", defaultMax, "the default max tokens must be at least 1")
	}
	return func(req *http.Request) (throttle.Cost, error) {
		if req.Body == nil || req.Body == http.NoBody {
			return throttle.Cost{"requests": 1, "tokens": defaultMax}, nil
		}
		if req.GetBody == nil {
			return nil, errors.New("httpclient: EstimateTokens reads the request body through req.GetBody, which is nil: build the request with http.NewRequest and a bytes.Buffer, bytes.Reader or strings.Reader body, or set GetBody")
		}
		body, err := req.GetBody()
		if err != nil {
			return nil, fmt.Errorf("httpclient: EstimateTokens: reading the request body: %w", err)
		}
		defer body.Close()
		data, err := io.ReadAll(io.LimitReader(body, maxEstimatedBody+1))
		if err != nil {
			return nil, fmt.Errorf("httpclient: EstimateTokens: reading the request body: %w", err)
		}
		if len(data) > maxEstimatedBody {
			return nil, fmt.Errorf("httpclient: EstimateTokens: the request body is larger than %d MiB", maxEstimatedBody>>20)
		}
		return throttle.Cost{"requests": 1, "tokens": satAdd(int64((len(data)+3)/4), maxTokensOf(data, defaultMax))}, nil
	}, nil
}

// maxTokensOf is the largest of the max-tokens fields a JSON request body
// names, or def when it names none (or is not a JSON object).
func maxTokensOf(data []byte, def int64) int64 {
	var f struct {
		MaxTokens           *int64 `json:"max_tokens"`
		MaxCompletionTokens *int64 `json:"max_completion_tokens"`
		MaxOutputTokens     *int64 `json:"max_output_tokens"`
	}
	if json.Unmarshal(data, &f) != nil {
		return def
	}
	best, named := int64(0), false
	for _, v := range []*int64{f.MaxTokens, f.MaxCompletionTokens, f.MaxOutputTokens} {
		if v != nil && *v > 0 {
			best, named = max(best, *v), true
		}
	}
	if !named {
		return def
	}
	return best
}

// satAdd is a + b for a, b ≥ 0, capped at the largest int64.
func satAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return 1<<63 - 1
}
