package bucket

import "testing"

// StallMeter is the stall meter, for the tests of package bucket_test.
type StallMeter = stallMeter

// StartStallMeter starts a stall meter, for the tests of package
// bucket_test: see startStallMeter.
func StartStallMeter(t *testing.T) *StallMeter { return startStallMeter(t) }
