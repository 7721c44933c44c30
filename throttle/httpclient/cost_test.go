package httpclient_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
)

// ledger is a budget of several dimensions that grants every cost and
// keeps what is charged in all, for the cost tests.
type ledger struct {
	mu      sync.Mutex
	charged throttle.Cost
	settles int
}

func newLedger() *ledger { return &ledger{charged: throttle.Cost{}} }

func (l *ledger) Take(context.Context, string, int64, time.Duration) (throttle.Decision, error) {
	return throttle.Decision{Granted: true}, nil
}

func (l *ledger) TakeCost(_ context.Context, _ string, c throttle.Cost, _ time.Duration) (throttle.Decision, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, v := range c {
		l.charged[name] += v
	}
	return throttle.Decision{Granted: true, Settle: l.settle}, nil
}

// settle is every grant's Decision.Settle.
func (l *ledger) settle(_ context.Context, delta throttle.Cost) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.settles++
	for name, v := range delta {
		l.charged[name] += v
	}
	return nil
}

// now is what is charged in all, and how many settles made it.
func (l *ledger) now() (throttle.Cost, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := throttle.Cost{}
	for name, v := range l.charged {
		c[name] = v
	}
	return c, l.settles
}

// answers is a base RoundTripper that gives, to the n-th request, the n-th
// of its answers (the last one again after them), or fails with err.
type answers struct {
	mu   sync.Mutex
	list []func() *http.Response
	sent int
	err  error
}

func (a *answers) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sent++
	if a.err != nil {
		return nil, a.err
	}
	resp := a.list[min(a.sent, len(a.list))-1]()
	resp.Request = r
	return resp, nil
}

// answer is a response of status, content type and body.
func answer(status int, contentType, body string, header ...string) func() *http.Response {
	return func() *http.Response {
		h := http.Header{}
		if contentType != "" {
			h.Set("Content-Type", contentType)
		}
		for i := 0; i+1 < len(header); i += 2 {
			h.Set(header[i], header[i+1])
		}
		return &http.Response{StatusCode: status, Header: h, Body: &trackedBody{Reader: strings.NewReader(body)}}
	}
}

// The provider's answers, as OpenAI and Anthropic write them.
const (
	openAIJSON = `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi \"usage\": {\"total_tokens\": 9999}"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":30,"completion_tokens":90,"total_tokens":120}}`
	openAIStream = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c\",\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":90,\"total_tokens\":120}}\n\n" +
		"data: [DONE]\n\n"
	anthropicJSON = `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"usage":{"input_tokens":7777}}}],` +
		`"stop_reason":"end_turn","usage":{"input_tokens":30,"cache_creation_input_tokens":5,"cache_read_input_tokens":40,"output_tokens":90}}`
	anthropicStream = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":30,\"cache_creation_input_tokens\":5,\"output_tokens\":1}}}\r\n\r\n" +
		"event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\r\n\r\n" +
		"event: ping\r\ndata: {\"type\": \"ping\"}\r\n\r\n" +
		"event: message_delta\r\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":90}}\r\n\r\n" +
		"event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n"
)

// costTransport is a Transport over base that takes est per call from
// budget b, with actual (nil: the default) and opts.
func costTransport(t *testing.T, b throttle.Bucket, base http.RoundTripper, est throttle.Cost, actual func(httpclient.Usage) throttle.Cost, opts ...httpclient.Option) *http.Client {
	t.Helper()
	opts = append([]httpclient.Option{
		httpclient.WithBase(base),
		httpclient.WithCost(func(*http.Request) (throttle.Cost, error) { return est, nil }, actual),
	}, opts...)
	return &http.Client{Transport: mustTransport(t, throttle.New(b), opts...)}
}

// post sends a POST with a body that can be had again.
func post(t *testing.T, client *http.Client) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://llm.invalid/v1/chat", bytes.NewReader([]byte(`{"model":"m"}`)))
	require.NoError(t, err)
	return client.Do(req)
}

