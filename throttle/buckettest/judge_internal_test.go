package buckettest

import (
	"fmt"
	"testing"
	"time"

	"github.com/headway-go/headway/throttle"
)

// errorsTB records what a check reports, for a test of the judge itself.
type errorsTB struct {
	testing.TB
	errs []string
}

func (e *errorsTB) Helper() {}

func (e *errorsTB) Errorf(format string, args ...any) {
	e.errs = append(e.errs, fmt.Sprintf(format, args...))
}

// TestJudgeCountsAPeriodFromTheRunsFirstTakeKeptOrNot: a bucket of 10 per
// 200 ms periods whose first period a take started and handed back (a
// Budget's refund goes to no period): 9 permits kept in it from 1 ms on,
// then 2 at the next period's start, 11 kept within less than one
// interval of the first kept. The guarantee holds (the first period
// started at the handed-back take), and the judge must say so; the same
// permits with no earlier take break it, and the judge must say that.
func TestJudgeCountsAPeriodFromTheRunsFirstTakeKeptOrNot(t *testing.T) {
	s, err := newSuite(Spec{
		New:       func(*testing.T) throttle.Bucket { return nil },
		Limit:     10,
		Interval:  200 * time.Millisecond,
		Guarantee: PerPeriod,
	})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	kept := func(r *recorder) *recorder {
		r.add(at(1), at(1.2), 9)
		r.add(at(200.1), at(200.3), 2)
		return r
	}

	handedBack := &recorder{}
	handedBack.began(at(0))
	var tb errorsTB
	s.judge(&tb, "kept after a take handed back", kept(handedBack), true)
	if len(tb.errs) > 0 {
		t.Errorf("judge reports a guarantee kept as broken when the run's first take (at +0) was handed back: %q", tb.errs)
	}

	tb = errorsTB{}
	s.judge(&tb, "kept from the run's first take", kept(&recorder{}), true)
	if len(tb.errs) == 0 {
		t.Errorf("judge passes 11 permits within 199.2 ms of the run's first take, 10 per 200 ms periods allowing at most 10")
	}
}
