package loadgen

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// slot is one outstanding request in a connection's ring, guarded by the
// connection's mu.
type slot struct {
	seq    uint64
	at     int64 // ns since start: when it was sent, or meant to be with Rate
	target int32
	used   bool
}

// loadConn is one connection of a run: a writer goroutine and a reader
// goroutine share it, and nothing else may use it while they run. Fields
// without a guard belong to one of the two goroutines as their comments
// say, or are read-only.
type loadConn struct {
	run *loadRun
	id  int
	nc  net.Conn

	// tokens holds one value per outstanding request; the writer blocks on
	// it when Depth requests are outstanding.
	tokens   chan struct{}
	quit     chan struct{} // closed when the connection fails
	failOnce sync.Once

	mu          sync.Mutex
	ring        []slot // guarded by mu
	mask        uint64
	outstanding int  // guarded by mu
	writerDone  bool // guarded by mu

	// Writer-owned.
	nextSeq uint64
	line    []byte
	body    []byte // payload of an HTTP request, built before its header

	// Reader-owned; read by Run after both goroutines end.
	codes      []map[string]*int64
	answered   int64
	unmatched  int64
	malformed  int64
	lastAnswer int64
	latencies  []int64
	latencyOK  []bool // per latency: the answer was 0000 or Bnnn
	// due and answerCodes hold each latency's due time and code, with
	// Phases only.
	due         []int64
	answerCodes []string
	codeNames   map[string]string // the codes of answerCodes, each made once
	inOrderSeq  uint64            // with an in-order protocol, the last sequence number answered
	answerBody  []byte            // body of an HTTP answer
}

// fail marks the connection failed: the first error is counted, both
// goroutines are told to stop, and closing the socket unblocks them.
func (c *loadConn) fail(err error) {
	c.failOnce.Do(func() {
		c.run.noteError(fmt.Errorf("conn %d: %w", c.id, err))
		close(c.quit)
		_ = c.nc.Close()
	})
}

// writeLoop sends requests until the run stops, the request numbers run
// out or the connection fails. It flushes only before it would block, so
// with Depth > 1 the requests that are ready go out in one write.
//
// With Rate, request n is due at start + n/Rate whichever connection sends
// it, and its latency is measured from that due time rather than from the
// moment it was written. A hub that stalls (all Depth slots taken, or a
// socket that does not drain) therefore shows the stall in the latency of
// every request that should have gone out meanwhile, instead of the
// generator quietly waiting with it (coordinated omission). Falling behind
// the schedule makes the writer send the overdue requests at once.
//
// One delay is the generator's own and is left out: Go timers fire up to
// about a millisecond late, so a request that fell due while its writer was
// asleep on the timer is measured from the moment the writer woke. Without
// this, a sub-millisecond hub would look a millisecond slow at any rate.
func (c *loadConn) writeLoop() {
	r := c.run
	w := &writer{c: c, bw: bufio.NewWriterSize(c.nc, writeBufferSize)}
	defer c.finishWriting(w.bw)
	rng := rand.New(rand.NewPCG(r.cfg.Seed, uint64(c.id)))
	total := r.cfg.Mix.total()
	if r.interval > 0 {
		w.timer = time.NewTimer(time.Hour)
		w.timer.Stop()
		defer w.timer.Stop()
	}
	for !r.halted.Load() && w.acquire() {
		n := r.issued.Add(1) - 1
		if r.cfg.Requests > 0 && n >= r.cfg.Requests {
			<-c.tokens
			r.exhaust()
			return
		}
		at, ok := w.sendTime(n)
		if !ok {
			return
		}
		target := 0
		if len(r.targets) > 1 {
			target = r.cfg.Mix.pick(rng.IntN(total))
		}
		seq := c.register(at, target)
		b := c.appendRequest(c.line[:0], seq, target, n)
		c.line = b
		if _, err := w.bw.Write(b); err != nil {
			c.unregister(seq)
			c.fail(err)
			return
		}
		r.sent.Add(1)
		if n+1 == r.cfg.Requests {
			// The last request is out: writers waiting for a free slot have
			// nothing left to send.
			r.exhaust()
		}
	}
}