// An answer's usage, in JSON or streamed, OpenAI's or Anthropic's, settles
// the estimate when the body is closed after it was read to its end; until
// then, the estimate is charged, and the call's concurrency slot held.
func TestCostIsSettledWithTheUsageWhenTheBodyIsClosed(t *testing.T) {
	anthropic := func(u httpclient.Usage) throttle.Cost {
		return throttle.Cost{"input_tokens": u.InputTokens + u.CacheCreationInputTokens, "output_tokens": u.OutputTokens}
	}
	tests := []struct {
		name   string
		answer func() *http.Response
		est    throttle.Cost
		actual func(httpclient.Usage) throttle.Cost
		want   throttle.Cost
	}{
		{"OpenAI JSON", answer(200, "application/json", openAIJSON), throttle.Cost{"requests": 1, "tokens": 500}, nil, throttle.Cost{"requests": 1, "tokens": 120}},
		{"OpenAI stream", answer(200, "text/event-stream; charset=utf-8", openAIStream), throttle.Cost{"requests": 1, "tokens": 500}, nil, throttle.Cost{"requests": 1, "tokens": 120}},
		{"OpenAI JSON beyond the estimate", answer(200, "application/json", openAIJSON), throttle.Cost{"requests": 1, "tokens": 100}, nil, throttle.Cost{"requests": 1, "tokens": 120}},
		{"Anthropic JSON", answer(200, "application/json", anthropicJSON), throttle.Cost{"requests": 1, "input_tokens": 200, "output_tokens": 300}, anthropic, throttle.Cost{"requests": 1, "input_tokens": 35, "output_tokens": 90}},
		{"Anthropic stream", answer(200, "text/event-stream", anthropicStream), throttle.Cost{"requests": 1, "input_tokens": 200, "output_tokens": 300}, anthropic, throttle.Cost{"requests": 1, "input_tokens": 35, "output_tokens": 90}},
		{"JSON without a content type", answer(200, "", openAIJSON), throttle.Cost{"requests": 1, "tokens": 500}, nil, throttle.Cost{"requests": 1, "tokens": 120}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newLedger()
			slots, err := throttle.NewLocalSlots(1)
			require.NoError(t, err)
			client := costTransport(t, b, &answers{list: []func() *http.Response{tt.answer}}, tt.est, tt.actual, httpclient.WithConcurrency(slots))
			resp, err := post(t, client)
			require.NoError(t, err)
			charged, _ := b.now()
			assert.Equal(t, tt.est, charged, "charged while the answer is read")
			_, err = io.ReadAll(resp.Body)
			require.NoError(t, err)
			_, err = slots.Hold(context.Background(), "", 0)
			require.Error(t, err, "the slot is held until the body is closed")
			require.NoError(t, resp.Body.Close())
			charged, settles := b.now()
			assert.Equal(t, tt.want, charged, "charged after Close")
			assert.Equal(t, 1, settles)
			require.NoError(t, resp.Body.Close())
			_, settles = b.now()
			assert.Equal(t, 1, settles, "a second Close settles nothing")
			release, err := slots.Hold(context.Background(), "", 0)
			require.NoError(t, err, "the slot is free after Close")
			release()
		})
	}
}

