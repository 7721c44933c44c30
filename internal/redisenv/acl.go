package redisenv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNoACL is returned by [Server.AddUser] on the in-process stand-in,
// which has no users.
var ErrNoACL = errors.New("redisenv: the in-process stand-in has no ACL users; a real redis-server is needed")

// User is a Redis ACL user as a managed service gives one: only the
// commands it lists, only the keys it lists, and no pub/sub channel
// unless it lists some (Redis 7's acl-pubsub-default is resetchannels).
type User struct {
	// Name and Password authenticate the user. Both required.
	Name, Password string
	// Commands are the only commands allowed, as ACL SETUSER names them
	// without the '+': "evalsha", "script|load". Everything else is
	// denied (-@all).
	Commands []string
	// Keys are the key patterns allowed ("headway:*"). Default: every
	// key ("*").
	Keys []string
	// Channels are the pub/sub channel patterns allowed. Default: none.
	Channels []string
}

// setUserArgs is the ACL SETUSER command that creates u from scratch.
func (u User) setUserArgs() ([]any, error) {
	if u.Name == "" || u.Password == "" {
		return nil, errors.New("redisenv: User needs a Name and a Password")
	}
	args := []any{"acl", "setuser", u.Name, "reset", "on", ">" + u.Password, "resetchannels", "resetkeys", "-@all"}
	keys := u.Keys
	if len(keys) == 0 {
		keys = []string{"*"}
	}
	for _, k := range keys {
		args = append(args, "~"+k)
	}
	for _, c := range u.Channels {
		args = append(args, "&"+c)
	}
	for _, c := range u.Commands {
		if c == "" || strings.ContainsAny(c, "+- ") {
			return nil, fmt.Errorf("redisenv: User %q: command %q: give a bare command name such as \"evalsha\" or \"script|load\"", u.Name, c)
		}
		args = append(args, "+"+c)
	}
	return args, nil
}

// AddUser creates u on the server, replacing any user of that name, as
// the default user. A [Server.Restart] forgets it (the server keeps no
// ACL file). It fails with [ErrNoACL] on the stand-in.
func (s *Server) AddUser(u User) error {
	if !s.Real() {
		return ErrNoACL
	}
	args, err := u.setUserArgs()
	if err != nil {
		return err
	}
	admin := redis.NewClient(s.ClientOptions())
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.startTimeout)
	defer cancel()
	if err := admin.Do(ctx, args...).Err(); err != nil {
		return fmt.Errorf("redisenv: ACL SETUSER %s: %w", u.Name, err)
	}
	return nil
}

// UserClient returns a new go-redis client for the server that
// authenticates as u (created with [Server.AddUser]). The caller may close
// it; [Server.Close] closes it in any case.
func (s *Server) UserClient(u User) *redis.Client {
	opt := s.ClientOptions()
	opt.Username, opt.Password = u.Name, u.Password
	return s.track(redis.NewClient(opt))
}

// NewUser creates u on s for the test with [Server.AddUser] and returns a
// client of u's. It skips the test on the stand-in (or fails it under
// [RequireEnv], see [NeedReal]) and fails it if the user cannot be made
// or its client cannot authenticate.
func NewUser(t testing.TB, s *Server, u User) *redis.Client {
	t.Helper()
	NeedReal(t, s, "a Redis ACL user")
	if err := s.AddUser(u); err != nil {
		t.Fatalf("%v", err)
	}
	c := s.UserClient(u)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// AUTH is allowed to every user, whatever its commands: a round trip
	// proves the password.
	if err := c.Do(ctx, "auth", u.Name, u.Password).Err(); err != nil {
		t.Fatalf("redisenv: user %s cannot authenticate: %v", u.Name, err)
	}
	return c
}
