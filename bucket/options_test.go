package bucket_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/throttle"
)

// TestOptionNotReadIsRefused gives every option to every constructor: a
// constructor that reads the option accepts it; one that does not refuses
// it with an error matching throttle.ErrInvalid that names the option and
// the constructor, rather than ignoring it.
func TestOptionNotReadIsRefused(t *testing.T) {
	// No constructor dials: an unreachable address is enough.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	counter, err := bucket.NewCounter(rdb, "opts", 10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctors := map[string]func(bucket.Option) error{
		"NewTokenBucket": func(o bucket.Option) error {
			_, err := bucket.NewTokenBucket(rdb, "opts", 10, time.Second, o)
			return err
		},
		"NewGCRA": func(o bucket.Option) error {
			_, err := bucket.NewGCRA(rdb, "opts", 10, time.Second, o)
			return err
		},
		"NewFixedWindow": func(o bucket.Option) error {
			_, err := bucket.NewFixedWindow(rdb, "opts", 10, time.Second, o)
			return err
		},
		"NewTiers": func(o bucket.Option) error {
			_, err := bucket.NewTiers(rdb, "opts", []throttle.Tier{{Limit: 10, Period: time.Second}}, o)
			return err
		},
		"NewSlidingLog": func(o bucket.Option) error {
			_, err := bucket.NewSlidingLog(rdb, "opts", []throttle.Tier{{Limit: 10, Period: time.Second}}, o)
			return err
		},
		"NewCounter": func(o bucket.Option) error {
			_, err := bucket.NewCounter(rdb, "opts", 10, time.Second, o)
			return err
		},
		"NewBudget": func(o bucket.Option) error {
			_, err := bucket.NewBudget(rdb, "opts", []bucket.Dimension{{Name: "requests", Limit: 10, Interval: time.Second}}, o)
			return err
		},
		"NewConcurrency": func(o bucket.Option) error {
			c, err := bucket.NewConcurrency(rdb, "opts", 2, o)
			if err == nil {
				c.Close()
			}
			return err
		},
		"Counter.NewResetter": func(o bucket.Option) error {
			_, err := counter.NewResetter("", o)
			return err
		},
	}
	buckets := []string{"NewTokenBucket", "NewGCRA", "NewFixedWindow", "NewTiers", "NewSlidingLog", "NewCounter", "NewBudget"}
	options := []struct {
		name  string
		opt   bucket.Option
		reads []string
	}{
		{"WithPrefix", bucket.WithPrefix("p"), append(buckets[:len(buckets):len(buckets)], "NewConcurrency")},
		{"WithHeartbeat", bucket.WithHeartbeat(time.Second), buckets},
		{"WithRetry", bucket.WithRetry(time.Millisecond), []string{"NewTokenBucket", "NewCounter"}},
		{"WithBurst", bucket.WithBurst(2), []string{"NewGCRA"}},
		{"WithArrivalMargin", bucket.WithArrivalMargin(time.Millisecond), []string{"NewSlidingLog"}},
		{"WithLeaderLease", bucket.WithLeaderLease(time.Second), []string{"NewCounter", "Counter.NewResetter"}},
		{"WithLogger", bucket.WithLogger(slog.Default()), []string{"NewCounter", "Counter.NewResetter", "NewConcurrency"}},
		{"WithLease", bucket.WithLease(time.Second), []string{"NewConcurrency"}},
	}
	for _, o := range options {
		for ctor, build := range ctors {
			reads := false
			for _, r := range o.reads {
				reads = reads || r == ctor
			}
			err := build(o.opt)
			switch {
			case reads && err != nil:
				t.Errorf("%s(%s): %v, want accepted", ctor, o.name, err)
			case !reads && err == nil:
				t.Errorf("%s(%s) accepted an option it does not read", ctor, o.name)
			case !reads && !errors.Is(err, throttle.ErrInvalid):
				t.Errorf("%s(%s): %v, want an error matching throttle.ErrInvalid", ctor, o.name, err)
			case !reads && (!strings.Contains(err.Error(), o.name) || !strings.Contains(err.Error(), ctor)):
				t.Errorf("%s(%s): %q does not name the option and the constructor", ctor, o.name, err)
			}
		}
	}
	if err := ctors["NewTokenBucket"](nil); err != nil {
		t.Errorf("a nil option: %v, want ignored", err)
	}
}
