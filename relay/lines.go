package relay

import (
	"bytes"
	"io"
	"sync"

	"github.com/relayhub/relayhub/relay/protocol"
)

// Buffer sizes of a connection.
const (
	// readBufSize holds a typical request line and a pipelined burst of
	// them in one read, in one page.
	readBufSize = 4 << 10
	// writeBufSize lets a pipelined burst of answers go out in one write,
	// as with bufio's default.
	writeBufSize = 4 << 10
	// maxAnswerLen is the longest line protocol.AppendResponse makes.
	maxAnswerLen = protocol.MaxTxIDLen + 1 + 4 + 1 + protocol.MaxMessageBytes + 1
	// maxEmptyReads is how many reads in a row may return no bytes and no
	// error before the connection counts as broken, as in bufio.
	maxEmptyReads = 100
)

// readBufs and writeBufs lend buffers to connections while they hold
// bytes: an idle connection holds neither (docs/DESIGN.md, "Memory").
var (
	readBufs  = sync.Pool{New: func() any { b := make([]byte, readBufSize); return &b }}
	writeBufs = sync.Pool{New: func() any { b := make([]byte, 0, writeBufSize); return &b }}
)

// lineReader splits a connection's input into request lines in a pooled
// buffer, taken when input comes and handed back when the connection goes
// quiet (release) or a long line is used up. A line that outgrows a read
// buffer moves to a buffer of maxLine+2 bytes from long; one longer than
// that is over-long: its TXID is kept and the rest dropped up to its
// '\n', so the hub never holds more of a line than the cap. It is owned
// by its connection's read loop.
type lineReader struct {
	maxLine    int
	long       *sync.Pool // buffers of maxLine+2 bytes
	buf        *[]byte    // nil while no buffer is held
	r, w       int        // the input not yet used is (*buf)[r:w]
	scanned    int        // the first scanned bytes of the input hold no '\n'
	inLong     bool       // buf is from long, else from readBufs
	discarding bool       // the input is the rest of an over-long line
	err        error      // why the input ended, reported once the input before it is used
	txid       *longTxID  // the over-long line's TXID; allocated for the first
	first      [1]byte    // waitForInput's byte
}

// longTxID is the TXID of an over-long line, kept while its rest is dropped.
type longTxID struct {
	b [protocol.MaxTxIDLen]byte
	n uint8
}

// readLine returns the next line without its "\n" or "\r\n", reading from
// rd when no complete line is held; the line is valid until the next call.
// An over-long line comes back as its TXID (nil when its start had none)
// with tooLong. err is io.EOF with the last, unterminated line of a client
// that closed its side (still to be served), a passed read deadline (the
// input is kept, and the next call reads on), or the read error that ends
// the input (a partial line is then dropped).
func (lr *lineReader) readLine(rd io.Reader) (line []byte, tooLong bool, err error) {
	if lr.discarding {
		return lr.discardLine(rd)
	}
	for {
		in := lr.input()
		if i := bytes.IndexByte(in[lr.scanned:], '\n'); i >= 0 {
			i += lr.scanned
			lr.r += i + 1
			lr.scanned = 0
			line, tooLong = lr.checkLine(in[:i])
			return line, tooLong, nil
		}
		lr.scanned = len(in)
		if len(in) >= lr.maxLine+2 {
			lr.scanned = 0
			return lr.discardLine(rd)
		}
		if lr.err != nil {
			err, lr.err = lr.err, nil
			if isTimeout(err) {
				return nil, false, err // the input stays: the caller may read on
			}
			lr.r, lr.scanned = lr.w, 0
			if err != io.EOF {
				return nil, false, err
			}
			line, tooLong = lr.checkLine(in)
			return line, tooLong, io.EOF
		}
		lr.fill(rd)
	}
}

// checkLine trims the '\r' before a line's end and refuses the line when
// it is longer than maxLine, returning instead the TXID at its start, read
// from the bytes an over-long line would have been cut to.
func (lr *lineReader) checkLine(raw []byte) (line []byte, tooLong bool) {
	line = bytes.TrimSuffix(raw, []byte{'\r'})
	if len(line) <= lr.maxLine {
		return line, false
	}
	return protocol.LeadingTxID(raw[:min(len(raw), lr.maxLine+2)]), true
}

