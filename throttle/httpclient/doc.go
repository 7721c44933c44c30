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
package httpclient
