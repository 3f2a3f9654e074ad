package loadgen

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/relayhub/relayhub/relay/protocol"
)

// readLoop matches answers to outstanding requests until the writer is
// done and nothing is outstanding, the drain deadline passes, or the
// connection fails.
func (c *loadConn) readLoop() {
	defer c.flushLatencies()
	br := bufio.NewReaderSize(c.nc, readBufferSize)
	if c.run.cfg.Protocol == ProtocolHTTP {
		c.readHTTP(br)
		return
	}
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case err == nil:
			if c.handle(line) {
				return
			}
			continue
		case errors.Is(err, bufio.ErrBufferFull):
			c.malformed++
			if err := skipLine(br); err != nil {
				c.endRead(err)
				return
			}
			continue
		}
		if len(line) > 0 {
			c.malformed++ // a partial line before the error
		}
		c.endRead(err)
		return
	}
}

// endRead settles the reader's books when reading stops with err.
func (c *loadConn) endRead(err error) {
	c.mu.Lock()
	done, out := c.writerDone, c.outstanding
	c.mu.Unlock()
	if done && (out == 0 || errors.Is(err, os.ErrDeadlineExceeded)) {
		// The writer finished; whatever is still outstanding when the drain
		// deadline passes is missing, which is not a connection error.
		return
	}
	select {
	case <-c.quit:
		// The writer failed first and closed the socket: already counted.
		return
	default:
	}
	switch {
	case errors.Is(err, io.EOF):
		err = errors.New("connection closed by the hub")
	case errors.Is(err, io.ErrUnexpectedEOF) && c.run.cfg.Protocol == ProtocolHTTP:
		// http.ReadResponse reports a close between answers this way.
		err = errors.New("connection closed by the target")
	}
	c.fail(err)
}

// skipLine discards the rest of an over-long line.
func skipLine(br *bufio.Reader) error {
	for {
		_, err := br.ReadSlice('\n')
		if !errors.Is(err, bufio.ErrBufferFull) {
			return err
		}
	}
}

// readHTTP matches HTTP answers to outstanding requests in order, like
// readLoop does lines.
func (c *loadConn) readHTTP(br *bufio.Reader) {
	for {
		resp, err := http.ReadResponse(br, nil)
		if err == nil {
			c.answerBody, err = readCapped(resp.Body, c.answerBody[:0], readBufferSize)
			_ = resp.Body.Close()
		}
		if err != nil {
			c.endRead(err)
			return
		}
		if c.complete(c.nextInOrder(), httpAnswerCode(resp.StatusCode, c.answerBody)) {
			return
		}
	}
}

// readCapped reads r to its end, appending to buf, and fails when that is
// more than limit bytes: no target answer is anywhere near it.
func readCapped(r io.Reader, buf []byte, limit int) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		switch {
		case len(buf) > limit:
			return buf, fmt.Errorf("answer body over %d bytes", limit)
		case errors.Is(err, io.EOF):
			return buf, nil
		case err != nil:
			return buf, err
		}
	}
}

// nextInOrder returns the sequence number the next answer of an in-order
// protocol belongs to. Such answers free the ring's slots oldest first, so
// register never skips a slot and the numbers run 1, 2, 3, ...
func (c *loadConn) nextInOrder() uint64 {
	c.inOrderSeq++
	return c.inOrderSeq
}

// handle processes one answer line and reports whether the reader is done.
func (c *loadConn) handle(line []byte) bool {
	r := c.run
	if r.cfg.Protocol == ProtocolRedisPing {
		code, ok := parseRedisReply(line)
		if !ok {
			c.malformed++
			return false
		}
		return c.complete(c.nextInOrder(), code)
	}
	a, err := protocol.ParseResponse(line)
	if err != nil {
		c.malformed++
		return false
	}
	conn, seq, ok := parseLoadTxID(a.TxID)
	if !ok || conn != c.id {
		c.unmatched++
		r.unmatched.Add(1)
		return false
	}
	return c.complete(seq, a.Code)
}

// complete settles the answer, with code, to request seq of this
// connection and reports whether the reader is done. An answer to a
// request that is not outstanding is unmatched.
func (c *loadConn) complete(seq uint64, code []byte) bool {
	r := c.run
	c.mu.Lock()
	s := &c.ring[seq&c.mask]
	if !s.used || s.seq != seq {
		c.mu.Unlock()
		c.unmatched++
		r.unmatched.Add(1)
		return false
	}
	at, target := s.at, s.target
	s.used = false
	c.outstanding--
	done := c.writerDone && c.outstanding == 0
	c.mu.Unlock()
	<-c.tokens

	now := r.now()
	c.lastAnswer = now
	c.latencies = append(c.latencies, now-at)
	c.latencyOK = append(c.latencyOK, CodeSucceeded(code))
	if r.tl != nil {
		c.due = append(c.due, at)
		c.answerCodes = append(c.answerCodes, c.codeName(code))
	}
	if len(c.latencies) == latencyBatch {
		c.flushLatencies()
	}
	counts := c.codes[target]
	if p, ok := counts[string(code)]; ok {
		*p++
	} else {
		one := int64(1)
		counts[string(code)] = &one
	}
	c.answered++
	r.answered.Add(1)
	return done
}

// codeName returns code as a string, made once per distinct code, so an
// answer costs no allocation.
func (c *loadConn) codeName(code []byte) string {
	if s, ok := c.codeNames[string(code)]; ok {
		return s
	}
	if c.codeNames == nil {
		c.codeNames = make(map[string]string)
	}
	s := string(code)
	c.codeNames[s] = s
	return s
}

func (c *loadConn) flushLatencies() {
	if len(c.latencies) > 0 {
		c.run.record(c.latencies, c.latencyOK, c.due, c.answerCodes)
		c.latencies = c.latencies[:0]
		c.latencyOK = c.latencyOK[:0]
		c.due = c.due[:0]
		c.answerCodes = c.answerCodes[:0]
	}
}
