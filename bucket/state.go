package bucket

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// State is a snapshot of one budget of a bucket, read from Redis in two
// round trips by the bucket's State method, for operators and tools such as
// cmd/headwayctl. Nothing in it is needed to take permits.
type State struct {
	// Limit is the limit configured now: the live limit stored with
	// SetLimit when Live, else Default.
	Limit int64
	// Live reports whether Limit was set with SetLimit.
	Live bool
	// Default is the limit the bucket was built with in this process.
	Default int64
	// Interval is the bucket's interval (rounded as the bucket rounds it).
	Interval time.Duration

	// Running reports whether a period or window has started and not ended:
	// TokenBucket, permits that still count; FixedWindow, a window with a
	// grant; GCRA, a bucket not full (some permits taken recently).
	Running bool
	// Current is the limit in force now: the running window's
	// (FixedWindow: the limit at its start, which a live change does not
	// alter), the live limit or the limit of the fleet's last take
	// (TokenBucket: known without the constructor's), or Limit (GCRA).
	// When nothing runs, the limit the next window will start with.
	Current int64
	// Used is the permits that count now: TokenBucket, those granted
	// within the last interval (and its margin) or placed ahead; the
	// running window's; for GCRA, the permits still counted against the
	// burst.
	Used int64
	// Remaining is the permits that could be had at once now, pause aside.
	Remaining int64
	// Reset is the time until the last permit that counts stops counting
	// (TokenBucket; 0 when none does), the current aligned window ends
	// (FixedWindow: windows run whether used or not), or the bucket is full
	// again (GCRA; 0 when full).
	Reset time.Duration
	// Paused is the time left of a pause set with Pause; 0 when none.
	Paused time.Duration
	// Instances is how many bucket instances (processes, or several
	// buckets in one) of the constructor's key took a permit, for any
	// budget, within the heartbeat window ([WithHeartbeat], default 10 s),
	// as their heartbeats say. 0 when none did.
	Instances int64
}

// String formats s on one line, for logs.
func (s State) String() string {
	src := "default"
	if s.Live {
		src = "live"
	}
	return fmt.Sprintf("limit=%d (%s, default %d) per %v; current=%d used=%d remaining=%d reset=%v paused=%v instances=%d",
		s.Limit, src, s.Default, s.Interval, s.Current, s.Used, s.Remaining, s.Reset, s.Paused, s.Instances)
}

// snapshot is what state.lua read: the server's time and, per key, its
// PTTL and value.
type snapshot struct {
	now   int64 // µs since the Unix epoch, server's clock
	pttl  []int64
	str   []string            // string values ("" otherwise)
	hash  []map[string]string // hash values (nil otherwise)
	list  [][]string          // list values, or a hash's flat field/value list
	found []bool
}

func (c *common) snapshot(ctx context.Context, keys []string) (snapshot, error) {
	raw, err := scriptState.Run(ctx, c.rdb, keys).Slice()
	if err != nil {
		return snapshot{}, backend("state", keys[0], err)
	}
	bad := backend("state", keys[0], errors.New("unexpected reply from state.lua"))
	if len(raw) != 2+2*len(keys) {
		return snapshot{}, bad
	}
	sec, ok1 := raw[0].(int64)
	usec, ok2 := raw[1].(int64)
	if !ok1 || !ok2 {
		return snapshot{}, bad
	}
	s := snapshot{now: sec*1_000_000 + usec}
	for i := range keys {
		p, ok := raw[2+2*i].(int64)
		if !ok {
			return snapshot{}, bad
		}
		s.pttl = append(s.pttl, p)
		s.found = append(s.found, p != -2)
		var str string
		var h map[string]string
		var l []string
		switch v := raw[3+2*i].(type) {
		case string:
			str = v
		case []any:
			for _, e := range v {
				es, _ := e.(string)
				l = append(l, es)
			}
			h = make(map[string]string, len(l)/2)
			for j := 0; j+1 < len(l); j += 2 {
				h[l[j]] = l[j+1]
			}
		}
		s.str = append(s.str, str)
		s.hash = append(s.hash, h)
		s.list = append(s.list, l)
	}
	return s, nil
}

// instances counts the bucket's live instances from their heartbeats, at
// the server time nowUs. The instance set lives under the constructor's
// key's tag, not a tenant's, so this is a round trip of its own.
func (c *common) instances(ctx context.Context, nowUs int64) (int64, error) {
	from := nowUs/1000 - c.calls.window.Milliseconds()
	n, err := c.rdb.ZCount(ctx, c.calls.liveKey, "("+strconv.FormatInt(from, 10), "+inf").Result()
	if err != nil {
		return 0, backend("state", c.calls.liveKey, err)
	}
	return n, nil
}

