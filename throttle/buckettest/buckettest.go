package buckettest

import (
	"fmt"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/headway-go/headway/throttle"
)

// Spec describes the bucket under test: how to build it, the budget it
// keeps per key and the guarantee it states. New, Limit, Interval and
// Guarantee are required; the other fields have the defaults their docs
// give.
type Spec struct {
	// New returns a bucket over a fresh budget: nothing taken under any
	// key, no pause. Values from different calls must not share budgets.
	// The suite calls it once or more per subtest, from the subtest's
	// goroutine; use t for cleanup and t.Fatal for errors.
	New func(t *testing.T) throttle.Bucket

	// Limit is how many permits a key may be granted per Interval: the
	// rate, and what Decision.Limit reports when known.
	Limit int64
	// Interval is the period of Limit. In real time keep it short
	// (100–300 ms): some checks wait for a few intervals.
	Interval time.Duration
	// Guarantee is how Limit per Interval bounds the grants of one key.
	Guarantee Kind
	// Burst is the most permits one Take can be granted: a fresh key
	// grants that many at once, and a larger n fails with
	// throttle.ErrExceedsLimit (for several tiers, the smallest limit).
	// For the Rate guarantee it is also the burst. Default: Limit.
	Burst int64
	// Also lists further bounds the bucket keeps besides Guarantee: the
	// other tiers of a bucket with several windows, a pacer's tighter
	// bound on takes of one permit.
	Also []Guarantee

	// Clock, if set, is the fake clock the buckets from New read; the
	// suite moves it and checks exactly. Nil: the bucket decides in real
	// time (a store's clock).
	Clock *clockwork.FakeClock
	// MaxKeyLen is the longest key, in bytes, the bucket accepts; a longer
	// one must be refused with an error wrapping throttle.ErrInvalidKey
	// and throttle.ErrInvalid (the call's problem, not the
	// configuration's). 0: no
	// maximum (the suite tries keys of 4 KiB and 64 KiB).
	MaxKeyLen int
	// Remote reports that the bucket reaches its budget over a network (a
	// Redis bucket): a Take cut off by its context must then fail with a
	// *throttle.BackendError wrapping the context's error, for a
	// Limiter's failure policy.
	Remote bool

	// NewPair, if set, returns two values over one fresh budget, as two
	// instances of a fleet build them (the same store and name). The
	// suite then checks that a pause through one holds the other, and
	// that goroutines spread over both get no more than the limit.
	NewPair func(t *testing.T) (throttle.Bucket, throttle.Bucket)
	// CostDimension, for a [throttle.CostBucket], names the dimension Take
	// charges (Limit per Interval, Burst at most in one take). When set,
	// the suite also takes costs of it: every grant must carry
	// Decision.Settle, and a give-back settled after its grant's period
	// has ended must never let a later period exceed the guarantee. ""
	// (the default): no cost checks.
	CostDimension string

	// PrepareKey, if set, is called before the suite first uses a key of
	// a budget from New or NewPair (with the first value), for buckets
	// whose keys need something running, such as the Resetter of a
	// bucket.Counter. It returns once the key can grant.
	PrepareKey func(t *testing.T, b throttle.Bucket, key string)
}

// Kind is the shape of a guarantee: what a limit per period bounds.
type Kind int

const (
	// PerPeriod: at most Limit permits per period, periods at least
	// Period apart, the first beginning at the key's first grant: a token
	// bucket refilled on demand (bucket.TokenBucket).
	PerPeriod Kind = iota + 1
	// PerReset: as PerPeriod, but periods run on their own, so the first
	// may have begun at any time before the first grant (bucket.Counter
	// with its Resetter).
	PerReset
	// AlignedWindow: at most Limit permits per window [k·Period,
	// (k+1)·Period) of the Unix epoch, on the bucket's clock
	// (bucket.FixedWindow, bucket.Tiers).
	AlignedWindow
	// SlidingWindow: at most Limit permits in any span shorter than
	// Period (bucket.SlidingLog).
	SlidingWindow
	// Rate: at most Burst + Limit·t/Period permits in any span t, a
	// reservation counted at the time it is for (throttle.Local,
	// bucket.GCRA).
	Rate
)

