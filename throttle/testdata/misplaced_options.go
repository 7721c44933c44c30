// This program does not compile, on purpose: each line marked "want" gives
// an option to a constructor that does not read it. TestMisplacedOptions
// builds it and checks that every such line is refused with the error
// named. The lines without "want" are the same options where they belong.
package main

import (
	"net/http"
	"time"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
	"github.com/headway-go/headway/throttle/httpserver"
)

func main() {
	local, _ := throttle.NewLocal(10, time.Second, throttle.WithClock(nil), throttle.WithLocalBurst(2))
	lim := throttle.New(local, throttle.WithClock(nil), throttle.WithFailurePolicy(throttle.FailOpen), throttle.WithStoreTimeout(time.Second))
	_ = throttle.New(local, throttle.WithLeasing(throttle.Leasing{Share: 0.5}), throttle.WithLogger(nil), throttle.WithStoreTimeout(time.Second))

	_, _ = throttle.NewLocal(10, time.Second, throttle.WithFailurePolicy(throttle.FailOpen)) // want "throttle.LimiterOption does not implement throttle.LocalOption"
	_, _ = throttle.NewLocal(10, time.Second, throttle.WithLeasing(throttle.Leasing{}))      // want "throttle.LimiterOption does not implement throttle.LocalOption"
	_, _ = throttle.NewLocal(10, time.Second, throttle.WithLogger(nil))                      // want "throttle.LimiterOption does not implement throttle.LocalOption"
	_ = throttle.New(local, throttle.WithLocalBurst(1))                                      // want "throttle.LocalOption does not implement throttle.LimiterOption"

	_, _ = bucket.NewTokenBucket(nil, "k", 10, time.Second, bucket.WithBurst(0))                // want "bucket.GCRAOption does not implement bucket.TokenBucketOption"
	_, _ = bucket.NewTokenBucket(nil, "k", 10, time.Second, bucket.WithLeaderLease(time.Hour))  // want "bucket.LeaderOption does not implement bucket.TokenBucketOption"
	_, _ = bucket.NewFixedWindow(nil, "k", 10, time.Second, bucket.WithRetry(time.Millisecond)) // want "bucket.RetryOption does not implement bucket.CommonOption"
	_, _ = bucket.NewTokenBucket(nil, "k", 10, time.Second, bucket.WithRetry(time.Millisecond)) // want "bucket.RetryOption does not implement bucket.TokenBucketOption"
	_, _ = bucket.NewFixedWindow(nil, "k", 10, time.Second, bucket.WithArrivalMargin(0))        // want "bucket.ArrivalMarginOption does not implement bucket.CommonOption"
	_, _ = bucket.NewGCRA(nil, "k", 10, time.Second, bucket.WithRetry(time.Millisecond))        // want "bucket.RetryOption does not implement bucket.GCRAOption"
	_, _ = bucket.NewTokenBucket(nil, "k", 10, time.Second, bucket.WithPrefix("p"), bucket.WithArrivalMargin(time.Millisecond))
	_, _ = bucket.NewTokenBucket(nil, "k", 10, time.Second, bucket.WithLease(time.Second)) // want "bucket.ConcurrencyOption does not implement bucket.TokenBucketOption"
	_, _ = bucket.NewConcurrency(nil, "k", 2, bucket.WithHeartbeat(time.Second))           // want "bucket.CommonOption does not implement bucket.ConcurrencyOption"
	_, _ = bucket.NewBudget(nil, "k", nil, bucket.WithBurst(2))                            // want "bucket.GCRAOption does not implement bucket.BudgetOption"
	_, _ = bucket.NewBudget(nil, "k", nil, bucket.WithRetry(time.Millisecond))             // want "bucket.RetryOption does not implement bucket.BudgetOption"
	_, _ = bucket.NewBudget(nil, "k", nil, bucket.WithLease(time.Second))                  // want "bucket.ConcurrencyOption does not implement bucket.BudgetOption"
	_, _ = bucket.NewBudget(nil, "k", nil, bucket.WithPrefix("p"), bucket.WithHeartbeat(time.Second), bucket.WithArrivalMargin(time.Millisecond))
	_, _ = bucket.NewConcurrency(nil, "k", 2, bucket.WithPrefix("p"), bucket.WithLease(time.Second))

	_, _ = httpserver.NewMiddleware(nil, httpserver.LocalWindows(nil), httpserver.TenantHeader("X-Org-Id"), throttle.WithFailurePolicy(throttle.FailClosed)) // want "throttle.LimiterOption does not implement httpserver.Option"
	_, _ = httpclient.NewTransport(lim, throttle.WithLogger(nil))                                                                                            // want "throttle.LimiterOption does not implement httpclient.Option"
	_, _ = httpclient.NewTransport(lim, httpclient.WithBase(http.DefaultTransport))
}
