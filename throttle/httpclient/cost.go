package httpclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"mime"
	"net/http"
	"sync"

	"github.com/headway-go/headway/throttle"
)

// Usage is what an LLM provider's answer says a call used, read from its
// JSON `usage` object: OpenAI's (prompt_tokens, completion_tokens) or
// Anthropic's (input_tokens, output_tokens and the cache counts).
type Usage struct {
	// InputTokens is OpenAI's prompt_tokens, or input_tokens in its
	// Responses API (cached ones included), or Anthropic's input_tokens
	// (cached ones not included).
	InputTokens int64
	// OutputTokens is OpenAI's completion_tokens, or Anthropic's
	// output_tokens.
	OutputTokens int64
	// CacheCreationInputTokens and CacheReadInputTokens are Anthropic's
	// cache_creation_input_tokens and cache_read_input_tokens (0 from
	// OpenAI).
	CacheCreationInputTokens, CacheReadInputTokens int64
}

// WithCost makes a [Transport] account for each call's cost in a budget
// of several dimensions ([throttle.CostBucket], such as bucket.Budget:
// requests and tokens per minute), so that an LLM call's handler is a
// plain client.Do:
//
//	tr, err := httpclient.NewTransport(lim, // lim: a Limiter over a bucket.Budget
//		httpclient.WithCost(func(*http.Request) (throttle.Cost, error) {
//			return throttle.Cost{"requests": 1, "tokens": 1000}, nil // the most a call costs
//		}, nil), // nil: {"tokens": InputTokens + OutputTokens}
//		httpclient.WithConcurrency(slots))
//
// Before each send, the Transport takes estimate's cost, all dimensions
// together or none, within the request's wait ([throttle.Keyed.AcquireCost],
// instead of a permit); then it settles it ([throttle.CostGrant.Settle]) with
// actual's cost of what the provider's answer reports:
//
//   - A 2xx answer is settled when its body is closed, from the `usage`
//     object it carries, in JSON (`{"usage":{...}}`) or streamed as
//     server-sent events (OpenAI's last chunk, with stream_options
//     include_usage, or the response.completed event of its Responses
//     API; Anthropic's message_start and message_delta events), read as
//     the caller reads the body. The usage counts only once the answer
//     was read to its end: the body's EOF, or the end the answer shows
//     itself, where callers stop reading (the JSON value's last byte,
//     for json.Decoder; a stream's last event, OpenAI's `data: [DONE]`
//     or Anthropic's message_stop). A body closed before (never read, a
//     stream abandoned), or without usage (a stream that an error event
//     ends before its count) keeps the estimate charged, for the
//     provider did the work and the estimate is the best count there
//     is.
//   - Any other answer (a 429 or another refusal, a 4xx, a 5xx) generated
//     nothing: it is settled at once as actual(Usage{}), so that the
//     dimensions actual names (tokens) are given back and the others
//     (requests: providers count refused calls) stay charged. A refused
//     call that the Transport sends again after the provider's pause
//     (see [Transport]) takes the estimate again, and is settled again.
//   - A send that fails (no answer) keeps the estimate charged: the
//     request may have reached the provider.
//
// A dimension actual does not name stays as estimated; an actual cost
// above the estimate is charged even beyond what is left, and later calls
// wait until it stops counting. Settling, on Close, waits for the store at most the Limiter's
// store timeout; its error is logged ([WithLogger]), not returned.
//
// estimate is called once per RoundTrip, concurrently; it must not
// consume req.Body (req.GetBody gives a copy). An error from it fails
// the request, unsent. A nil actual counts {"tokens": InputTokens +
// OutputTokens} (OpenAI's total_tokens); for a budget that counts input
// and output apart, as Anthropic does, map them:
//
//	func(u httpclient.Usage) throttle.Cost {
//		return throttle.Cost{"input_tokens": u.InputTokens + u.CacheCreationInputTokens, "output_tokens": u.OutputTokens}
//	}
//
// The answer's rate-limit headers and refusals are reported to the fleet
// as for any request (see [Transport], "Adapting"). Give the cost's
// Limiter to the Transport only, not also to a consumer of package
// consumer: the consumer's permit would charge the requests dimension a
// second time (consumer.New(handler, nil, ...) takes none). A permit the
// request's context holds is not used. A body is copied, while it is
// read, up to 8 MiB for JSON and 1 MiB per server-sent event, to find its
// usage; a larger one keeps the estimate, and one that is no JSON object
// (audio, a file) is not copied. NewTransport refuses a nil estimate.
func WithCost(estimate func(req *http.Request) (throttle.Cost, error), actual func(Usage) throttle.Cost) Option {
	return transportOption(func(c *transportConfig) {
		c.cost = &costModel{estimate: estimate, actual: actual}
		if actual == nil {
			c.cost.actual = totalTokens
		}
	})
}

// costModel is WithCost's configuration.
type costModel struct {
	estimate func(*http.Request) (throttle.Cost, error)
	actual   func(Usage) throttle.Cost
}