// String returns the Kind's name.
func (k Kind) String() string {
	switch k {
	case PerPeriod:
		return "PerPeriod"
	case PerReset:
		return "PerReset"
	case AlignedWindow:
		return "AlignedWindow"
	case SlidingWindow:
		return "SlidingWindow"
	case Rate:
		return "Rate"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Guarantee is one bound on the grants of a key, for [Spec].Also.
type Guarantee struct {
	Kind Kind
	// Limit permits per Period; both required.
	Limit  int64
	Period time.Duration
	// Burst is the burst of a Rate guarantee. Default: Limit.
	Burst int64
	// OnePermit limits the bound to takes of one permit: the suite
	// judges it on runs that take one permit at a time only (a pacer may
	// space single permits but grant a weighted take at once).
	OnePermit bool
}

// String names g for a test's messages.
func (g Guarantee) String() string {
	s := fmt.Sprintf("%v %d per %v", g.Kind, g.Limit, g.Period)
	if g.Kind == Rate {
		s += fmt.Sprintf(" burst %d", g.Burst)
	}
	if g.OnePermit {
		s += " (takes of one permit)"
	}
	return s
}

// Run runs the conformance suite on the bucket spec describes, each check
// as a subtest of t. Checks for optional behaviour run only when the
// bucket has it: the pause checks for a bucket with a Pause method, the
// refund check for one with a Refund method (see [throttle.Bucket]; the
// buckets of package bucket all pause, through what they offer a Limiter,
// and none takes refunds). A Spec that is incomplete or inconsistent fails
// t at once.
func Run(t *testing.T, spec Spec) {
	t.Helper()
	s, err := newSuite(spec)
	if err != nil {
		t.Fatalf("buckettest: %v", err)
	}
	probe := s.New(t)
	if probe == nil {
		t.Fatalf("buckettest: Spec.New returned nil")
	}
	for _, c := range checks {
		if c.applies != nil && !c.applies(s, probe) {
			continue
		}
		t.Run(c.name, func(t *testing.T) { c.run(t, s) })
	}
}

// check is one behaviour the suite checks.
type check struct {
	name string
	// applies reports whether the check applies to the bucket (nil: it
	// always does).
	applies func(s *suite, b throttle.Bucket) bool
	run     func(t *testing.T, s *suite)
}

// offers reports whether b offers T (throttle.BucketAs).
func offers[T any](_ *suite, b throttle.Bucket) bool {
	_, ok := throttle.BucketAs[T](b)
	return ok
}
func isCostBucket(s *suite, b throttle.Bucket) bool {
	_, ok := b.(throttle.CostBucket)
	return ok && s.CostDimension != ""
}
func hasMaxKey(s *suite, _ throttle.Bucket) bool { return s.MaxKeyLen > 0 }
func noMaxKey(s *suite, _ throttle.Bucket) bool  { return s.MaxKeyLen == 0 }

var checks = []check{
	{name: "refusal names a delay after which a take succeeds", run: checkRefusalDelay},
	{name: "n permits are granted all or nothing", run: checkAllOrNothing},
	{name: "keys are independent", run: checkKeysIndependent},
	{name: "key longer than the maximum is refused", applies: hasMaxKey, run: checkLongKey},
	{name: "long keys are accepted", applies: noMaxKey, run: checkLongKey},
	{name: "n above the burst exceeds the limit at once", run: checkExceedsLimit},
	{name: "n below one is invalid", run: checkInvalidN},
	{name: "decision fields agree with the decision", run: checkDecisionFields},
	{name: "pause holds every value sharing the budget", applies: offers[throttle.Pauser], run: checkPauseShared},
	{name: "shorter pause never shortens a longer one", applies: offers[throttle.Pauser], run: checkPauseNotShortened},
	{name: "pause ends after its length", applies: offers[throttle.Pauser], run: checkPauseEnds},
	{name: "pause above MaxPause is clamped", applies: offers[throttle.Pauser], run: checkPauseClamped},
	{name: "pause of zero or less does nothing", applies: offers[throttle.Pauser], run: checkPauseZero},
	{name: "refunds never exceed the guarantee", applies: offers[throttle.Refunder], run: checkRefunds},
	{name: "late give-backs of costs never exceed the guarantee", applies: isCostBucket, run: checkCostGiveBacks},
	{name: "concurrent takes stay within the guarantee", run: checkConcurrent},
	{name: "guarantee holds over several intervals", run: checkGuarantee},
	{name: "ended context fails the take", run: checkContext},
}

// suite is a validated Spec with what the checks derive from it.
type suite struct {
	Spec
	guarantees []Guarantee // Guarantee first, then Also, defaults filled in
	limits     map[int64]bool
	horizon    time.Duration // the longest a key takes to be full again
	maxKey     int           // the longest key the suite tries
}

const noMaxKeyLen = 4096

func newSuite(spec Spec) (*suite, error) {
	switch {
	case spec.New == nil:
		return nil, fmt.Errorf("Spec.New is nil: give a function that returns a bucket over a fresh budget")
	case spec.Limit < 1:
		return nil, fmt.Errorf("Spec.Limit = %d, must be at least 1", spec.Limit)
	case spec.Interval <= 0:
		return nil, fmt.Errorf("Spec.Interval = %v, must be positive", spec.Interval)
	case spec.Burst < 0:
		return nil, fmt.Errorf("Spec.Burst = %d, must be at least 1 (or 0 for Limit)", spec.Burst)
	case spec.MaxKeyLen < 0:
		return nil, fmt.Errorf("Spec.MaxKeyLen = %d, must be at least 1 (or 0 for no maximum)", spec.MaxKeyLen)
	}
	if spec.Burst == 0 {
		spec.Burst = spec.Limit
	}
	s := &suite{Spec: spec, limits: map[int64]bool{spec.Limit: true}, maxKey: spec.MaxKeyLen}
	if s.maxKey == 0 {
		s.maxKey = noMaxKeyLen
	}
	main := Guarantee{Kind: spec.Guarantee, Limit: spec.Limit, Period: spec.Interval, Burst: spec.Burst}
	for i, g := range append([]Guarantee{main}, spec.Also...) {
		field := "Spec.Guarantee"
		if i > 0 {
			field = fmt.Sprintf("Spec.Also[%d]", i-1)
		}
		if g.Kind < PerPeriod || g.Kind > Rate {
			return nil, fmt.Errorf("%s: Kind = %v, must be PerPeriod, PerReset, AlignedWindow, SlidingWindow or Rate", field, g.Kind)
		}
		if g.Limit < 1 || g.Period <= 0 {
			return nil, fmt.Errorf("%s: Limit = %d and Period = %v, must be at least 1 and positive", field, g.Limit, g.Period)
		}
		if g.Burst < 0 {
			return nil, fmt.Errorf("%s: Burst = %d, must be at least 1 (or 0 for Limit)", field, g.Burst)
		}
		if g.Burst == 0 || g.Kind != Rate {
			g.Burst = g.Limit
		}
		s.guarantees = append(s.guarantees, g)
		s.limits[g.Limit] = true
		// A key's budget is full again at the latest after its longest
		// period, or the time a Rate's burst takes to refill.
		full := g.Period
		if g.Kind == Rate && g.Burst > g.Limit {
			full = time.Duration(float64(g.Period) * float64(g.Burst) / float64(g.Limit))
		}
		s.horizon = max(s.horizon, full)
	}
	return s, nil
}

// real reports whether the bucket decides in real time.
func (s *suite) real() bool { return s.Clock == nil }

// mustOf is what v offers of T (throttle.BucketAs), which the caller checked v has.
func mustOf[T any](v throttle.Bucket) T {
	t, _ := throttle.BucketAs[T](v)
	return t
}
