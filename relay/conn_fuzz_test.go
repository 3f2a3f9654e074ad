package relay

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzReadLine feeds the connection's line reader any input, cut into
// reads of any size, with the end of input arriving alone or with the last
// bytes, and holds it to the same line semantics as bufio (referenceLines):
// the same lines, the same over-long lines with the TXIDs read from them,
// the same end.
func FuzzReadLine(f *testing.F) {
	f.Add([]byte("T1|CORE|BAL 1\nT2|CORE|x\r\n\n"), uint8(0), uint16(1), false)
	f.Add([]byte("LONG|CORE|0123456789012345678901234567890123456789\nT3|CORE|y"), uint8(0), uint16(5), true)
	f.Add([]byte("A|B|\r\r\n|||\n\r\n"), uint8(3), uint16(4096), false)
	// At least 14: bufio, the reference, never buffers less than 16 bytes.
	maxLines := []int{14, 32, readBufSize - 3, readBufSize - 2, readBufSize - 1, readBufSize, readBufSize + 1}
	f.Fuzz(func(t *testing.T, stream []byte, maxLineChoice uint8, chunk uint16, eofWithData bool) {
		maxLine := maxLines[int(maxLineChoice)%len(maxLines)]
		srv := lineServer(t, maxLine)
		c := newConn(srv, &chunkConn{in: stream, chunk: 1 + int(chunk)%(2*readBufSize), eofWithData: eofWithData})
		require.Equal(t, referenceLines(stream, maxLine), collectLines(t, c))
	})
}
