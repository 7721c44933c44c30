package buckettest_test

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/headway-go/headway/throttle"
	"github.com/headway-go/headway/throttle/buckettest"
	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"
)

// brokenEnv, set to 1, makes TestSuiteCatchesBrokenBuckets run the suite
// on the broken reference buckets: it runs itself so in a child process
// and reads which checks failed there.
const brokenEnv = "BUCKETTEST_RUN_BROKEN"

// TestMain fails the package's tests if any goroutine outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	refLimit    = 10
	refInterval = time.Second
	refBurst    = 4
)

// refSpec is the Spec of a reference bucket with bug b: on a fake clock,
// or in real time (a 100 ms interval).
func refSpec(b bug, real bool) buckettest.Spec {
	spec := buckettest.Spec{Limit: refLimit, Interval: refInterval, Burst: refBurst, Guarantee: buckettest.Rate}
	var clock clockwork.Clock = clockwork.NewRealClock()
	if real {
		spec.Interval = 100 * time.Millisecond
	} else {
		fake := clockwork.NewFakeClock()
		spec.Clock, clock = fake, fake
	}
	spec.New = func(*testing.T) throttle.Bucket { return newRef(clock, refLimit, refBurst, spec.Interval, b) }
	return spec
}

// runBroken runs the suite on a reference bucket with each bug, on a fake
// clock, and with the bugs that only real time shows, in real time.
func runBroken(t *testing.T) {
	for b := range bugNames {
		t.Run(b.String(), func(t *testing.T) { buckettest.Run(t, refSpec(b, false)) })
	}
	for _, b := range []bug{correct, fastRate} {
		t.Run(b.String()+"RealTime", func(t *testing.T) { buckettest.Run(t, refSpec(b, true)) })
	}
}

// TestCorrectBucketPasses: a correct bucket, written as a user would,
// passes the whole suite (every optional check included: it pauses and
// refunds).
func TestCorrectBucketPasses(t *testing.T) {
	buckettest.Run(t, refSpec(correct, false))
}

// TestExampleWindowConforms runs the suite on the package example's
// bucket, exactly as the example shows.
func TestExampleWindowConforms(t *testing.T) {
	clock := clockwork.NewFakeClock()
	buckettest.Run(t, buckettest.Spec{
		New:       func(*testing.T) throttle.Bucket { return newWindow(clock, 10, time.Second) },
		Limit:     10,
		Interval:  time.Second,
		Guarantee: buckettest.AlignedWindow,
		Clock:     clock,
	})
}

// TestSuiteCatchesBrokenBuckets runs the suite on a reference bucket with
// one bug at a time and checks that the checks meant to catch each bug
// fail, and that nothing fails for the correct one, on a fake clock or in
// real time.
func TestSuiteCatchesBrokenBuckets(t *testing.T) {
	if os.Getenv(brokenEnv) == "1" {
		runBroken(t) // the child process
		return
	}
	const (
		refusal     = "refusal_names_a_delay_after_which_a_take_succeeds"
		allOrNone   = "n_permits_are_granted_all_or_nothing"
		keys        = "keys_are_independent"
		exceeds     = "n_above_the_burst_exceeds_the_limit_at_once"
		invalidN    = "n_below_one_is_invalid"
		fields      = "decision_fields_agree_with_the_decision"
		shortened   = "shorter_pause_never_shortens_a_longer_one"
		clamped     = "pause_above_MaxPause_is_clamped"
		refunds     = "refunds_never_exceed_the_guarantee"
		concurrent  = "concurrent_takes_stay_within_the_guarantee"
		guaranteed  = "guarantee_holds_over_several_intervals"
		contextEnds = "ended_context_fails_the_take"
	)
	want := map[string][]string{
		"correct":          nil,
		"correctRealTime":  nil,
		"overAdmit":        {concurrent, guaranteed, fields},
		"zeroDelay":        {refusal},
		"shortDelay":       {refusal},
		"partialCharge":    {allOrNone},
		"sharedKeys":       {keys},
		"truncatedKeys":    {keys},
		"noExceeds":        {exceeds},
		"acceptsZero":      {invalidN},
		"remainingOff":     {fields},
		"pauseShortens":    {shortened},
		"pauseOverflows":   {clamped},
		"refundNaive":      {refunds},
		"racy":             {concurrent},
		"ignoresCtx":       {contextEnds},
		"fastRate":         {guaranteed},
		"fastRateRealTime": {guaranteed},
		"rootRacy":         {concurrent},
		"sweepsLive":       {keys},
		"unlimitedBraces":  {keys},
		"shortTTL":         {guaranteed},
		"pauseRefills":     {guaranteed},
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSuiteCatchesBrokenBuckets$", "-test.count=1")
	cmd.Env = append(os.Environ(), brokenEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the suite passed every broken bucket:\n%s", out)
	}
	failed := map[string][]string{}
	for _, m := range regexp.MustCompile(`--- FAIL: TestSuiteCatchesBrokenBuckets/(\w+)/(\S+)`).FindAllStringSubmatch(string(out), -1) {
		failed[m[1]] = append(failed[m[1]], m[2])
	}
	for variant, checks := range want {
		if checks == nil && len(failed[variant]) > 0 {
			t.Errorf("%s: the suite failed a correct bucket: %v", variant, failed[variant])
		}
		for _, c := range checks {
			if !slices.Contains(failed[variant], c) {
				t.Errorf("%s: check %q passed; it must catch this bug (failed: %v)", variant, c, failed[variant])
			}
		}
	}
	if t.Failed() {
		t.Logf("output of the broken buckets' run:\n%s", tail(string(out), 200))
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
