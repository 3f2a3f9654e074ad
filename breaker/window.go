package breaker

import "time"

// windowBuckets is how many slices of time the failure-rate window keeps.
// Ten keeps the memory fixed and small while the window still slides in
// steps of a tenth of its length.
const windowBuckets = 10

// bucket holds the results that ended in one slice of time.
type bucket struct {
	index         int64 // the slice of time, counted in widths from window.base
	total, failed int
}

// window counts recent results for the failure-rate policy in a fixed ring
// of buckets, each Window/10 wide. A result is counted while its bucket is
// one of the ten latest, so the window always covers more than 9/10 of
// Window and never a result older than Window. It is not safe for
// concurrent use: the Breaker guards it with its mu.
type window struct {
	width   time.Duration
	base    time.Time // the time of the first result; bucket indexes count from it
	started bool
	buckets [windowBuckets]bucket
}

func newWindow(length time.Duration) window {
	return window{width: max(length/windowBuckets, 1)}
}

// indexAt returns the slice of time that now falls in. It rounds towards
// minus infinity so a clock set back before base still gets its own slice.
func (w *window) indexAt(now time.Time) int64 {
	d := now.Sub(w.base)
	i := int64(d / w.width)
	if d < 0 && d%w.width != 0 {
		i--
	}
	return i
}

// record adds one result that ended at now and returns the counts of the
// window as of now.
func (w *window) record(now time.Time, failed bool) (total, failures int) {
	if !w.started {
		// Counting from the first result rather than from the Unix epoch
		// keeps the clock's monotonic reading in play, so a step of the wall
		// clock does not shuffle the buckets.
		w.base, w.started = now, true
	}
	i := w.indexAt(now)
	b := &w.buckets[((i%windowBuckets)+windowBuckets)%windowBuckets]
	if b.index != i {
		*b = bucket{index: i}
	}
	b.total++
	if failed {
		b.failed++
	}
	return w.sum(i)
}

// counts returns the counts of the window as of now.
func (w *window) counts(now time.Time) (total, failures int) {
	if !w.started {
		return 0, 0
	}
	return w.sum(w.indexAt(now))
}

// sum adds up the buckets of the ten slices up to and including i. Buckets
// from later slices (the clock went back) are left out as well.
func (w *window) sum(i int64) (total, failures int) {
	for _, b := range w.buckets {
		if b.index > i-windowBuckets && b.index <= i {
			total += b.total
			failures += b.failed
		}
	}
	return total, failures
}

// clear forgets every result.
func (w *window) clear() {
	w.buckets = [windowBuckets]bucket{}
}
