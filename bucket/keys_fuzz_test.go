package bucket

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/headway-go/headway/throttle"
)

// crc16 is Redis Cluster's CRC16 (XMODEM: polynomial 0x1021, initial 0).
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// keySlot is CLUSTER KEYSLOT computed in Go, as Redis does: the CRC16 of
// the hash tag (between the first '{' and the first '}' after it, if that
// is not empty), or of the whole key, modulo 16384.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % 16384)
}

// The values given by the Redis Cluster specification and CLUSTER KEYSLOT's
// documentation, so that the fuzz target below checks against the real
// function.
func TestKeySlotMatchesRedis(t *testing.T) {
	for key, want := range map[string]int{
		"somekey":         11058,
		"foo{hash_tag}":   2515,
		"{hash_tag}bar":   2515,
		"123456789":       12739, // CRC16/XMODEM check value 0x31C3
		"{}empty-tag":     keySlotWhole("{}empty-tag"),
		"a{}{b}":          keySlotWhole("a{}{b}"),
		"x{tag}y{other}z": keySlotWhole("tag"),
	} {
		if got := keySlot(key); got != want {
			t.Errorf("keySlot(%q) = %d, want %d", key, got, want)
		}
	}
}

func keySlotWhole(s string) int { return int(crc16(s) % 16384) }

// kinds are the suffixes the buckets append to a budget's tag.
var kinds = []string{":tb", ":tb:limit", ":pause", ":win:1000000", ":gcra", ":log"}