// A body not read to its end (never read, a stream abandoned, a usage the
// answer does not carry, a body too long to keep) keeps the estimate: the
// provider did the work, and the estimate is the best count there is.
func TestCostStaysEstimatedWithoutAUsageReadToTheEnd(t *testing.T) {
	est := throttle.Cost{"requests": 1, "tokens": 500}
	for _, tt := range []struct {
		name   string
		answer func() *http.Response
		read   int // bytes read before Close; -1: all
	}{
		{"never read", answer(200, "application/json", openAIJSON), 0},
		{"stream abandoned after the first usage", answer(200, "text/event-stream", anthropicStream), len(anthropicStream) / 2},
		{"stream without usage", answer(200, "text/event-stream", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n"), -1},
		{"JSON without usage", answer(200, "application/json", `{"choices":[]}`), -1},
		{"not JSON", answer(200, "text/plain", "usage: 120 tokens"), -1},
		{"JSON too long to keep", answer(200, "application/json", `{"pad":"`+strings.Repeat("x", 8<<20)+`","usage":{"total_tokens":3,"prompt_tokens":1,"completion_tokens":2}}`), -1},
		{"an event too long to keep", answer(200, "text/event-stream", "data: {\"pad\":\""+strings.Repeat("x", 1<<20)+"\",\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n"), -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := newLedger()
			resp, err := post(t, costTransport(t, b, &answers{list: []func() *http.Response{tt.answer}}, est, nil))
			require.NoError(t, err)
			if tt.read < 0 {
				_, err = io.ReadAll(resp.Body)
			} else {
				_, err = io.ReadFull(resp.Body, make([]byte, tt.read))
			}
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			charged, settles := b.now()
			assert.Equal(t, est, charged)
			assert.Equal(t, 0, settles)
		})
	}
}

// An answer that is not a success generated nothing: the dimensions actual
// names are given back at once, the others (requests) stay charged. A
// refusal the Transport sends again is settled, and the retry takes the
// estimate again and is settled with its own usage.
func TestCostOfAnAnswerThatIsNoSuccess(t *testing.T) {
	est := throttle.Cost{"requests": 1, "tokens": 500}
	for _, tt := range []struct {
		name    string
		answers []func() *http.Response
		want    throttle.Cost // after the body's Close
		sent    int
	}{
		{"429 returned", []func() *http.Response{answer(429, "application/json", `{"error":{"type":"rate_limit"}}`)}, throttle.Cost{"requests": 1, "tokens": 0}, 1},
		{"400", []func() *http.Response{answer(400, "application/json", `{"error":{}}`)}, throttle.Cost{"requests": 1, "tokens": 0}, 1},
		{"503", []func() *http.Response{answer(503, "text/plain", "overloaded")}, throttle.Cost{"requests": 1, "tokens": 0}, 1},
		{"429 then a success", []func() *http.Response{
			answer(429, "application/json", `{}`, "Retry-After", "0"),
			answer(200, "application/json", openAIJSON),
		}, throttle.Cost{"requests": 2, "tokens": 120}, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := newLedger()
			base := &answers{list: tt.answers}
			resp, err := post(t, costTransport(t, b, base, est, nil, httpclient.WithRetryAnyMethod()))
			require.NoError(t, err)
			drain(resp)
			charged, _ := b.now()
			assert.Equal(t, tt.want, charged)
			assert.Equal(t, tt.sent, base.sent)
		})
	}
}

// A send that fails may have reached the provider: the estimate stays. An
// estimate that fails sends nothing and takes nothing; a nil one is
// refused by NewTransport.
func TestCostOfAFailedSendOrEstimate(t *testing.T) {
	est := throttle.Cost{"requests": 1, "tokens": 500}
	b := newLedger()
	_, err := post(t, costTransport(t, b, &answers{err: errors.New("connection reset")}, est, nil))
	require.Error(t, err)
	charged, settles := b.now()
	assert.Equal(t, est, charged)
	assert.Equal(t, 0, settles)

	b = newLedger()
	base := &answers{list: []func() *http.Response{answer(200, "application/json", openAIJSON)}}
	errBig := errors.New("prompt too long")
	tr := mustTransport(t, throttle.New(b), httpclient.WithBase(base),
		httpclient.WithCost(func(*http.Request) (throttle.Cost, error) { return nil, errBig }, nil))
	_, err = post(t, &http.Client{Transport: tr})
	assert.ErrorIs(t, err, errBig)
	charged, _ = b.now()
	assert.Empty(t, charged)
	assert.Equal(t, 0, base.sent)

	_, err = httpclient.NewTransport(throttle.New(b), httpclient.WithCost(nil, nil))
	assert.ErrorIs(t, err, throttle.ErrInvalid)
}

// The handler of an LLM call is a plain client.Do: a Transport with
// WithCost over a Redis budget of requests and tokens takes each call's
// estimate and settles it with the usage the provider streams at the end,
// so that the tokens a call did not use serve the next calls at once; a
// body never read keeps its estimate.
func TestCostOverARedisBudgetSettlesStreamedUsage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, event := range strings.SplitAfter(openAIStream, "\n\n") {
			_, _ = io.WriteString(w, event)
			w.(http.Flusher).Flush()
		}
	}))
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	rdb := redisenv.New(t).Client()
	budget, err := bucket.NewBudget(rdb, "llm-cost", []bucket.Dimension{
		{Name: "requests", Limit: 10, Interval: time.Minute},
		{Name: "tokens", Limit: 1000, Interval: time.Minute},
	})
	require.NoError(t, err)
	slots, err := bucket.NewConcurrency(rdb, "llm-cost", 2)
	require.NoError(t, err)
	defer slots.Close()
	lim := throttle.New(budget)
	defer lim.Close()
	tr := mustTransport(t, lim, httpclient.WithBase(srv.Client().Transport), httpclient.WithConcurrency(slots),
		httpclient.WithCost(func(*http.Request) (throttle.Cost, error) { return throttle.Cost{"requests": 1, "tokens": 500}, nil }, nil))
	client := &http.Client{Transport: tr}
	call := func() (*http.Response, error) {
		req, err := http.NewRequestWithContext(httpclient.ContextWithMaxWait(context.Background(), 0), http.MethodPost, srv.URL, strings.NewReader(`{"stream":true}`))
		require.NoError(t, err)
		return client.Do(req)
	}
	// 3 calls of 120 tokens: 500 each taken, 380 of each given back.
	for i := range 3 {
		resp, err := call()
		require.NoError(t, err, "call %d: its estimate fits in what the previous calls gave back", i+1)
		drain(resp)
	}
	// 360 used; a body never read keeps its 500: 860.
	resp, err := call()
	require.NoError(t, err)
	resp.Body.Close()
	_, err = call()
	assert.ErrorIs(t, err, throttle.ErrTimeout, "500 more tokens are beyond the 140 left")
}

