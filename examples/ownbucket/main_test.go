package main

import (
	"bytes"
	"context"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestTransportPausesAndLimiterAdaptsAUsersOwnBucket: through exported
// interfaces only (this module cannot import headway's internal
// packages), the Transport pauses the program's own bucket on the
// provider's 429 with Retry-After, the calls after it wait out the pause
// and succeed, and the Limiter keeps the adaptive rate it learned in the
// bucket, where the program reads it below the bucket's limit.
func TestTransportPausesAndLimiterAdaptsAUsersOwnBucket(t *testing.T) {
	r, err := run(context.Background(), 3)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{429, 200, 200}; len(r.statuses) != 3 || r.statuses[0] != want[0] || r.statuses[1] != want[1] || r.statuses[2] != want[2] {
		t.Errorf("answers %v, want %v", r.statuses, want)
	}
	if len(r.pauses) != 1 || r.pauses[0] != `"" for 1s` {
		t.Errorf("pauses of the bucket %q, want one of the key for 1s (the provider's Retry-After)", r.pauses)
	}
	if !r.adaptive.Active() || r.adaptive.Rate >= 10 {
		t.Errorf("adaptive state %+v: want active, below the bucket's 10 per second, after a refusal", r.adaptive)
	}
}

// TestCommandLine: -h exits 0, a stray argument or an unknown flag 2, a
// run 0 with its summary.
func TestCommandLine(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"-h"}, 0, ""},
		{[]string{"stray"}, 2, ""},
		{[]string{"-nope"}, 2, ""},
		{[]string{"-calls", "0"}, 2, ""},
		{[]string{"-calls", "2"}, 0, "pauses of the bucket"},
	} {
		var out, errOut bytes.Buffer
		if got := command(context.Background(), c.args, &out, &errOut); got != c.code || !bytes.Contains(out.Bytes(), []byte(c.out)) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d with %q", c.args, got, out.String(), errOut.String(), c.code, c.out)
		}
	}
}

// TestMemBucketForgetsIdleKeys: the bucket's memory follows the keys in
// use: with windows of a nanosecond, every earlier key's window has ended
// by the next take, and 5,000 keys leave fewer than the 1,024 entries at
// which it forgets them.
func TestMemBucketForgetsIdleKeys(t *testing.T) {
	b := newMemBucket(10, time.Nanosecond)
	for i := range 5000 {
		if _, err := b.Take(context.Background(), strconv.Itoa(i), 1, 0); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(b.windows); n > 1024 {
		t.Errorf("%d windows kept after 5,000 keys of ended windows, want at most 1,024", n)
	}
}
