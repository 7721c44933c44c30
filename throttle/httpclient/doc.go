// Package httpclient keeps an HTTP client under a provider's rate limit,
// together with every other client sharing the same bucket:
//
//	lim := throttle.New(b) // b: a bucket the fleet shares, from package bucket
//	tr, err := httpclient.NewTransport(lim, httpclient.WithMaxWait(2*time.Second))
//	if err != nil { ... }
//	client := &http.Client{Transport: tr}
//	resp, err := client.Get(url) // errors.Is(err, throttle.ErrTimeout): no permit in time, nothing sent
//
// A [Transport] takes a permit before each request and bounds the wait by
// the request's deadline and maxWait. When the provider answers "too
// many" anyway (429, or a 403 or 503 that says a limit is reached) with a
// time to come back, it pauses the shared bucket, so that the whole
// fleet waits, and sends requests safe to repeat again after the pause.
// [RetryAfter] is the reading of that time from the provider's headers,
// usable on its own.
//
// # LLM calls
//
// [WithCost] makes the Transport do an LLM call's accounting against a
// budget of requests and tokens (bucket.Budget): it takes the call's
// estimated cost before the request, reads the usage the provider reports
// (OpenAI's or Anthropic's, in JSON or streamed) as the caller reads the
// body, and settles the estimate with it when the body is closed. With
// [WithConcurrency] for the calls in flight, the handler is a plain
// client.Do.
//
// # With a Kafka consumer
//
// Give the consumer of package consumer and the Transport the same
// Limiter, and make the handler's requests with the handler's context:
//
//	client := &http.Client{Transport: tr} // tr := httpclient.NewTransport(lim)
//	handler := func(ctx context.Context, rec *kgo.Record) error {
//		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(rec.Value))
//		...
//		resp, err := client.Do(req)
//		...
//	}
//	c, err := consumer.New(handler, lim, consumer.WithKafka(...))
//
// Each attempt at a record then costs one permit. The consumer takes it
// and passes it down in the handler's context
// ([throttle.Keyed.ContextWithPermit]); the handler's first request uses
// it instead of taking a second. Every other request is a call of its own
// and takes its own permit: a second request of the same attempt, a retry
// after the provider's pause, a request made after waiting out a pause
// (the permit held was taken before it, for a time the provider refused),
// and a request whose context does not come from the handler's (it is
// charged twice). consumer.New(handler, nil, ...) takes no permits:
// then the Transport takes one per request, the same count for a handler
// that makes one request.
//
// Per-key budgets compose the same way, when the two choose the same key
// of the same bucket for a record and its request:
//
//	consumer.WithLimiterFor(func(r *kgo.Record) throttle.Keyed { return lim.Key(string(r.Key)) })
//	httpclient.WithRequestKey(func(r *http.Request) throttle.Keyed { return lim.Key(r.Header.Get("X-Tenant")) })
//
// A request on another key, or on a Limiter over another bucket value,
// draws from another budget and takes its own permit: both budgets are
// charged, rightly for two keys. Two bucket values on one Redis key are
// one budget in Redis but two here, so give the consumer and the
// Transport Limiters over the same bucket value, or the same Limiter.
//
// A cap on calls in flight ([WithConcurrency], consumer.WithConcurrency)
// goes to one of the two, not both: a handler's request would wait for a
// second slot of the cap its record already holds.
//
// Waits: the held permit is used at once; the consumer waited for it
// under its own bound. A request that takes its own permit waits at most
// the tighter of the Transport's maxWait ([WithMaxWait]) and its
// context's deadline (the consumer's handler timeout).
package httpclient
