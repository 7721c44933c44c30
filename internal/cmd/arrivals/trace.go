package main

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/headway-go/headway/throttle"
)

// What a call tells the provider about itself, for the parent to say where
// arrivals over the limit come from: when the call began, when the
// Transport sent it (handed it to its base RoundTripper, after the permit
// and any wait for the permit's place), and, with -trace, when the bucket
// granted its permit and what the grant said. It rides in the request's
// "key" query parameter, which the provider records with the arrival.

// callNote travels in a call's context, from the worker through the
// Transport (and, with -trace, the bucket) to the base RoundTripper.
type callNote struct {
	began time.Time

	mu      sync.Mutex
	decided time.Time // when a Take that granted returned; zero if not seen
	d       throttle.Decision
}

type noteKey struct{}

func withNote(ctx context.Context, n *callNote) context.Context {
	return context.WithValue(ctx, noteKey{}, n)
}

// stamp is the base RoundTripper under the Transport: it writes the call's
// note, with the time it leaves, into the request's key.
type stamp struct{ next http.RoundTripper }

func (s stamp) RoundTrip(req *http.Request) (*http.Response, error) {
	n, _ := req.Context().Value(noteKey{}).(*callNote)
	if n == nil {
		return s.next.RoundTrip(req)
	}
	sent := time.Now()
	r := req.Clone(req.Context()) // a RoundTripper must not change the request it is given
	q := r.URL.Query()
	q.Set("key", n.encode(sent))
	r.URL.RawQuery = q.Encode()
	return s.next.RoundTrip(r)
}

// encode writes the note: began, sent and decided (Unix ns; decided 0 when
// unknown), then the granting decision's delay and reset (ns) and
// remaining.
func (n *callNote) encode(sent time.Time) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	decided := int64(0)
	if !n.decided.IsZero() {
		decided = n.decided.UnixNano()
	}
	return strings.Join([]string{
		strconv.FormatInt(n.began.UnixNano(), 10),
		strconv.FormatInt(sent.UnixNano(), 10),
		strconv.FormatInt(decided, 10),
		strconv.FormatInt(int64(n.d.Delay), 10),
		strconv.FormatInt(int64(n.d.Reset), 10),
		strconv.FormatInt(n.d.Remaining, 10),
	}, ",")
}

// decode reads a note into a: what parses, field by field.
func decode(key string, a *arrival) {
	f := strings.Split(key, ",")
	num := func(i int) (int64, bool) {
		if i >= len(f) {
			return 0, false
		}
		v, err := strconv.ParseInt(f[i], 10, 64)
		return v, err == nil
	}
	if v, ok := num(0); ok {
		a.Began = time.Unix(0, v)
	}
	if v, ok := num(1); ok {
		a.Sent = time.Unix(0, v)
	}
	if v, ok := num(2); ok && v != 0 {
		a.Decided = time.Unix(0, v)
		d, _ := num(3)
		r, _ := num(4)
		rem, _ := num(5)
		a.Delay, a.Reset, a.Remaining = time.Duration(d), time.Duration(r), rem
	}
}

// tracedBucket (-trace) notes, for the call whose context carries a note,
// when the bucket granted it and what the grant said. Unwrap keeps what
// the bucket offers the Limiter (see throttle.Bucket). A Take made for
// several callers (a lease's refill) is noted for the one whose context
// it carries.
type tracedBucket struct{ throttle.Bucket }

func (b tracedBucket) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	d, err := b.Bucket.Take(ctx, key, n, maxWait)
	if err == nil && d.Granted {
		if note, ok := ctx.Value(noteKey{}).(*callNote); ok {
			note.mu.Lock()
			note.decided, note.d = time.Now(), d
			note.mu.Unlock()
		}
	}
	return d, err
}

// Unwrap returns the bucket b notes.
func (b tracedBucket) Unwrap() throttle.Bucket { return b.Bucket }
