package redisenv

import (
	"fmt"
	"os"
	"time"
)

// RequireEnv names the environment variable that, when set to "1", forbids
// the miniredis stand-in: [Start] and [New] then fail when no redis-server
// binary is installed, and [NewCluster] fails instead of skipping. CI sets it.
const RequireEnv = "HEADWAY_REQUIRE_REDIS"

// StandInEnv names the environment variable that, when set to "1", makes
// [Start] use the in-process stand-in even when redis-server is installed,
// and makes [StartCluster] fail as if no binary were installed (so
// [NewCluster] skips): the machine looks like a fresh one with only Go.
// CI sets it to prove that path. Setting it together with [RequireEnv] is a
// contradiction that Start and StartCluster report as an error.
const StandInEnv = "HEADWAY_REDIS_STANDIN"

// Option configures [Start], [StartCluster], [New] and [NewCluster].
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	requireReal  bool
	standIn      bool // StandInEnv=1: behave as if no binary were installed
	startTimeout time.Duration
	args         []string
}

func newConfig(opts []Option) (config, error) {
	c := config{
		requireReal:  os.Getenv(RequireEnv) == "1",
		standIn:      os.Getenv(StandInEnv) == "1",
		startTimeout: 10 * time.Second,
	}
	for _, o := range opts {
		if err := o.apply(&c); err != nil {
			return config{}, err
		}
	}
	return c, nil
}

// errContradiction reports StandInEnv together with RequireEnv or
// RequireReal.
var errContradiction = fmt.Errorf("redisenv: %s=1 forces the stand-in but a real redis-server is required (%s=1 or RequireReal): unset one of them", StandInEnv, RequireEnv)

// check reports settings that contradict each other.
func (c config) check() error {
	if c.standIn && c.requireReal {
		return errContradiction
	}
	return nil
}

// RequireReal makes [Start] and [New] fail rather than fall back to the
// stand-in when no redis-server binary is installed, as if [RequireEnv] were
// set. By default the fallback is allowed unless [RequireEnv] is "1".
func RequireReal() Option {
	return optionFunc(func(c *config) error {
		c.requireReal = true
		return nil
	})
}

// StartTimeout bounds each wait for a server to answer after it is
// started or restarted, and the wait for a cluster to agree on its slots.
// The default is 10 seconds; d must be positive.
func StartTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("redisenv: StartTimeout: must be positive, got %v", d)
		}
		c.startTimeout = d
		return nil
	})
}

// Args appends command-line arguments to every redis-server the option
// starts, after the package's own (so they override them), for example
// Args("--maxmemory", "10mb"). The stand-in ignores them. The default is
// none.
func Args(args ...string) Option {
	return optionFunc(func(c *config) error {
		c.args = append(c.args, args...)
		return nil
	})
}
