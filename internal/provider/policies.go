package provider

import (
	"time"
)

// Policies of real providers that answer 429 without saying when to come
// back, for the adaptive rate: a leaky bucket, and any policy
// with Config.NoHint; and a limit that changes during the run.

// Leaky enforces a leaky bucket (a smooth rate with a small burst, as
// GCRA): at most Burst + Limit·t/Interval requests in any span t. It
// extends the Policy constants in provider.go.
const Leaky Policy = Sliding + 1

// Phase sets the provider's limit from At (time since Start) on, until
// the next phase, for a limit that changes during a run.
type Phase struct {
	At    time.Duration
	Limit int64
}

// Tally is what a provider saw in one slice of time.
type Tally struct {
	Accepted, Refused int64
}

// limitAt is the limit in force at now: the last phase begun, or Limit.
func (p *Provider) limitAt(now time.Time) int64 {
	limit := p.cfg.Limit
	for _, ph := range p.cfg.Phases {
		if now.Sub(p.started) >= ph.At {
			limit = ph.Limit
		}
	}
	return limit
}

// admitLeaky is the Leaky policy: GCRA with emission Interval/limit and a
// tolerance of Burst-1 emissions.
func (p *Provider) admitLeaky(now time.Time, limit int64) (bool, time.Duration) {
	em := p.cfg.Interval / time.Duration(limit)
	burst := max(p.cfg.Burst, 1)
	tat := p.tat
	if tat.Before(now) {
		tat = now
	}
	if ahead := tat.Sub(now); ahead > time.Duration(burst-1)*em {
		p.rejected++
		return false, ahead - time.Duration(burst-1)*em
	}
	p.tat = tat.Add(em)
	p.arrivals = append(p.arrivals, now)
	return true, 0
}

// Tallies returns what the provider accepted and refused in each slice of
// length every since Start, by arrival time.
func (p *Provider) Tallies(every time.Duration) []Tally {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Tally
	at := func(t time.Time) *Tally {
		i := int(t.Sub(p.started) / every)
		for len(out) <= i {
			out = append(out, Tally{})
		}
		return &out[i]
	}
	for _, t := range p.arrivals {
		at(t).Accepted++
	}
	for _, t := range p.refusals {
		at(t).Refused++
	}
	return out
}
