package throttle

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestLocalSlotsInvalid(t *testing.T) {
	for _, c := range []int64{0, -1} {
		if _, err := NewLocalSlots(c); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewLocalSlots(%d) = %v, want ErrInvalid", c, err)
		}
	}
	s, _ := NewLocalSlots(1)
	if _, err := s.Hold(context.Background(), "", -time.Second); !errors.Is(err, ErrInvalid) {
		t.Errorf("Hold(maxWait -1s) = %v, want ErrInvalid", err)
	}
}

func TestLocalSlotsNeverMoreThanCapacityInFlight(t *testing.T) {
	const capacity, callers, rounds = 3, 12, 20
	s, _ := NewLocalSlots(capacity)
	var inside, most atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				release, err := s.Hold(context.Background(), "k", Forever)
				if err != nil {
					t.Error(err)
					return
				}
				n := inside.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(100 * time.Microsecond) // a call in flight
				inside.Add(-1)
				release()
				release() // idempotent
			}
		}()
	}
	wg.Wait()
	if m := most.Load(); m > capacity || m < 1 {
		t.Fatalf("most in flight = %d, want 1..%d", m, capacity)
	}
	if n := inFlight(s, "k"); n != 0 {
		t.Fatalf("InFlight after all released = %d, want 0", n)
	}
}

func TestLocalSlotsServeWaitersInArrivalOrder(t *testing.T) {
	s, _ := NewLocalSlots(1)
	ctx := context.Background()
	release, err := s.Hold(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 5
	order := make(chan int, waiters)
	var wg sync.WaitGroup
	for i := range waiters {
		queued := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			close(queued)
			rel, err := s.Hold(ctx, "", Forever)
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			rel()
		}()
		<-queued
		waitSlots(t, func() bool { return waitingOn(s, i+1) })
	}
	release()
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Fatalf("waiter %d served in place %d", got, want)
		}
		want++
	}
}

func waitingOn(s Slots, n int) bool {
	_, w := s.(*localSlots).state("")
	return w == n
}

func inFlight(s Slots, key string) int64 {
	h, _ := s.(*localSlots).state(key)
	return h
}

func TestLocalSlotsTimeoutAndCancelLeaveTheQueue(t *testing.T) {
	s, _ := NewLocalSlots(1)
	ctx := context.Background()
	release, _ := s.Hold(ctx, "", 0)

	if _, err := s.Hold(ctx, "", 0); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Hold(0) while full = %v, want ErrTimeout", err)
	}
	if _, err := s.Hold(ctx, "", 20*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Hold(20ms) while full = %v, want ErrTimeout", err)
	}
	dctx, dcancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer dcancel()
	if _, err := s.Hold(dctx, "", Forever); !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Hold past ctx deadline = %v, want ErrTimeout and DeadlineExceeded", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := s.Hold(cctx, "", Forever)
		done <- err
	}()
	waitSlots(t, func() bool { return waitingOn(s, 1) })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Hold = %v, want context.Canceled", err)
	}
	if _, w := s.(*localSlots).state(""); w != 0 {
		t.Fatalf("waiting after timeouts and cancel = %d, want 0", w)
	}
	release()
	if n := inFlight(s, ""); n != 0 {
		t.Fatalf("InFlight after release = %d, want 0", n)
	}
	// The slot is free again for a caller that does not wait.
	rel, err := s.Hold(ctx, "", 0)
	if err != nil {
		t.Fatalf("Hold(0) after release = %v", err)
	}
	rel()
}

func TestLocalSlotsKeysHaveTheirOwnCap(t *testing.T) {
	s, _ := NewLocalSlots(1)
	ctx := context.Background()
	a, err := s.Hold(ctx, "a", 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Hold(ctx, "b", 0)
	if err != nil {
		t.Fatalf("key b blocked by key a: %v", err)
	}
	a()
	b()
}

// waitUntil waits for cond, failing the test after 5 s.
func waitSlots(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}