// discardLine ends an over-long line whose first maxLine+2 bytes are the
// input: it keeps the line's TXID and drops input up to the line's '\n',
// or to the end of the input.
func (lr *lineReader) discardLine(rd io.Reader) (txid []byte, tooLong bool, err error) {
	if !lr.discarding {
		if lr.txid == nil {
			lr.txid = new(longTxID)
		}
		lr.txid.n = uint8(copy(lr.txid.b[:], protocol.LeadingTxID(lr.input()[:lr.maxLine+2])))
		lr.discarding = true
	}
	for {
		if i := bytes.IndexByte(lr.input(), '\n'); i >= 0 {
			lr.r += i + 1
			lr.discarding = false
			return lr.txid.b[:lr.txid.n], true, nil
		}
		lr.r = lr.w
		if lr.err != nil {
			err, lr.err = lr.err, nil
			if isTimeout(err) {
				return nil, false, err
			}
			lr.discarding = false
			if err != io.EOF {
				return nil, false, err
			}
			return lr.txid.b[:lr.txid.n], true, io.EOF
		}
		lr.fill(rd)
	}
}

// input returns the bytes read and not yet used.
func (lr *lineReader) input() []byte {
	if lr.buf == nil {
		return nil
	}
	return (*lr.buf)[lr.r:lr.w]
}

// empty reports whether no input is held.
func (lr *lineReader) empty() bool { return lr.r == lr.w && lr.err == nil }

// lineHeld reports whether a whole line is held, so the next readLine
// will not wait for the client.
func (lr *lineReader) lineHeld() bool {
	return bytes.IndexByte(lr.input(), '\n') >= 0
}

// fill reads once from rd after the input held, recording in err why the
// input ends when it does. Holding no buffer it waits for one byte without
// one (waitForInput): that byte may end a line, so the read of the rest is
// the next fill's.
func (lr *lineReader) fill(rd io.Reader) {
	lr.makeRoom()
	if lr.buf == nil {
		lr.waitForInput(rd)
		return
	}
	for range maxEmptyReads {
		n, err := rd.Read((*lr.buf)[lr.w:])
		lr.w += n
		if n > 0 || err != nil {
			lr.err = err
			return
		}
	}
	lr.err = io.ErrNoProgress
}

// makeRoom readies the buffer for a read: an empty buffer starts over (a
// long-line buffer is swapped for a read buffer), the input left moves to
// the start, and input that fills a read buffer moves to a long-line
// buffer; a long-line buffer whose input fits a read buffer goes back too.
// The read buffer is kept while the connection is busy: the loop hands it
// back when the connection goes quiet (conn.afterDeadline).
func (lr *lineReader) makeRoom() {
	switch {
	case lr.buf == nil:
	case lr.r == lr.w && lr.inLong:
		lr.release()
		lr.hold()
	case lr.r == lr.w:
		lr.r, lr.w = 0, 0
	case lr.inLong && lr.w-lr.r < readBufSize:
		buf := readBufs.Get().(*[]byte)
		n := copy(*buf, lr.input())
		lr.long.Put(lr.buf)
		lr.buf, lr.inLong, lr.r, lr.w = buf, false, 0, n
	case lr.r > 0:
		lr.w = copy(*lr.buf, (*lr.buf)[lr.r:lr.w])
		lr.r = 0
	case lr.w == len(*lr.buf):
		long := lr.longBuf()
		lr.w = copy(*long, lr.input())
		readBufs.Put(lr.buf)
		lr.buf, lr.inLong = long, true
	}
}

// preload takes b, read before the loop began (past a PROXY header), as
// the first input.
func (lr *lineReader) preload(b []byte) {
	lr.hold()
	lr.w = copy(*lr.buf, b)
}

// hold takes a read buffer unless one is held.
func (lr *lineReader) hold() {
	if lr.buf == nil {
		lr.buf, lr.inLong, lr.r, lr.w = readBufs.Get().(*[]byte), false, 0, 0
	}
}

// release hands back the buffer, dropping any input in it.
func (lr *lineReader) release() {
	if lr.buf == nil {
		return
	}
	if lr.inLong {
		lr.long.Put(lr.buf)
	} else {
		readBufs.Put(lr.buf)
	}
	lr.buf, lr.inLong, lr.r, lr.w, lr.scanned = nil, false, 0, 0, 0
}

// longBuf returns a buffer of maxLine+2 bytes.
func (lr *lineReader) longBuf() *[]byte {
	if b, ok := lr.long.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, lr.maxLine+2)
	return &b
}
