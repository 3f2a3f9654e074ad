package relay

import "io"

// waitForInput waits for a connection's next input holding no buffer: it
// reads one byte into lr.first and only then takes a read buffer for it,
// which the next read fills with whatever else came. So an idle
// connection, plain or TLS, holds no read buffer of the hub's, at the price
// of one more read per burst of input (docs/DESIGN.md, "Memory"). It
// records in lr.err why the input ends when it does.
func (lr *lineReader) waitForInput(rd io.Reader) {
	for range maxEmptyReads {
		n, err := rd.Read(lr.first[:])
		if n > 0 {
			lr.hold()
			(*lr.buf)[0] = lr.first[0]
			lr.w = 1
		}
		if n > 0 || err != nil {
			lr.err = err
			return
		}
	}
	lr.err = io.ErrNoProgress
}
