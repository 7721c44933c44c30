package consumer

import "github.com/headway-go/headway/throttle"

// The containers partitions and the fair scheduler keep records,
// tenants and counts in.

// fifo is a queue: a partition's ready records, the sched's partitions and
// jobs, the fair scheduler's candidates. It also removes from its middle (a
// record in work that gave up its wait, a record of another budget), and gives
// back the room a burst took once it has drained.
type fifo[T comparable] struct {
	buf  []T
	head int
}

func (q *fifo[T]) len() int   { return len(q.buf) - q.head }
func (q *fifo[T]) at(i int) T { return q.buf[q.head+i] }
func (q *fifo[T]) push(v T)   { q.buf = append(q.buf, v) }
func (q *fifo[T]) pop() T     { return q.remove(0) }
func (q *fifo[T]) reset()     { *q = fifo[T]{} }

// index returns the place of the first element of, -1 if none.
func (q *fifo[T]) index(of func(T) bool) int {
	for i := q.head; i < len(q.buf); i++ {
		if of(q.buf[i]) {
			return i - q.head
		}
	}
	return -1
}

// remove removes and returns the i-th element.
func (q *fifo[T]) remove(i int) T {
	v := q.buf[q.head+i]
	if i == 0 {
		clear(q.buf[q.head : q.head+1])
		q.head++
	} else {
		copy(q.buf[q.head+i:], q.buf[q.head+i+1:])
		clear(q.buf[len(q.buf)-1:])
		q.buf = q.buf[:len(q.buf)-1]
	}
	if q.head == len(q.buf) {
		q.buf, q.head = q.buf[:0], 0
		if cap(q.buf) >= minShrink {
			q.buf = nil // a burst does not hold its room
		}
	} else if q.head >= 1024 && q.head*2 >= len(q.buf) {
		n := copy(q.buf, q.buf[q.head:])
		clear(q.buf[n:])
		q.buf, q.head = q.buf[:n], 0
	}
	return v
}

// filter removes and returns the elements of, keeping the others' order.
func (q *fifo[T]) filter(of func(T) bool) []T {
	var out []T
	kept := q.buf[:0]
	for _, v := range q.buf[q.head:] {
		if of(v) {
			out = append(out, v)
		} else {
			kept = append(kept, v)
		}
	}
	clear(q.buf[len(kept):])
	q.buf, q.head = kept, 0
	return out
}

// tenantHeap is a min-heap of active tenants by start tag.
type tenantHeap []*tenant

func (h tenantHeap) Len() int           { return len(h) }
func (h tenantHeap) Less(i, j int) bool { return h[i].before(h[j]) }
func (h tenantHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *tenantHeap) Push(x any) {
	t := x.(*tenant)
	t.idx = len(*h)
	*h = append(*h, t)
}
func (h *tenantHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.idx = -1
	return t
}

// budgetCounts counts candidates or requests per budget; a budget at 0
// has no entry, so its length is how many budgets have some.
type budgetCounts map[throttle.Keyed]int

func (m budgetCounts) add(k throttle.Keyed, n int) {
	if n += m[k]; n > 0 {
		m[k] = n
	} else {
		delete(m, k)
	}
}
