package bucket

import (
	"sync"
	"time"
)

// maxGenerations bounds the keys a Concurrency remembers the generation
// of. Beyond it, it forgets some: those keys fall back to what an
// instance that never used them can tell (nothing) until their next
// reply.
const maxGenerations = 1 << 14

// generationTTL is how long a cap's generation outlives the last script
// that touched its keys, as slots_common.lua sets it: max(1 h, 4 leases).
func generationTTL(lease time.Duration) time.Duration {
	return max(time.Hour, 4*lease)
}

// generations remembers, per key of a Concurrency (its first Redis key),
// the cap's generation that the last reply carried and when its script
// was sent, on the instance's clock. The scripts compare it with theirs
// to tell that Redis lost the cap (see slots_common.lua's generation()).
// A key is forgotten once idle for longer than the generation can
// outlive its last script, less a tenth: by then Redis may have let the
// generation expire, and a new one would look like a loss.
type generations struct {
	keep time.Duration // how long a generation is remembered

	mu    sync.Mutex
	byKey map[string]generationSeen
	swept time.Time // the last sweep of the forgotten keys
}

type generationSeen struct {
	gen  string
	sent time.Time // when the script whose reply carried gen was sent
}

func newGenerations(lease time.Duration) *generations {
	ttl := generationTTL(lease)
	return &generations{keep: ttl - ttl/10, byKey: make(map[string]generationSeen)}
}

// told returns the generation to pass in a script of key sent at now, ""
// if none is remembered.
func (g *generations) told(key string, now time.Time) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	seen, ok := g.byKey[key]
	if !ok || now.Sub(seen.sent) >= g.keep {
		return ""
	}
	return seen.gen
}

// heard remembers gen, carried by the reply of a script of key sent at
// sent, unless a later script's reply came first.
func (g *generations) heard(key, gen string, sent time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if seen, ok := g.byKey[key]; ok && seen.sent.After(sent) {
		return
	}
	g.byKey[key] = generationSeen{gen: gen, sent: sent}
	if len(g.byKey) >= maxGenerations || sent.Sub(g.swept) >= time.Minute {
		g.sweep(sent)
	}
}

// sweep forgets the keys idle for longer than keep; if that leaves the
// map full, it forgets a quarter of the rest, whichever. Under g.mu.
func (g *generations) sweep(now time.Time) {
	g.swept = now
	for k, seen := range g.byKey {
		if now.Sub(seen.sent) >= g.keep {
			delete(g.byKey, k)
		}
	}
	if len(g.byKey) < maxGenerations {
		return
	}
	drop := len(g.byKey) / 4
	for k := range g.byKey {
		if drop == 0 {
			break
		}
		delete(g.byKey, k)
		drop--
	}
}
