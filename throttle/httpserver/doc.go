// Package httpserver enforces a provider's published rate limits on its
// own HTTP API: per tenant and endpoint, in front of the handlers.
//
//	slas, err := httpserver.LoadSLAs("limits.yaml")
//	if err != nil { ... }
//	mw, err := httpserver.NewMiddleware(slas, httpserver.LocalWindows(nil), tenantOf)
//	if err != nil { ... }
//	http.ListenAndServe(addr, mw.Wrap(api))
//
// where tenantOf returns the identity your authentication established for
// the request (see [NewMiddleware]: never a header the client may set
// freely).
//
// An [SLA] names the requests it covers (methods, a path pattern) and its
// tiers, which must all pass: "1000 per 10 s and 10000 per hour". Each
// tenant has its own budget in each SLA. A [BucketFactory] builds the
// bucket that keeps the count: [LocalWindows] in memory for one process,
// or a Redis bucket of package github.com/headway-go/headway/bucket
// (NewTiers for fixed windows, NewSlidingLog for sliding ones) shared by
// every replica of the API. Answers carry X-RateLimit-Limit, -Remaining
// and -Reset (and, on request, the IETF draft RateLimit fields); a refused
// request gets 429 with Retry-After.
//
// # Limits file
//
// [ParseSLAs] and [LoadSLAs] read SLAs from YAML:
//
//	slas:
//	  - id: get-product           # names the SLA in keys and headers
//	    enabled: true             # optional, default true; false skips it
//	    match:                    # optional, default every request
//	      methods: [GET]          # optional, default every method
//	      pathPattern: /product/* # optional, path.Match syntax: * is one segment
//	    tenant:                   # optional, default the Middleware's tenant function
//	      header: X-Org-Id        # or pathSegment: 2 (0 is the first segment)
//	    bucket: fixed             # optional: fixed (default) or sliding
//	    tiers:                    # at least one; a call must pass them all
//	      - period: 10            # seconds, a whole number from 1 to 31622400 (366 days)
//	        threshold: 1000       # calls per period per tenant, at least 1
//
// A file that does not fit is refused with an [*SLAError] naming the line
// and the field, such as
//
//	httpserver: limits limits.yaml: line 12: slas[1].tiers[0].period: must be a whole number of seconds from 1 to 31622400, got "-3"
//
// A tenant header or path segment in the file is trusted as it is: name
// one only when your infrastructure sets it after authentication, or
// checks, before the Middleware counts the request, that the caller
// belongs to the tenant it names (see [NewMiddleware] and
// [TenantPathSegment]).
//
// Unknown fields, repeated fields and repeated ids are refused too, and so
// are YAML anchors and aliases (a limits file has no use for them).
package httpserver
