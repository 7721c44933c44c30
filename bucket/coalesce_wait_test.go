package bucket

import (
	"context"
	"testing"
	"time"

	"github.com/headway-go/headway/internal/redisenv"
)

// TestCoalescedGCRAReservesWithinWaitLeft: a caller's maxWait counts from
// its Take; a coalesced GCRA call must reserve its slot within the wait
// the caller has left when the batch is sent, not within the whole
// maxWait again. The next free slot is 400 ms away; the caller below asks
// maxWait 300 ms and waits 150 ms in line (a call in flight before it):
// the slot, 250 ms after the batch, is 400 ms after its Take, beyond its
// maxWait, so it is not reserved for it (a Limiter would give up on it:
// the slot would be lost and the caller get ErrTimeout anyway).
func TestCoalescedGCRAReservesWithinWaitLeft(t *testing.T) {
	srv := redisenv.New(t)
	ctx := context.Background()
	b, err := NewGCRA(srv.Client(), "gcra-left", 10, 2*time.Second) // a slot every 200 ms, burst 10
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if d, err := b.Take(ctx, "", 1, 0); err != nil || !d.Granted || d.Delay != 0 {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	if d, err := b.Take(ctx, "", 1, time.Second); err != nil || !d.Granted || d.Delay <= 0 {
		t.Fatalf("reserve the slot 200 ms ahead: %+v, %v", d, err) // the next is 400 ms ahead
	}
	h := coalescingOf(t, b, "")
	const maxWait, inLine = 300 * time.Millisecond, 150 * time.Millisecond
	h.hold()
	start := time.Now()
	ch := h.queue(ctx, b, maxWait)
	time.Sleep(inLine) // the call in flight before it takes that long: time passing, not synchronisation
	sent := time.Now()
	h.release()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.d.Granted {
		if at := sent.Sub(start) + r.d.Delay; at > maxWait {
			t.Fatalf("slot reserved %v after the Take began (%v in line, Delay %v), beyond its maxWait %v", at, sent.Sub(start), r.d.Delay, maxWait)
		}
	} else if r.d.Delay <= 0 {
		t.Fatalf("refused without the next slot's time: %+v", r.d)
	}
	waitInflight(t, h.c)
}