// appendRequest appends request n, sequence number seq on this connection,
// to b in the run's protocol.
func (c *loadConn) appendRequest(b []byte, seq uint64, target int, n uint64) []byte {
	r := c.run
	switch r.cfg.Protocol {
	case ProtocolRedisPing:
		return append(b, pingRequest...)
	case ProtocolHTTP:
		c.body = r.cfg.Payloads[target].AppendTo(c.body[:0], n+1, c.id)
		var txid [32]byte
		return appendHTTPRequest(b, r.cfg.Addr, appendLoadTxID(txid[:0], c.id, seq), c.body)
	}
	b = appendLoadTxID(b, c.id, seq)
	b = append(b, r.targets[target]...)
	b = r.cfg.Payloads[target].AppendTo(b, n+1, c.id)
	return append(b, '\n')
}

// writer is the state of one writeLoop, owned by its goroutine.
type writer struct {
	c     *loadConn
	bw    *bufio.Writer
	timer *time.Timer // with Rate only
	woke  int64       // ns since start of the last timer wake-up
}

// acquire takes a token for one more outstanding request. When none is
// free it flushes what is buffered, since nothing more will be written
// until an answer comes, then waits. It returns false when the writer
// should stop instead.
func (w *writer) acquire() bool {
	c, r := w.c, w.c.run
	select {
	case c.tokens <- struct{}{}:
		return true
	default:
	}
	if err := w.bw.Flush(); err != nil {
		c.fail(err)
		return false
	}
	select {
	case c.tokens <- struct{}{}:
		return true
	case <-r.stop:
	case <-r.exhausted:
	case <-c.quit:
	}
	return false
}

// sendTime returns the time request n counts as sent from, waiting for its
// due time with Rate. It returns false, with the token handed back, when
// the request must not be sent: sending is over or the connection failed.
func (w *writer) sendTime(n uint64) (int64, bool) {
	c, r := w.c, w.c.run
	if r.interval == 0 {
		at := r.now()
		if r.deadline > 0 && at >= r.deadline {
			<-c.tokens
			r.halt()
			return 0, false
		}
		return at, true
	}
	at := int64(float64(n) * r.interval)
	if r.deadline > 0 && at >= r.deadline {
		<-c.tokens
		r.halt()
		return 0, false
	}
	if wait := at - r.now(); wait > 0 {
		if err := w.bw.Flush(); err != nil {
			c.fail(err)
			return 0, false
		}
		w.timer.Reset(time.Duration(wait))
		select {
		case <-w.timer.C:
			w.woke = r.now()
		case <-r.cancelled:
			<-c.tokens
			return 0, false
		case <-c.quit:
			return 0, false
		}
	}
	// Requests that fell due while this writer overslept are measured from
	// its wake-up, not from their due time.
	return max(at, w.woke), true
}

// register puts a request sent at at into the ring and returns its
// sequence number. Since the TXIDs are ours to choose, a slot still held by
// an old request that is slow to answer is skipped rather than waited for:
// the caller holds a token, so fewer than Depth requests are outstanding
// and the ring, at least twice Depth, always has a free slot.
func (c *loadConn) register(at int64, target int) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	seq := c.nextSeq + 1
	for c.ring[seq&c.mask].used {
		seq++
	}
	c.ring[seq&c.mask] = slot{seq: seq, at: at, target: int32(target), used: true}
	c.outstanding++
	c.nextSeq = seq
	return seq
}

// unregister takes back a request that could not be written.
func (c *loadConn) unregister(seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ring[seq&c.mask].used = false
	c.outstanding--
}

// finishWriting flushes what is buffered and starts the drain: the reader
// gets Drain to collect the outstanding answers, or is woken at once when
// there are none.
func (c *loadConn) finishWriting(bw *bufio.Writer) {
	if err := bw.Flush(); err != nil {
		c.fail(err)
	}
	c.mu.Lock()
	c.writerDone = true
	empty := c.outstanding == 0
	c.mu.Unlock()
	deadline := time.Now().Add(c.run.cfg.Drain)
	if empty {
		deadline = time.Unix(1, 0) // in the past: wake the reader now
	}
	// An error here means the connection is already closed, which the
	// reader sees on its own.
	_ = c.nc.SetReadDeadline(deadline)
}
