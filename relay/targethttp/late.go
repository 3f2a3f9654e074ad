package targethttp

import (
	"time"

	"github.com/valyala/fasthttp"
)

// readLate hands c, the connection of a call that timed out at deadline
// with its whole request sent and no byte of an answer read, to a
// goroutine that reads on for the grace, and reports whether it did: not
// when late reading is off, when MaxInflight connections of the target are
// read on already, nor once Conns.Abort has begun. Nothing of the answer
// was read, so the reading starts clean at its first byte.
func (t *Client) readLate(c *targetConn, txid []byte, deadline time.Time) bool {
	if t.onLate == nil || !t.conns.startLate() {
		return false
	}
	if t.lateReaders.Add(1) > t.lateMax || c.SetDeadline(deadline.Add(t.lateGrace)) != nil {
		t.lateReaders.Add(-1)
		t.conns.late.Done()
		return false
	}
	go t.lateReader(c, string(txid))
	return true
}

// lateReader reads the late answer of txid's call on c until the deadline
// set on c, delivers it when it came in full and in the target protocol,
// and closes c. Conns.Abort ends it by closing c.
func (t *Client) lateReader(c *targetConn, txid string) {
	defer t.conns.late.Done()
	defer t.lateReaders.Add(-1)
	defer c.Close()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	br := acquireReader(c)
	err := resp.ReadLimitBody(br, maxAnswerBytes)
	releaseReader(br)
	if err != nil {
		return
	}
	code, msg, malformed := decodeAnswer(resp.StatusCode(), resp.Body())
	if malformed {
		return
	}
	t.onLate(LateAnswer{TxID: txid, Code: code, Msg: msg, At: time.Now()})
}

// startLate counts a late reader in, unless Abort has begun: counted under
// the lock Abort takes, so that WaitLate after Abort waits for every one.
func (tc *Conns) startLate() bool {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.open == nil {
		return false
	}
	tc.late.Add(1)
	return true
}

// WaitLate waits until every connection read on for a late answer is
// done: the answer came, the grace ran out, or Abort closed it. Call it
// after Abort, at shutdown, to wait for the readers' goroutines.
func (tc *Conns) WaitLate() { tc.late.Wait() }