// totalTokens is WithCost's default actual cost.
func totalTokens(u Usage) throttle.Cost {
	total := u.InputTokens + u.OutputTokens
	if total < 0 { // both counts are at least 0: an overflow
		total = math.MaxInt64
	}
	return throttle.Cost{"tokens": total}
}

// settle settles g with actual on a context that outlives the
// request's, and logs a failure.
func (t *Transport) settle(ctx context.Context, k throttle.Keyed, g *throttle.CostGrant, actual throttle.Cost) {
	if err := g.Settle(context.WithoutCancel(ctx), actual); err != nil {
		t.log.Warn("httpclient: settling a call's cost failed", "key", k.Key(), "actual", actual.String(), "err", err)
	}
}

// settleOnClose makes resp's body settle g with the usage it reports
// when it is closed (see WithCost), for a 2xx answer; any other answer is
// settled now, as a call that generated nothing.
func (t *Transport) settleOnClose(ctx context.Context, k throttle.Keyed, resp *http.Response, g *throttle.CostGrant) *http.Response {
	if resp.StatusCode/100 != 2 {
		t.settle(ctx, k, g, t.cost.actual(Usage{}))
		return resp
	}
	if resp.Body == nil || resp.Body == http.NoBody {
		return resp // no usage: the estimate stays
	}
	b := &costBody{body: resp.Body, usage: newUsageReader(resp.Header.Get("Content-Type"))}
	b.settle = func(u Usage) { t.settle(ctx, k, g, t.cost.actual(u)) }
	if rw, ok := resp.Body.(io.ReadWriteCloser); ok {
		resp.Body = &costBodyRW{b, rw}
	} else {
		resp.Body = b
	}
	return resp
}

// costBody reads the usage of the body it wraps as it is read, and
// settles the call's cost with it when closed.
type costBody struct {
	body   io.ReadCloser
	settle func(Usage)

	mu    sync.Mutex
	usage usageReader
	eof   bool
	done  bool
}

func (b *costBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	b.mu.Lock()
	if !b.done && n >= 0 && n <= len(p) {
		b.usage.write(p[:n])
		if errors.Is(err, io.EOF) {
			b.eof = true
		}
	}
	b.mu.Unlock()
	return n, err
}

// Close closes the body, then settles: with the usage read, when the body
// was read to its end (its EOF, or the answer's own end: see usageReader)
// and reported one; otherwise the estimate stays.
func (b *costBody) Close() error {
	err := b.body.Close()
	b.mu.Lock()
	u, ok := Usage{}, false
	if !b.done {
		u, ok = b.usage.result(b.eof)
	}
	b.done = true
	b.mu.Unlock()
	if ok {
		b.settle(u)
	}
	return err
}

// costBodyRW is costBody for a writable body.
type costBodyRW struct {
	*costBody
	io.Writer
}

// Bounds of what a usage reader keeps of a body.
const (
	maxUsageJSON  = 8 << 20 // a JSON answer
	maxUsageEvent = 1 << 20 // one server-sent event
)

// usageReader finds the usage in a body written to it piece by piece.
// result gives it once the answer was read to its end: eof says the body
// reported io.EOF; without it, the answer may still show its end (a JSON
// value complete, a stream's last event), for a caller that stops there
// need not read on to the EOF, which HTTP/2 gives only with a later Read.
type usageReader interface {
	write(p []byte)
	result(eof bool) (Usage, bool)
}

// newUsageReader returns the reader for a body of contentType: server-sent
// events, or JSON (any other type is tried as JSON).
func newUsageReader(contentType string) usageReader {
	if mt, _, err := mime.ParseMediaType(contentType); err == nil && mt == "text/event-stream" {
		return &eventUsage{}
	}
	return &jsonUsage{}
}

// jsonUsage keeps a JSON body, up to maxUsageJSON, and reads its usage
// at the end. A body that is no JSON object (audio, a file), seen at its
// first byte after spaces, is not kept: it carries no usage.
type jsonUsage struct {
	buf      bytes.Buffer
	overflow bool // too long, or no object: nothing kept
}

func (j *jsonUsage) write(p []byte) {
	if j.overflow {
		return
	}
	if j.buf.Len() == 0 {
		p = bytes.TrimLeft(p, " \t\r\n")
		if len(p) > 0 && p[0] != '{' {
			j.overflow = true
			return
		}
	}
	if j.buf.Len()+len(p) > maxUsageJSON {
		j.overflow = true
		j.buf = bytes.Buffer{}
		return
	}
	j.buf.Write(p)
}

// result reads the usage of the JSON value kept, eof or not: a value that
// parses is complete (an object's prefix never does), and nothing but
// spaces may follow it in the body.
func (j *jsonUsage) result(bool) (Usage, bool) {
	if j.overflow {
		return Usage{}, false
	}
	var u Usage
	ok := readUsage(j.buf.Bytes(), &u) != noUsage
	return u, ok
}