// FuzzCostUsage checks that no answer body makes the usage readers panic,
// settle more than once, or charge a negative cost, and that the requests
// the estimate took stay charged.
func FuzzCostUsage(f *testing.F) {
	for _, s := range []string{
		openAIJSON, openAIStream, anthropicJSON, anthropicStream, "", "{", "data: {\n\n", "data: [DONE]\n\n", ":\n\n\n",
		`{"usage":{"prompt_tokens":9223372036854775807,"completion_tokens":9223372036854775807}}`,
		`{"usage":{"prompt_tokens":-5,"completion_tokens":1e3}}`, `{"usage":null,"message":{"usage":{"input_tokens":3}}}`,
		"data: {\"usage\":\ndata: {\"prompt_tokens\":1}}\n\n", "data:{\"usage\":{\"output_tokens\":2}}\r\n\r\n", "data: {\"usage\":{\"output_tokens\":2}}",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, body string, stream bool) {
		contentType := "application/json"
		if stream {
			contentType = "text/event-stream"
		}
		b := newLedger()
		est := throttle.Cost{"requests": 1, "tokens": 500}
		resp, err := post(t, costTransport(t, b, &answers{list: []func() *http.Response{answer(200, contentType, body)}}, est, nil))
		if err != nil {
			t.Fatal(err)
		}
		for { // read in small pieces, so that lines and events are cut anywhere
			if _, err := resp.Body.Read(make([]byte, 7)); err != nil {
				break
			}
		}
		resp.Body.Close()
		charged, settles := b.now()
		if settles > 1 || charged["tokens"] < 0 || charged["requests"] != 1 {
			t.Fatalf("%q (stream %v): charged %v in %d settles", body, stream, charged, settles)
		}
	})
}

// An estimate of nothing is refused, not turned into a permit.
func TestCostOfNothingIsRefused(t *testing.T) {
	for _, est := range []throttle.Cost{nil, {}, {"tokens": 0}} {
		b := newLedger()
		base := &answers{list: []func() *http.Response{answer(200, "application/json", openAIJSON)}}
		_, err := post(t, costTransport(t, b, base, est, nil))
		assert.ErrorIs(t, err, throttle.ErrInvalid, "estimate %v", est)
		assert.Equal(t, 0, base.sent)
	}
}

