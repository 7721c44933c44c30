// This program does not compile, on purpose: each line marked "want" gives
// an option to a constructor that does not read it. TestMisplacedOptions
// builds it and checks that every such line is refused with the error
// named. The lines without "want" are the same options where they belong.
package main

import (
	"net/http"
	"time"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/httpclient"
	"github.com/headway-go/headway/throttle/httpserver"
)

func main() {
	local, _ := throttle.NewLocal(10, time.Second, throttle.WithClock(nil), throttle.WithLocalBurst(2))
	lim := throttle.New(local, throttle.WithClock(nil), throttle.WithFailurePolicy(throttle.FailOpen), throttle.WithStoreTimeout(time.Second))
	_ = throttle.New(local, throttle.WithLeasing(throttle.Leasing{Share: 0.5}), throttle.WithLogger(nil), throttle.WithStoreTimeout(time.Second))
	_, _ = throttle.NewSmooth(local, 10, time.Second, throttle.WithSmoothInstances(2), throttle.WithClock(nil))

	_, _ = httpserver.NewMiddleware(nil, httpserver.LocalWindows(nil), httpserver.TenantHeader("X-Org-Id"), throttle.WithFailurePolicy(throttle.FailClosed)) // want "throttle.Option does not implement httpserver.Option"
	_, _ = httpclient.NewTransport(lim, throttle.WithLogger(nil))                                                                                            // want "throttle.Option does not implement httpclient.Option"
	_, _ = httpclient.NewTransport(lim, httpclient.WithBase(http.DefaultTransport))
}