// int returns key i's string value as an integer, and whether it was one.
func (s snapshot) int(i int) (int64, bool) {
	if !s.found[i] {
		return 0, false
	}
	v, err := strconv.ParseInt(s.str[i], 10, 64)
	return v, err == nil
}

// state reads key's budget (its key of kind, that key's live limit, its
// pause) and the live instances, and fills the fields every bucket's State
// shares; def is the constructor's limit per interval.
func (c *common) state(ctx context.Context, key, kind string, def int64, interval time.Duration) (State, snapshot, error) {
	tag, err := c.ks.tag(c.name+".State", key)
	if err != nil {
		return State{}, snapshot{}, err
	}
	s, err := c.snapshot(ctx, []string{tag + kind, tag + kind + ":limit", tag + ":pause"})
	if err != nil {
		return State{}, snapshot{}, err
	}
	st := State{Limit: def, Default: def, Interval: interval, Paused: ms(max(s.pttl[2], 0))}
	if v, ok := s.int(1); ok && v > 0 {
		st.Limit, st.Live = v, true
	}
	st.Instances, err = c.instances(ctx, s.now)
	return st, s, err
}

// State reads key's budget ("" for the constructor's key), as [State]
// says for a TokenBucket. It takes two round trips (the budget's keys,
// then the instances) and changes nothing.
func (b *TokenBucket) State(ctx context.Context, key string) (State, error) {
	st, s, err := b.state(ctx, key, ":tb", b.limit, us(b.intervalUs))
	if err != nil {
		return State{}, err
	}
	st.Current = st.Limit
	var last int64
	for i, e := range s.list[0] {
		var end, n int64
		if i == 0 { // the header: its fifth field is the last take's limit
			f := strings.Fields(e)
			if len(f) < 5 {
				continue // a header of an older version: no limit
			}
			if v, err := strconv.ParseInt(f[4], 10, 64); err == nil && v > 0 && !st.Live {
				st.Current = v
			}
			continue
		}
		if _, err := fmt.Sscanf(e, "%d %d", &end, &n); err != nil || end+b.intervalUs <= s.now {
			continue // an entry that no longer counts
		}
		st.Used += n
		last = max(last, end)
	}
	st.Running = st.Used > 0
	st.Remaining = max(st.Current-st.Used, 0)
	if st.Running {
		st.Reset = us(last + b.intervalUs - s.now)
	}
	return st, nil
}

// State reads key's budget ("" for the constructor's key), as [State]
// says for a FixedWindow. It takes two round trips and changes nothing.
func (b *FixedWindow) State(ctx context.Context, key string) (State, error) {
	t := b.windows.tiers[0]
	st, s, err := b.windows.state(ctx, key, b.windows.kinds[0], t.Limit, us(ceilUs(t.Period)))
	if err != nil {
		return State{}, err
	}
	length := ceilUs(t.Period)
	ws := s.now - s.now%length
	st.Current, st.Remaining, st.Reset = st.Limit, st.Limit, us(ws+length-s.now)
	if h := s.hash[0]; h != nil && h["w"] == strconv.FormatInt(ws, 10) {
		st.Running = true
		st.Used, _ = strconv.ParseInt(h["c"], 10, 64)
		st.Current = b.windows.tiers[0].Limit // a window started before live limits existed
		if l, err := strconv.ParseInt(h["l"], 10, 64); err == nil && l > 0 {
			st.Current = l
		}
		st.Remaining = max(st.Current-st.Used, 0)
	}
	return st, nil
}

// State reads key's budget ("" for the constructor's key), as [State]
// says for a GCRA. It takes two round trips and changes nothing.
func (b *GCRA) State(ctx context.Context, key string) (State, error) {
	st, s, err := b.state(ctx, key, ":gcra", b.limit, us(b.ivUs))
	if err != nil {
		return State{}, err
	}
	st.Current = st.Limit
	em, tol := b.emission, b.tolerance
	if st.Live {
		em = (b.ivUs + st.Limit - 1) / st.Limit
		burst := b.fixed
		if burst == 0 {
			burst = st.Limit
		}
		tol = burst * em
	}
	tat, _ := s.int(0)
	tat = max(tat, s.now)
	st.Remaining = max((s.now+tol-tat)/em, 0)
	st.Used = (tat - s.now + em - 1) / em
	if tat > s.now {
		st.Running = true
		st.Reset = us(tat - s.now)
	}
	return st, nil
}
