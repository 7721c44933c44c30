package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPipelineLosesNothingAndStaysUnderTheLimit(t *testing.T) {
	var out bytes.Buffer
	c := config{records: 400, limit: 80, interval: 200 * time.Millisecond, instances: 2, partitions: 4, timeout: time.Minute, topic: "pipeline-test"}
	s, err := run(context.Background(), c, &out, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err, out.String())
	assert.Equal(t, int64(400), s.Produced)
	assert.Equal(t, int64(400), s.Handled)
	assert.Zero(t, s.Lost)
	assert.Zero(t, s.Provider429)
	assert.LessOrEqual(t, s.MaxInWindow, int64(80))
	assert.Contains(t, out.String(), "produced 400, handled 400, lost 0")
}

func TestPipelineRefusesBadFlags(t *testing.T) {
	good := config{records: 1, limit: 1, interval: time.Second, instances: 1, partitions: 1, timeout: time.Second}
	tests := []struct {
		name string
		mod  func(*config)
		want string
	}{
		{"records", func(c *config) { c.records = 0 }, "-records 0"},
		{"limit", func(c *config) { c.limit = -1 }, "-limit -1"},
		{"interval", func(c *config) { c.interval = time.Microsecond }, "-interval 1µs"},
		{"instances", func(c *config) { c.instances = 0 }, "-instances 0"},
		{"partitions", func(c *config) { c.partitions = 5000 }, "-partitions 5000"},
		{"timeout", func(c *config) { c.timeout = 0 }, "-timeout 0s"},
		{"target", func(c *config) { c.target = "ftp://x" }, `-target "ftp://x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.mod(&c)
			_, err := run(context.Background(), c, io.Discard, slog.Default())
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}
