// Package guarantee checks rate-limit guarantees from the times at which
// grants were observed by their callers, never from a bucket's own numbers.
// It is headway's independent counter: the bucket tests, the consumer tests,
// the end-to-end test and internal/cmd/loadtest all judge a bucket with it. It
// is not part of headway's API.
//
// A caller records the time of every grant with a [Recorder] (or keeps its
// own []time.Time) and hands the times to the checker matching the bucket's
// guarantee:
//
//	checker    guarantee                                             bucket
//	Sliding    at most limit grants in any window of its length      SlidingLog; TokenBucket's places (a
//	                                                                 window of interval + margin); a
//	                                                                 provider's strict limit
//	Aligned    at most limit grants per epoch-aligned window         FixedWindow
//	Periods    at most limit grants per refill, refills ≥ interval    a provider refilled on demand
//	           apart, the first refill at the first grant
//	Resets     the same, the first reset at any time before           Counter + Resetter
//	           the first grant
//	GCRA       at most burst + rate·t grants in any span t            GCRA, throttle.Local
//
// Each returns a [Report]: how many grants were checked, how many violate
// the guarantee, the fullest window, and how much of what the guarantee
// allows was used.
//
// # Tolerance
//
// Grant times are measured by the caller after the fact, on its own clock,
// so they are off by a little: a grant is recorded after the bucket decided
// it, and a bucket that decides on the Redis server's clock cuts its windows
// on that clock. Every checker takes a tolerance tol ≥ 0 and relaxes each
// time comparison the guarantee makes by at most tol, never more:
//
//   - Sliding: limit+1 grants violate only if they fall within a span
//     shorter than window − tol.
//   - Aligned: a grant within tol of a window's edge may count in either
//     window it touches; the checker picks the assignment that leaves the
//     fewest grants over a window's limit.
//   - Periods, Resets: refills need only be interval − tol apart.
//   - GCRA: a span t between two grants is taken as t + tol.
//
// tol = 0 checks the guarantee exactly. A larger tol only ever passes more
// sequences, never fewer: it can hide a violation of at most tol in time,
// and no other. Choose it as the most a recorded time can be late: then a
// bucket that keeps its guarantee always passes (for Periods and Resets,
// provided the lateness does not reorder grants across a refill, which
// holds whenever periods run out of permits well before they end, as they
// do under load). On a loaded machine that is not a few microseconds: 64
// goroutines waking at a window's start on two CPUs see their grants
// recorded 10–20 ms after the bucket decided them. internal/cmd/loadtest
// measures the bound for each run (the start of the granting Take, plus
// any reservation delay, to the record) and uses it.
//
// # Utilization
//
// [Report].Allowed is the most grants any sequence keeping the guarantee
// (exactly, with tol = 0) could hold between the first and the last grant
// checked; Utilization is Grants ÷ Allowed. A compliant sequence has
// Utilization ≤ 1 (a hair above 1 only when it needed the tolerance), and a
// bucket that hands out everything it may, for the whole run, comes close
// to 1. The formula for each checker is in its doc comment.
//
// # Clock
//
// Read grant and arrival times with [Now] (a [Recorder] does): the wall
// clock, which a Redis server's TIME reads on the same host and the
// buckets decide on. Times from time.Now carry a monotonic reading, and
// two of those are compared on the monotonic clock: a step of the system
// clock during a run (a time daemon, a virtual machine resumed) then moves
// every later decision of the bucket against the recorded times, and a
// correct bucket seems to grant a step's worth too many.
//
// Grant times need not be sorted; checkers sort a copy. Times are compared
// with [time.Time.Sub].
package guarantee
