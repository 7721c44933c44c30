// Package buckettest is a conformance suite for [throttle.Bucket]
// implementations: it checks, from the outside, the contract a
// [throttle.Limiter] relies on. Run it from a test of your bucket:
//
//	func TestConformance(t *testing.T) {
//		buckettest.Run(t, buckettest.Spec{New: newBucket, Limit: 10, Interval: 100 * time.Millisecond,
//			Guarantee: buckettest.SlidingWindow})
//	}
//
// where newBucket(t) returns a bucket whose budget nothing has taken from
// yet (a fresh Redis key, a new in-memory value), and Guarantee states the
// bound the bucket keeps (here: at most 10 permits in any 100 ms).
//
// Each check is a subtest named after the behaviour it checks:
//   - a refusal names a positive Delay, after which asking again succeeds;
//   - n permits are granted all or nothing, and a refusal charges nothing;
//   - keys are independent and each is limited; any non-empty key up to
//     the bucket's maximum is accepted, a longer one is refused with an
//     error;
//   - n above the burst fails with [throttle.ErrExceedsLimit] at once, even
//     on a spent key, and n < 1 with [throttle.ErrInvalid];
//   - Decision's Limit, Remaining and Reset agree with the decision;
//   - a pause (a Pause method, see [throttle.Bucket]) holds every value
//     sharing the budget, is never
//     shortened, and clamps a pause above [throttle.MaxPause];
//   - refunds (a Refund method) never let grants exceed the guarantee;
//   - a [throttle.CostBucket]'s grants carry Decision.Settle, and a cost
//     given back after its period has ended never lets a later period
//     exceed the guarantee ([Spec].CostDimension);
//   - many goroutines taking at once get no more than the guarantee allows;
//   - the bucket's guarantee holds over several intervals (with weighted
//     takes, reservations, idle spells and a pause), judged by an
//     independent checker on the times the suite saw grants;
//   - a Take whose context has ended fails with the context's error.
//
// # Time
//
// A bucket that takes a clockwork clock runs on a [clockwork.FakeClock] given
// in [Spec].Clock: the suite moves it, and every check is exact. A bucket that
// decides on a store's clock (a Redis server's TIME) runs in real time: keep
// its Interval short (100–300 ms), as the checks that need time to pass wait
// for a few intervals. In real time the suite reads the wall clock, the one a
// store's TIME reads on the same host, so that a step of the system clock
// during a run (a time daemon, a virtual machine resumed) moves the bucket's
// decisions and the suite's readings alike; a bucket deciding on the monotonic
// clock belongs on a fake clock. In real time the suite asserts only what a
// loaded machine cannot make flaky: it counts a grant when Take returns it,
// judges grant times with a tolerance of the time Take took (setting aside the
// few grants whose Take was too slow to time them, but counting them against
// the total allowed), follows a chain of short refusals where the contract
// allows one, and never asserts that something ends within a duration, other
// than a generous bound that catches a hang. So in real time a fault in timing
// smaller than that tolerance (at most a tenth of the interval) can go unseen,
// such as a period refilled a few percent early; on a fake clock none can.
package buckettest
