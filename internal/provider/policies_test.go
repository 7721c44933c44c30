package provider

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLeakyPolicy(t *testing.T) {
	// 10 per second (one per 100 ms) with a burst of 2.
	p := &Provider{cfg: Config{Limit: 10, Interval: time.Second, Policy: Leaky, Burst: 2}, seen: map[recordID]int{}}
	t0 := time.Unix(1000, 0)
	p.started = t0
	ms := time.Millisecond
	var got []bool
	for _, at := range []time.Duration{0, 0, 0, 100 * ms, 150 * ms, 200 * ms, 300 * ms, 400 * ms, 400 * ms} {
		ok, _ := p.admit(t0.Add(at))
		got = append(got, ok)
	}
	assert.Equal(t, []bool{true, true, false, true, false, true, true, true, false}, got)
	ok, retry := p.admit(t0.Add(450 * ms))
	assert.False(t, ok)
	assert.Equal(t, 50*ms, retry, "the next request fits when the bucket has leaked one")
}

func TestPhasesChangeTheLimit(t *testing.T) {
	p := &Provider{cfg: Config{Limit: 4, Interval: time.Second, Policy: Aligned, Phases: []Phase{{At: 2 * time.Second, Limit: 2}, {At: 4 * time.Second, Limit: 4}}}, seen: map[recordID]int{}}
	t0 := time.Unix(1000, 0)
	p.started = t0
	accepted := func(sec int) int {
		n := 0
		for i := range 6 {
			if ok, _ := p.admit(t0.Add(time.Duration(sec)*time.Second + time.Duration(i)*time.Millisecond)); ok {
				n++
			}
		}
		return n
	}
	var got []int
	for sec := range 6 {
		got = append(got, accepted(sec))
	}
	assert.Equal(t, []int{4, 4, 2, 2, 4, 4}, got, "the limit halves at 2 s and recovers at 4 s")
}

func TestNoHintAndTallies(t *testing.T) {
	p, err := Start(Config{Limit: 2, Interval: time.Hour, Policy: Sliding, NoHint: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	defer http.DefaultClient.CloseIdleConnections()
	var codes []int
	for range 3 {
		resp, err := http.Get(p.URL())
		require.NoError(t, err)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		assert.Empty(t, resp.Header.Get("Retry-After"), "no retry hint")
	}
	assert.Equal(t, []int{200, 200, 429}, codes)
	assert.Equal(t, []Tally{{Accepted: 2, Refused: 1}}, p.Tallies(time.Hour))
}
