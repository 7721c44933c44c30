package throttle_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/headway-go/headway/bucket"
	"github.com/headway-go/headway/internal/redisenv"
	"github.com/headway-go/headway/throttle"
)

// TestTenantsAreForgottenWhenTheOwnKeysLimitIsRaisedLive: the limit of a
// token bucket's own key ("") raised live above the constructor's is that
// key's alone; Fallback reports the constructor's, the limit of every key
// without a live one, so tenants at that limit hold nothing past their
// idle window. 500 tenants used once, the clock past the idle window,
// every shard swept: none is kept (the sweeper's own state aside).
func TestTenantsAreForgottenWhenTheOwnKeysLimitIsRaisedLive(t *testing.T) {
	ctx := context.Background()
	srv := redisenv.New(t)
	rdb := redis.NewClient(srv.ClientOptions())
	defer rdb.Close()
	tb, err := bucket.NewTokenBucket(rdb, "live-raise", 1000, time.Second)
	require.NoError(t, err)
	require.NoError(t, tb.SetLimit(ctx, "", 2000))
	clock := clockwork.NewFakeClock()
	lim := throttle.New(tb, throttle.WithClock(clock))
	defer lim.Close()
	require.NoError(t, lim.Acquire(ctx, time.Second)) // sees the raised limit of ""
	lmt, _, _ := fallbackOf(t, tb)
	require.EqualValues(t, 1000, lmt, "the limit of keys without a live one")
	for i := range 500 {
		require.NoError(t, lim.Key("tenant-"+strconv.Itoa(i)).Acquire(ctx, time.Second))
	}
	// A state is swept only once nothing holds it: the work a grant
	// leaves in the background (a tenant's adaptive refresh, a Redis
	// call) may still hold its state on a loaded machine. Sweep until
	// none is kept, within a bound; each pass moves the clock past the
	// idle window again, as a shard swept is swept again only an idle
	// window later.
	deadline := time.Now().Add(10 * time.Second)
	for {
		clock.Advance(time.Hour)
		for range 128 { // refused or not, each acquire sweeps
			_ = lim.Key("sweeper").Acquire(ctx, 0)
		}
		if throttle.KeyStatesKept(lim) <= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	assert.LessOrEqual(t, throttle.KeyStatesKept(lim), 1, "tenant states kept an hour after their only use")
}

// TestFailLocalPacesAnUnseenTenantAtTheDefaultLimit: during an outage,
// FailLocal paces a tenant key this instance has not seen (first asked in
// the outage, or forgotten) at the limit of keys without a live one, not
// at the live limit of the bucket's own key "". A token bucket of 10/s
// whose key "" was raised live to 20/s: Redis paused, one interval after
// the failure (FailLocal's wait for an unknown period), the 10/s tenant
// gets at most 10 (+1 at the window's edge) in the next second (20 when
// paced at the limit of "").
func TestFailLocalPacesAnUnseenTenantAtTheDefaultLimit(t *testing.T) {
	ctx := context.Background()
	srv := redisenv.New(t)
	redisenv.NeedReal(t, srv, "pauses the server")
	rdb := redis.NewClient(srv.ClientOptions())
	defer rdb.Close()
	tb, err := bucket.NewTokenBucket(rdb, "unseen-tenant", 10, time.Second)
	require.NoError(t, err)
	require.NoError(t, tb.SetLimit(ctx, "", 20))
	clock := clockwork.NewFakeClock()
	lim := throttle.New(tb, throttle.WithClock(clock), throttle.WithStoreTimeout(50*time.Millisecond))
	defer lim.Close()
	require.NoError(t, lim.Acquire(ctx, time.Second)) // sees the raised limit of ""
	require.NoError(t, srv.Pause())
	defer func() { require.NoError(t, srv.Resume()) }()
	k := lim.Key("tenant")
	_ = k.Acquire(ctx, 0) // begins the outage
	clock.Advance(time.Second + time.Millisecond)
	granted := 0
	for range 100 {
		if k.Acquire(ctx, 0) == nil {
			granted++
		}
		clock.Advance(10 * time.Millisecond)
	}
	assert.LessOrEqual(t, granted, 10+1, "local grants of a 10/s tenant in one second of the outage")
}

// fallbackOf returns what b reports to the failure policy: its limit, its
// interval and the live instances it last counted.
func fallbackOf(t *testing.T, b throttle.Bucket) (int64, time.Duration, int64) {
	t.Helper()
	f, ok := throttle.BucketAs[throttle.Fallbacker](b)
	require.True(t, ok, "the bucket reports its limit and live instances")
	return f.Fallback()
}

// A nil pointer passed as the Bucket (a constructor's error not checked)
// is refused as a nil Bucket is: every call says what is wrong and
// nothing panics.
func TestNewWithANilPointerBucketRefusesEveryCall(t *testing.T) {
	var tb *bucket.TokenBucket
	var local *throttle.Local
	for _, tt := range []struct {
		b    throttle.Bucket
		want string
	}{
		{tb, "(*bucket.TokenBucket)(nil)"},
		{local, "(*throttle.Local)(nil)"},
	} {
		t.Run(tt.want, func(t *testing.T) {
			ctx := context.Background()
			lim := throttle.New(tt.b)
			defer lim.Close()
			_, costErr := lim.AcquireCost(ctx, throttle.Cost{"tokens": 1}, 0)
			for name, err := range map[string]error{
				"Acquire":       lim.Acquire(ctx, 0),
				"AcquireN":      lim.AcquireN(ctx, 2, time.Second),
				"AcquireCost":   costErr,
				"Check":         lim.Check(ctx),
				"Key().Acquire": lim.Key("k").Acquire(ctx, throttle.Forever),
				"Report":        lim.Report(ctx, throttle.Answer{Refused: true}),
			} {
				require.ErrorIs(t, err, throttle.ErrInvalid, name)
				assert.Contains(t, err.Error(), tt.want, name)
			}
		})
	}
}
