package relay

import (
	"sync"
	"time"

	"github.com/relayhub/relayhub/relay/protocol"
)

// answerSink is where an admitter sends its answers: one response line at
// a time, each written whole. flush sends the line (and whatever waits
// before it) to the client now; without flush it may wait for the read
// loop's flush. It is safe for concurrent use: the read loop and every
// call of a connection answer through it. A message comes in a string or
// in bytes, so that neither is converted (and copied) on the way; an E904
// comes as its retry hint, which the sink writes into its buffer itself (a
// message built by the caller would leave the caller's stack through the
// interface, an allocation per refusal); a refusal with a fixed message
// comes as a tail made once (protocol.Tail).
type answerSink interface {
	answer(txid []byte, code string, msg []byte, flush bool)
	answerText(txid []byte, code, msg string, flush bool)
	// answerRetry answers E904 "circuit open; retry after Ns", N being
	// seconds. txid must be one protocol.ParseRequest accepted.
	answerRetry(txid []byte, seconds int64, flush bool)
	// answerTail answers with a tail made once (protocol.NewTail). txid
	// must be one protocol.ParseRequest accepted.
	answerTail(txid []byte, tail protocol.Tail, flush bool)
}

// answerWriter is a connection's write side: its answers not yet written,
// the write deadline and why answers can no longer be written. It is the
// connection's answerSink.
type answerWriter struct {
	c *conn // the connection whose socket it writes to

	mu            sync.Mutex
	buf           *[]byte   // guarded by mu: answers not yet written; nil when there are none
	err           error     // guarded by mu: why answers can no longer be written
	writeDeadline time.Time // guarded by mu: the write deadline last set
}

var _ answerSink = (*answerWriter)(nil)

// answer buffers one response line. Once a write has failed, answers are
// dropped: the client is gone or did not read within WriteTimeout.
func (w *answerWriter) answer(txid []byte, code string, msg []byte, flush bool) {
	appendAnswer(w, txid, code, msg, flush)
}

// answerText is answer for a message in a string.
func (w *answerWriter) answerText(txid []byte, code, msg string, flush bool) {
	appendAnswer(w, txid, code, msg, flush)
}

// answerRetry buffers an E904 with its retry hint, copied rather than
// formatted (protocol.AppendRetryAnswer).
func (w *answerWriter) answerRetry(txid []byte, seconds int64, flush bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if buf := w.roomLocked(); buf != nil {
		*buf = protocol.AppendRetryAnswer(*buf, txid, seconds)
		w.doneLocked(flush)
	}
}

// answerTail buffers txid followed by tail.
func (w *answerWriter) answerTail(txid []byte, tail protocol.Tail, flush bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if buf := w.roomLocked(); buf != nil {
		*buf = tail.AppendAnswer(*buf, txid)
		w.doneLocked(flush)
	}
}

// appendAnswer is answer and answerText, written once for both kinds of
// message.
func appendAnswer[M ~string | ~[]byte](w *answerWriter, txid []byte, code string, msg M, flush bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if buf := w.roomLocked(); buf != nil {
		*buf = protocol.AppendResponse(*buf, txid, code, msg)
		w.doneLocked(flush)
	}
}

// roomLocked returns the buffer with room for one more answer, writing
// out what it holds when it is nearly full, or nil when answers can no
// longer be written.
func (w *answerWriter) roomLocked() *[]byte {
	if w.err != nil {
		return nil
	}
	if w.buf != nil && len(*w.buf) > cap(*w.buf)-maxAnswerLen {
		if !w.writeLocked(time.Now()) {
			return nil
		}
	}
	if w.buf == nil {
		w.buf = writeBufs.Get().(*[]byte)
	}
	return w.buf
}

// doneLocked writes the answer just buffered at once when flush says so.
func (w *answerWriter) doneLocked(flush bool) {
	if flush {
		w.writeLocked(time.Now())
	}
}

// flush sends the buffered answers to the client; now is the time just
// read.
func (w *answerWriter) flush(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil && w.buf != nil {
		w.writeLocked(now)
	}
}

// failed returns why answers can no longer be written, or nil.
func (w *answerWriter) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// close writes what is left and marks the writer done (errConnDone). It
// reports whether every answer was written.
func (w *answerWriter) close(now time.Time) (healthy bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil && w.buf != nil {
		w.err = w.writeOutLocked(now)
	}
	healthy = w.err == nil
	if healthy {
		w.err = errConnDone
	}
	return healthy
}

// writeLocked writes the buffered answers and reports whether it could.
// A failed write disconnects the client: it is gone, or did not read
// within WriteTimeout. Calls in flight go on and are recorded by their
// breakers; their answers are dropped.
func (w *answerWriter) writeLocked(now time.Time) bool {
	err := w.writeOutLocked(now)
	if err == nil {
		return true
	}
	w.err = err
	w.c.nc.Close()
	w.c.logAddrs(w.c.srv.obs.log.Debug().Err(err)).Msg("client write failed; connection closed")
	return false
}

// writeOutLocked writes the buffered answers and hands the buffer back,
// whether or not the write succeeds. The write deadline is set only here,
// where the client can make the hub wait, and moved like the read
// deadline: a blocked write fails between WriteTimeout and WriteTimeout
// plus deadlineSlack after it began.
func (w *answerWriter) writeOutLocked(now time.Time) error {
	b := *w.buf
	var err error
	if len(b) > 0 {
		if wt := w.c.srv.writeTimeout; w.writeDeadline.Sub(now) < wt {
			w.writeDeadline = now.Add(wt + deadlineSlack(wt))
			_ = w.c.nc.SetWriteDeadline(w.writeDeadline)
		}
		_, err = w.c.nc.Write(b)
	}
	*w.buf = b[:0]
	writeBufs.Put(w.buf)
	w.buf = nil
	return err
}
