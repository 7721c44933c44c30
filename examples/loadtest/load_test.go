package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// smallRun is about a second of load: ten intervals of 200 permits.
func smallRun(b, addr string) loadConfig {
	return loadConfig{
		Bucket:    b,
		Limit:     200,
		Interval:  100 * time.Millisecond,
		Instances: 2,
		Workers:   4,
		Duration:  time.Second,
		Redis:     addr,
		Tolerance: -1, // measured
	}
}

func TestRunLoad(t *testing.T) {
	for _, tc := range []struct {
		bucket string
		util   float64 // least utilization expected
	}{
		{"local", 0.9},
		{"tokenbucket", 0.9},
		{"fixedwindow", 0.9},
		{"slidinglog", 0.9},
		{"gcra", 0.9},
		// Resets allows one period more than a run that starts on a
		// reset can use: 10 of 11 periods.
		{"counter", 0.8},
	} {
		t.Run(tc.bucket, func(t *testing.T) {
			addr := ""
			if tc.bucket != "local" {
				addr = redisenv.New(t).Addr()
			}
			res, err := runLoad(context.Background(), smallRun(tc.bucket, addr))
			require.NoError(t, err)
			t.Logf("%+v", res)
			assert.Zero(t, res.Violations, res.Guarantee)
			assert.Greater(t, res.Utilization, tc.util, res.Guarantee)
			assert.Zero(t, res.Errors, res.FirstError)
			assert.Positive(t, res.AcquireP99us)
			assert.GreaterOrEqual(t, res.AcquireP99us, res.AcquireP50us)
			if tc.bucket == "local" {
				assert.Zero(t, res.RedisCmdsPerGrant)
			} else {
				assert.GreaterOrEqual(t, res.RedisCmdsPerGrant, 1.0, "every grant costs at least one command")
				assert.Less(t, res.RedisCmdsPerGrant, 3.0)
			}
		})
	}
}

func TestRunLoadTarget(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1)%10 == 0 {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer srv.Close()
	c := smallRun("local", "")
	c.Duration = 300 * time.Millisecond
	c.Target = srv.URL
	res, err := runLoad(context.Background(), c)
	require.NoError(t, err)
	assert.Equal(t, int64(res.Grants), res.TargetOK+res.Target429+res.TargetErrors)
	assert.Positive(t, res.Target429)
	srv.CloseClientConnections()
}

func TestMainJSON(t *testing.T) {
	var out, errOut bytes.Buffer
	c := smallRun("local", "")
	c.Duration = 200 * time.Millisecond
	require.NoError(t, run(context.Background(), c, true, &out, &errOut))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &got))
	for _, k := range []string{"bucket", "limit", "interval_ms", "instances", "workers", "duration_s", "grants",
		"grants_per_sec", "utilization", "violations", "redis_cmds_per_grant", "acquire_p50_us", "acquire_p99_us"} {
		assert.Contains(t, got, k)
	}
	assert.Equal(t, "local", got["bucket"])
	assert.Contains(t, errOut.String(), "no Redis")
}

func TestConfigRefused(t *testing.T) {
	for _, c := range []loadConfig{
		{Bucket: "nope", Limit: 1, Interval: time.Second, Instances: 1, Workers: 1, Duration: time.Second},
		{Bucket: "local", Limit: 0, Interval: time.Second, Instances: 1, Workers: 1, Duration: time.Second},
		{Bucket: "local", Limit: 3, Interval: time.Second, Instances: 4, Workers: 1, Duration: time.Second},
		{Bucket: "tokenbucket", Limit: 3, Interval: time.Second, Instances: 1, Workers: 1, Duration: time.Second},
		{Bucket: "local", Limit: 3, Interval: 0, Instances: 1, Workers: 1, Duration: time.Second},
	} {
		_, err := runLoad(context.Background(), c)
		assert.Error(t, err, "%+v", c)
	}
}