// eventUsage reads server-sent events (lines; `data:` lines joined into
// an event's data, dispatched at a blank line), each data a JSON object
// that may carry usage: the usage is the largest count of each field
// seen (Anthropic's message_delta counts output tokens so far; OpenAI's
// last chunk gives all); message_start's alone (an Anthropic stream that
// ends before its count, on an error event) counts nothing. The stream
// ends at its EOF, or at the line that says it is over, after every
// usage: OpenAI's `data: [DONE]`, Anthropic's `event: message_stop`.
type eventUsage struct {
	line     []byte // the current line, without its end
	skip     bool   // the current line is too long: dropped to its end
	data     []byte // the current event's data
	dropData bool   // the current event's data is too long
	u        Usage
	seen     bool // a usage that counts the call (finalUsage)
	over     bool // the stream said it is over
}

func (e *eventUsage) write(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			e.grow(p)
			return
		}
		e.grow(p[:i])
		if !e.skip {
			e.endLine(bytes.TrimSuffix(e.line, []byte("\r")))
		}
		e.line, e.skip = e.line[:0], false
		p = p[i+1:]
	}
}

// grow adds p to the current line, unless it grows beyond maxUsageEvent.
func (e *eventUsage) grow(p []byte) {
	if e.skip {
		return
	}
	if len(e.line)+len(p) > maxUsageEvent {
		e.skip, e.line = true, e.line[:0]
		return
	}
	e.line = append(e.line, p...)
}

func (e *eventUsage) endLine(line []byte) {
	if len(line) == 0 {
		e.dispatch()
		return
	}
	field, value, _ := bytes.Cut(line, []byte(":"))
	value = bytes.TrimPrefix(value, []byte(" "))
	if string(field) == "event" && string(value) == "message_stop" {
		e.over = true // Anthropic's last event
	}
	if string(field) != "data" {
		return // event:, id:, retry:, a comment
	}
	if string(value) == "[DONE]" {
		e.over = true // OpenAI's last event
	}
	if e.dropData || len(e.data)+1+len(value) > maxUsageEvent {
		e.dropData, e.data = true, e.data[:0]
		return
	}
	if len(e.data) > 0 {
		e.data = append(e.data, '\n')
	}
	e.data = append(e.data, value...)
}

func (e *eventUsage) dispatch() {
	data, drop := e.data, e.dropData
	e.data, e.dropData = e.data[:0], false
	if drop || len(data) == 0 || data[0] != '{' {
		return // [DONE], an empty event
	}
	if readUsage(data, &e.u) == finalUsage {
		e.seen = true
	}
}

func (e *eventUsage) result(eof bool) (Usage, bool) {
	if !eof {
		// A stream not read to its EOF counts only once it said it is
		// over; a line or an event cut short by the caller is not read.
		return e.u, e.seen && e.over
	}
	if !e.skip && len(e.line) > 0 {
		e.endLine(bytes.TrimSuffix(e.line, []byte("\r")))
	}
	e.dispatch() // an event the stream's end closes
	return e.u, e.seen
}

// usageFields are the counts of a `usage` object, OpenAI's and
// Anthropic's names together.
type usageFields struct {
	PromptTokens             int64 `json:"prompt_tokens"`
	CompletionTokens         int64 `json:"completion_tokens"`
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

// usageFound says where a JSON object carried a usage, if it did.
type usageFound int

const (
	noUsage usageFound = iota
	// startUsage is the usage of Anthropic's message_start: the input,
	// and the output begun (1), not what the call generates, which its
	// message_delta counts. A stream that gives no other is not counted.
	startUsage
	// finalUsage is a usage at the object's top, or in its response
	// (OpenAI's Responses API): the call's count.
	finalUsage
)

// readUsage reads the usage of one JSON object, at its top (`usage`), in
// its message (Anthropic's message_start) or in its response (the
// response.completed event of OpenAI's Responses API), into u: each count
// the largest of u's and the object's. It reports where the object
// carried one.
func readUsage(data []byte, u *Usage) usageFound {
	type nested struct {
		Usage *usageFields `json:"usage"`
	}
	var obj struct {
		Usage    *usageFields `json:"usage"`
		Message  *nested      `json:"message"`
		Response *nested      `json:"response"`
	}
	if json.Unmarshal(data, &obj) != nil {
		return noUsage
	}
	f, found := obj.Usage, finalUsage
	if f == nil && obj.Response != nil {
		f = obj.Response.Usage
	}
	if f == nil && obj.Message != nil {
		f, found = obj.Message.Usage, startUsage
	}
	if f == nil {
		return noUsage
	}
	u.InputTokens = max(u.InputTokens, f.PromptTokens, f.InputTokens)
	u.OutputTokens = max(u.OutputTokens, f.CompletionTokens, f.OutputTokens)
	u.CacheCreationInputTokens = max(u.CacheCreationInputTokens, f.CacheCreationInputTokens)
	u.CacheReadInputTokens = max(u.CacheReadInputTokens, f.CacheReadInputTokens)
	return found
}

// zeroOf is c with every amount set to 0: what a give-back settles to.
func zeroOf(c throttle.Cost) throttle.Cost {
	z := make(throttle.Cost, len(c))
	for name := range c {
		z[name] = 0
	}
	return z
}
