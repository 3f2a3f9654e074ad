package replay

// minHeap is a binary min-heap of plain values ordered by less, without
// container/heap's interface calls and boxing: the reorder window pushes
// and pops every line. Not safe for concurrent use.
type minHeap[T any] struct {
	items []T
	less  func(a, b *T) bool
}

func (h *minHeap[T]) len() int { return len(h.items) }

// min returns the least item; the heap must not be empty.
func (h *minHeap[T]) min() *T { return &h.items[0] }

func (h *minHeap[T]) push(x T) {
	h.items = append(h.items, x)
	i := len(h.items) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if !h.less(&h.items[i], &h.items[parent]) {
			break
		}
		h.items[i], h.items[parent] = h.items[parent], h.items[i]
		i = parent
	}
}

// pop removes and returns the least item; the heap must not be empty.
func (h *minHeap[T]) pop() T {
	top := h.items[0]
	last := len(h.items) - 1
	h.items[0] = h.items[last]
	var zero T
	h.items[last] = zero
	h.items = h.items[:last]
	for i := 0; ; {
		least, l, r := i, 2*i+1, 2*i+2
		if l < last && h.less(&h.items[l], &h.items[least]) {
			least = l
		}
		if r < last && h.less(&h.items[r], &h.items[least]) {
			least = r
		}
		if least == i {
			break
		}
		h.items[i], h.items[least] = h.items[least], h.items[i]
		i = least
	}
	return top
}
