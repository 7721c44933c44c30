package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// TestShowAdaptiveRate: show says whether the fleet is adapting, and at
// what rate, once a refusal without a retry hint was reported.
func TestShowAdaptiveRate(t *testing.T) {
	srv := redisenv.New(t)
	b, err := bucket.NewTokenBucket(srv.Client(), "billing", 50, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	code, out, errs := ctl(t, srv.Addr(), "show", "-key", "billing")
	if code != 0 || !strings.Contains(out, "adaptive   off") {
		t.Fatalf("show before: exit %d, %s\n%s", code, errs, out)
	}
	if err := throttle.New(b).Report(context.Background(), throttle.Answer{Refused: true}); err != nil {
		t.Fatal(err)
	}
	code, out, errs = ctl(t, srv.Addr(), "show", "-key", "billing")
	if code != 0 || !strings.Contains(out, "adaptive   45 per interval, paced evenly (ceiling the configured limit, last refused at 50); decreased ") {
		t.Fatalf("show after a refusal: exit %d, %s\n%s", code, errs, out)
	}
}