// A caller that stops reading at the answer's end, before the body says
// io.EOF, has read the whole usage: json.Decoder stops at the value's last
// byte, OpenAI's SDKs stop at `data: [DONE]`, a loop over Anthropic's
// events at message_stop, and over HTTP/2 the EOF comes only with a later
// Read (the bodies here, over strings.Reader, do the same). Such a body is
// settled with its usage, not left at its estimate, which would charge
// every call its worst case.
func TestCostIsSettledWhenTheCallerStopsAtTheAnswersEnd(t *testing.T) {
	anthropic := func(u httpclient.Usage) throttle.Cost {
		return throttle.Cost{"input_tokens": u.InputTokens + u.CacheCreationInputTokens, "output_tokens": u.OutputTokens}
	}
	// upTo reads the body line by line, as an SSE client does, until a
	// line that is last.
	upTo := func(last string) func(io.Reader) error {
		return func(r io.Reader) error {
			sc := bufio.NewScanner(r)
			for sc.Scan() {
				if strings.TrimSuffix(sc.Text(), "\r") == last {
					return nil
				}
			}
			return fmt.Errorf("no line %q: %w", last, sc.Err())
		}
	}
	for _, tt := range []struct {
		name   string
		answer func() *http.Response
		read   func(io.Reader) error
		est    throttle.Cost
		actual func(httpclient.Usage) throttle.Cost
		want   throttle.Cost
	}{
		{"JSON decoded", answer(200, "application/json", openAIJSON), func(r io.Reader) error { return json.NewDecoder(r).Decode(new(map[string]any)) },
			throttle.Cost{"requests": 1, "tokens": 500}, nil, throttle.Cost{"requests": 1, "tokens": 120}},
		{"OpenAI stream up to [DONE]", answer(200, "text/event-stream", openAIStream), upTo("data: [DONE]"),
			throttle.Cost{"requests": 1, "tokens": 500}, nil, throttle.Cost{"requests": 1, "tokens": 120}},
		{"Anthropic stream up to message_stop", answer(200, "text/event-stream", anthropicStream), upTo(`data: {"type":"message_stop"}`),
			throttle.Cost{"requests": 1, "input_tokens": 200, "output_tokens": 300}, anthropic, throttle.Cost{"requests": 1, "input_tokens": 35, "output_tokens": 90}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := newLedger()
			resp, err := post(t, costTransport(t, b, &answers{list: []func() *http.Response{tt.answer}}, tt.est, tt.actual))
			require.NoError(t, err)
			require.NoError(t, tt.read(resp.Body))
			require.NoError(t, resp.Body.Close())
			charged, settles := b.now()
			assert.Equal(t, tt.want, charged)
			assert.Equal(t, 1, settles)
		})
	}
}

// OpenAI's Responses API streams its usage in its last event, inside the
// response it completes (`response.usage`), not at the top: such a stream
// is settled with that usage, not left at its estimate.
func TestCostIsSettledWithTheUsageOfAnOpenAIResponsesStream(t *testing.T) {
	const stream = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"usage\":null}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\"," +
		"\"usage\":{\"input_tokens\":30,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":90,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":120}}}\n\n"
	est := throttle.Cost{"requests": 1, "tokens": 500}
	b := newLedger()
	resp, err := post(t, costTransport(t, b, &answers{list: []func() *http.Response{answer(200, "text/event-stream", stream)}}, est, nil))
	require.NoError(t, err)
	drain(resp)
	charged, settles := b.now()
	assert.Equal(t, throttle.Cost{"requests": 1, "tokens": 120}, charged)
	assert.Equal(t, 1, settles)
}

// Anthropic's message_start counts the output begun (output_tokens 1), not
// what the call generates: the count comes with message_delta. A stream
// that ends without it (an error event mid-stream, as Anthropic sends
// when overloaded, then the stream's end) keeps the estimate, as a stream
// abandoned does, rather than settle the output with that 1, which would
// give back the tokens the provider did generate.
func TestCostOfAnAnthropicStreamEndingBeforeItsCountStaysEstimated(t *testing.T) {
	const stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":30,\"output_tokens\":1}}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n" +
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	est := throttle.Cost{"requests": 1, "input_tokens": 200, "output_tokens": 300}
	b := newLedger()
	resp, err := post(t, costTransport(t, b, &answers{list: []func() *http.Response{answer(200, "text/event-stream", stream)}}, est,
		func(u httpclient.Usage) throttle.Cost {
			return throttle.Cost{"input_tokens": u.InputTokens + u.CacheCreationInputTokens, "output_tokens": u.OutputTokens}
		}))
	require.NoError(t, err)
	drain(resp)
	charged, settles := b.now()
	assert.Equal(t, est, charged)
	assert.Equal(t, 0, settles)
}

// An answer that is no JSON object (speech audio, a file's content) has no
// usage to find: its body is not kept while it is read (reading 4 MiB
// allocates less than 1 MiB), and its estimate stands.
func TestCostBodyKeepsNothingOfAnAnswerThatIsNoJSONObject(t *testing.T) {
	audio := strings.Repeat("\xff\xfb\x90\x64", 1<<20) // 4 MiB
	est := throttle.Cost{"requests": 1, "tokens": 500}
	b := newLedger()
	resp, err := post(t, costTransport(t, b, &answers{list: []func() *http.Response{answer(200, "audio/mpeg", audio)}}, est, nil))
	require.NoError(t, err)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	n, err := io.Copy(io.Discard, resp.Body)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Equal(t, int64(len(audio)), n)
	require.NoError(t, resp.Body.Close())
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "bytes allocated while reading a 4 MiB body")
	charged, settles := b.now()
	assert.Equal(t, est, charged)
	assert.Equal(t, 0, settles)
}
