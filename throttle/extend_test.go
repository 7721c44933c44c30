package throttle_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/headway-go/headway/throttle"
)

// pauseKeeper is a bucket of a program's own that can pause a key.
type pauseKeeper struct{ paused map[string]time.Duration }

func (p *pauseKeeper) Take(context.Context, string, int64, time.Duration) (throttle.Decision, error) {
	return throttle.Decision{Granted: true}, nil
}

func (p *pauseKeeper) Pause(_ context.Context, key string, d time.Duration) error {
	p.paused[key] = d
	return nil
}

// passOn counts nothing and hides what it wraps but for Unwrap.
type passOn struct{ inner throttle.Bucket }

func (w passOn) Take(ctx context.Context, key string, n int64, maxWait time.Duration) (throttle.Decision, error) {
	return w.inner.Take(ctx, key, n, maxWait)
}

func (w passOn) Unwrap() throttle.Bucket { return w.inner }

// selfLoop unwraps to itself.
type selfLoop struct{ passOn }

func (l *selfLoop) Unwrap() throttle.Bucket { return l }

// ExampleBucketAs pauses a tenant for the whole fleet, through whatever
// wraps the bucket, as the Transport of throttle/httpclient does on a 429.
func ExampleBucketAs() {
	b := &pauseKeeper{paused: map[string]time.Duration{}}
	lim := throttle.New(passOn{b})
	if p, ok := throttle.BucketAs[throttle.Pauser](lim.Bucket()); ok {
		_ = p.Pause(context.Background(), "tenant-a", 30*time.Second)
	}
	fmt.Println(b.paused)
	// Output: map[tenant-a:30s]
}

// TestBucketAsFollowsUnwrapAndStopsAtNilsAndLoops: BucketAs finds the
// first bucket of the chain with the method, and answers false, without
// panicking or spinning, for nil, a typed nil, an Unwrap to nil and a
// chain that loops.
func TestBucketAsFollowsUnwrapAndStopsAtNilsAndLoops(t *testing.T) {
	p := &pauseKeeper{paused: map[string]time.Duration{}}
	for _, c := range []struct {
		name string
		b    throttle.Bucket
		want bool
	}{
		{"the bucket itself", p, true},
		{"behind two wrappers", passOn{passOn{p}}, true},
		{"nil", nil, false},
		{"a typed nil", (*pauseKeeper)(nil), false},
		{"an Unwrap to nil", passOn{nil}, false},
		{"an Unwrap to a typed nil", passOn{(*pauseKeeper)(nil)}, false},
		{"a chain that loops", &selfLoop{}, false},
		{"a bucket without it", passOn{&selfLoop{}}, false},
	} {
		got, ok := throttle.BucketAs[throttle.Pauser](c.b)
		if ok != c.want || ok && got != throttle.Pauser(p) {
			t.Errorf("%s: BucketAs = %v, %v; want %v", c.name, got, ok, c.want)
		}
	}
}