// FuzzKeys checks the key layout for any prefix, bucket key and per-call
// keys: constructors accept exactly the valid prefix and key and refuse the
// rest with ErrInvalid; every Redis key has exactly one hash tag, non-empty,
// so all keys of one budget are in the slot of that tag (CRC16 computed
// here); distinct per-call keys never share a tag; a key over MaxKeyLen is
// refused; an escaped key is at most three times as long as the original.
func FuzzKeys(f *testing.F) {
	for _, s := range [][4]string{
		{"headway", "mparticle", "", "tenant-1"},
		{"p", "base{", "{", "}"},
		{"p", "a/b", "a/b", "a%2Fb"},
		{"p", "%7B", "%7B", "{"},
		{"", "x", "x", "y"},
		{"p{", "x", "x", "y"},
		{"p}", "x", "", ""},
		{strings.Repeat("p", 65), "x", "", ""},
		{"p", "", "", ""},
		{"p", strings.Repeat("b", MaxKeyLen), strings.Repeat("k", MaxKeyLen), strings.Repeat("k", MaxKeyLen+1)},
		{"p", strings.Repeat("{", MaxKeyLen+1), "}{", "{}"},
		{"p:{x", "x", "", ""},
		{"p", "\x00\xff", "é", "{é}"},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialed
	f.Cleanup(func() { _ = rdb.Close() })
	f.Fuzz(func(t *testing.T, prefix, base, key1, key2 string) {
		valid := prefix != "" && len(prefix) <= maxPrefixLen && !strings.ContainsAny(prefix, "{}") &&
			base != "" && len(base) <= MaxKeyLen
		_, err := NewTokenBucket(rdb, base, 10, time.Second, WithPrefix(prefix))
		switch {
		case valid && err != nil:
			t.Fatalf("NewTokenBucket(prefix %q, key %q) refused: %v", prefix, base, err)
		case !valid && err == nil:
			t.Fatalf("NewTokenBucket(prefix %q, key %q) accepted", prefix, base)
		case !valid:
			if !errors.Is(err, throttle.ErrInvalid) {
				t.Fatalf("NewTokenBucket refused with %v, not ErrInvalid", err)
			}
			return
		}
		ks := newKeyspace(prefix, base)
		tags := map[string]string{}
		for _, key := range []string{key1, key2, ""} {
			tag, err := ks.tag("fuzz", key)
			if len(key) > MaxKeyLen {
				if !errors.Is(err, throttle.ErrInvalid) {
					t.Fatalf("key of %d bytes: %v, want ErrInvalid", len(key), err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("key %q refused: %v", key, err)
			}
			if bound := len(prefix) + 2 + 3*len(base) + 1 + 3*len(key) + 1; len(tag) > bound {
				t.Fatalf("tag %q is %d bytes, more than %d", tag, len(tag), bound)
			}
			if prev, ok := tags[tag]; ok && prev != key {
				t.Fatalf("keys %q and %q share the tag %q", prev, key, tag)
			}
			tags[tag] = key
			open, end := strings.IndexByte(tag, '{'), strings.IndexByte(tag, '}')
			inner := tag[open+1 : max(end, open+1)]
			slot := int(crc16(inner) % 16384)
			for _, kind := range kinds {
				full := tag + kind
				if strings.Count(full, "{") != 1 || strings.Count(full, "}") != 1 || end < open || inner == "" {
					t.Fatalf("key %q: Redis key %q has not exactly one non-empty hash tag", key, full)
				}
				if got := keySlot(full); got != slot {
					t.Fatalf("key %q: %q is in slot %d, its tag %q in %d", key, full, got, inner, slot)
				}
			}
		}
	})
}

// FuzzBucketLimits checks every Redis bucket's constructor on any limit,
// interval and option value: none panics, each accepts exactly a limit of
// at least 1 and a positive interval (with valid options) and refuses bad
// values with an error matching ErrInvalid.
func FuzzBucketLimits(f *testing.F) {
	for _, s := range [][6]int64{
		{10, int64(time.Second), 0, 0, 0, 0},
		{0, int64(time.Second), 0, 0, 0, 0},
		{1, 0, 0, 0, 0, 0},
		{-1, -1, -1, -1, -1, -1},
		{1, 1, 1, int64(10 * time.Millisecond), int64(100 * time.Microsecond), 1},
		{math.MaxInt64, math.MaxInt64, math.MaxInt64, math.MaxInt64, math.MaxInt64, math.MaxInt64},
		{math.MinInt64, math.MinInt64, math.MinInt64, math.MinInt64, math.MinInt64, math.MinInt64},
		{1 << 62, int64(time.Microsecond), 1 << 62, int64(time.Second), int64(time.Second), int64(time.Nanosecond)},
		{5, int64(time.Hour), 3, int64(time.Hour), int64(2 * time.Second), int64(24 * time.Hour)},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5])
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialed
	f.Cleanup(func() { _ = rdb.Close() })
	f.Fuzz(func(t *testing.T, limit, interval, burst, lease, retry, period2 int64) {
		iv := time.Duration(interval)
		var tbOpts []TokenBucketOption
		var gcraOpts []GCRAOption
		var ctrOpts []CounterOption
		if burst != 0 {
			gcraOpts = append(gcraOpts, WithBurst(burst))
		}
		if lease != 0 {
			ctrOpts = append(ctrOpts, WithLeaderLease(time.Duration(lease)))
		}
		if retry != 0 {
			tbOpts = append(tbOpts, WithArrivalMargin(time.Duration(retry)))
			ctrOpts = append(ctrOpts, WithRetry(time.Duration(retry)))
		}
		tiers := []throttle.Tier{{Limit: limit, Period: iv}, {Limit: limit, Period: time.Duration(period2)}}
		for name, build := range map[string]func() (any, error){
			"NewTokenBucket": func() (any, error) { return NewTokenBucket(rdb, "k", limit, iv, tbOpts...) },
			"NewFixedWindow": func() (any, error) { return NewFixedWindow(rdb, "k", limit, iv) },
			"NewGCRA":        func() (any, error) { return NewGCRA(rdb, "k", limit, iv, gcraOpts...) },
			"NewCounter":     func() (any, error) { return NewCounter(rdb, "k", limit, iv, ctrOpts...) },
			"NewSlidingLog":  func() (any, error) { return NewSlidingLog(rdb, "k", tiers[:1]) },
			"NewTiers":       func() (any, error) { return NewTiers(rdb, "k", tiers) },
		} {
			b, err := build()
			if err != nil {
				if !errors.Is(err, throttle.ErrInvalid) {
					t.Fatalf("%s(%d, %v): %v, not ErrInvalid", name, limit, iv, err)
				}
				continue
			}
			if b == nil {
				t.Fatalf("%s: nil bucket and nil error", name)
			}
			if limit < 1 || interval <= 0 {
				t.Fatalf("%s(%d, %v) accepted", name, limit, iv)
			}
			if name == "NewTiers" && period2 <= 0 {
				t.Fatalf("NewTiers accepted a tier of period %v", time.Duration(period2))
			}
		}
	})
}
