package relay

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/relay/protocol"
)

// readResult is what one readLine returned, comparable across readers.
type readResult struct {
	line    string
	tooLong bool
	eof     bool
}

func (r readResult) String() string {
	return fmt.Sprintf("{%q long=%v eof=%v}", r.line, r.tooLong, r.eof)
}

// referenceLines splits stream into lines the way the hub did with a
// bufio.Reader of MaxLineBytes+2 bytes: the semantics the pooled buffers
// must keep, byte for byte.
func referenceLines(stream []byte, maxLineBytes int) []readResult {
	r := bufio.NewReaderSize(bytes.NewReader(stream), maxLineBytes+2)
	var out []readResult
	for {
		line, err := r.ReadSlice('\n')
		res := readResult{eof: err == io.EOF}
		if err == bufio.ErrBufferFull {
			txid := string(protocol.LeadingTxID(line))
			for err == bufio.ErrBufferFull {
				_, err = r.ReadSlice('\n')
			}
			res = readResult{line: txid, tooLong: true, eof: err == io.EOF}
		} else {
			line = bytes.TrimSuffix(line, []byte{'\n'})
			line = bytes.TrimSuffix(line, []byte{'\r'})
			if len(line) > maxLineBytes {
				res.line, res.tooLong = string(protocol.LeadingTxID(line)), true
			} else {
				res.line = string(line)
			}
		}
		out = append(out, res)
		if err != nil {
			return out
		}
	}
}

// collectLines calls readLine until it fails, which must be at the end of
// the input.
func collectLines(t *testing.T, c *conn) []readResult {
	t.Helper()
	var out []readResult
	for range 1 << 20 {
		line, tooLong, err := c.readLine()
		if err != nil && err != io.EOF {
			require.NoError(t, err, "after %d lines", len(out))
		}
		out = append(out, readResult{line: string(line), tooLong: tooLong, eof: err == io.EOF})
		if err != nil {
			return out
		}
	}
	t.Fatal("no end of input")
	return nil
}

// chunkConn is a net.Conn without a file descriptor whose Read hands out its
// input at most chunk bytes at a time and, when eofWithData is set, reports
// the end of the input together with the last bytes, as io.Reader allows.
type chunkConn struct {
	net.Conn
	in          []byte
	chunk       int
	eofWithData bool
}

func (cc *chunkConn) Read(p []byte) (int, error) {
	if len(cc.in) == 0 {
		return 0, io.EOF
	}
	n := copy(p, cc.in[:min(cc.chunk, len(cc.in))])
	cc.in = cc.in[n:]
	if cc.eofWithData && len(cc.in) == 0 {
		return n, io.EOF
	}
	return n, nil
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	client, err = net.DialTimeout("tcp", ln.Addr().String(), hubtest.IOTimeout)
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	require.NoError(t, ln.(*net.TCPListener).SetDeadline(time.Now().Add(hubtest.IOTimeout)))
	server, err = ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { server.Close() })
	return server, client
}

// lineServer returns a Server that reads lines of at most maxLineBytes.
func lineServer(t *testing.T, maxLineBytes int) *Server {
	t.Helper()
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.MaxLineBytes = maxLineBytes
	srv, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, srv.Close()) })
	return srv
}

// lineStreams returns the inputs the readers are checked on, for lines of
// at most maxLine bytes.
func lineStreams(maxLine int) map[string][]byte {
	rnd := rand.New(rand.NewPCG(1, uint64(maxLine)))
	line := func(txid string, n int) string { // a line of n bytes, TXID first
		s := txid + "|CORE|"
		if n < len(s) {
			return strings.Repeat("x", n)
		}
		return s + strings.Repeat("p", n-len(s))
	}
	small := "S1|CORE|BAL 1\nS2|CORE|BAL 2\r\n\nS3|NONE|x\n"
	streams := map[string][]byte{
		"small lines": []byte(small),
		"straddles the read buffer": []byte(small + strings.Repeat("F|CORE|x\n", 450) +
			line("LONG", readBufSize+1000) + "\n" + small),
		"limit and one over after small lines": []byte(small +
			line("EX1", maxLine) + "\n" + line("EX2", maxLine) + "\r\n" +
			line("OV1", maxLine+1) + "\n" + line("OV2", maxLine+1) + "\r\n" + line("OV3", maxLine+2) + "\n" +
			"ok|CORE|after\n" +
			// Its '|' comes after the first MaxLineBytes+2 bytes when the
			// limit is small: then it has no TXID.
			line(strings.Repeat("T", 60), maxLine+5000) + "\n" +
			line("FAR", 6*maxLine+17) + "\n" +
			strings.Repeat("y", 3*maxLine) + "\n" +
			"bad txid|CORE|" + strings.Repeat("z", 2*maxLine) + "\n" + small),
		"pipelined lines over many buffers": []byte(strings.Repeat("P-0001|CORE|XFER 1001 1002 2500\n", 3000)),
		"unterminated last line":            []byte(small + "LAST|CORE|no newline\r"),
		"unterminated line at the limit":    []byte(small + line("LAST", maxLine)),
		"unterminated line one over":        []byte(small + line("LAST", maxLine+1)),
		"unterminated line far over":        []byte(small + line("LAST", 3*maxLine)),
		"empty":                             nil,
	}
	var b strings.Builder
	for i := range 400 {
		n := rnd.IntN(60)
		switch rnd.IntN(8) {
		case 0:
			n = rnd.IntN(2*maxLine + 10)
		case 1:
			n = maxLine - 2 + rnd.IntN(5)
		case 2:
			n = readBufSize - 3 + rnd.IntN(6)
		}
		b.WriteString(line(fmt.Sprintf("R%d", i), n))
		if rnd.IntN(3) == 0 {
			b.WriteByte('\r')
		}
		b.WriteByte('\n')
	}
	streams["random lengths"] = []byte(b.String())
	return streams
}

// TestReadLineKeepsLineSemantics checks that the pooled read buffers split
// every input into the same lines, over-long refusals and TXIDs as a
// bufio.Reader of MaxLineBytes+2 did, whether the bytes come from a socket
// (a loopback TCP connection) or from a connection without a descriptor,
// in chunks of every size.
func TestReadLineKeepsLineSemantics(t *testing.T) {
	for _, maxLine := range []int{32, readBufSize - 3, readBufSize - 2, readBufSize - 1, DefaultMaxLineBytes} {
		srv := lineServer(t, maxLine)
		for name, stream := range lineStreams(maxLine) {
			want := referenceLines(stream, maxLine)
			t.Run(fmt.Sprintf("maxLine=%d/%s/socket", maxLine, name), func(t *testing.T) {
				nc, client := tcpPair(t)
				c := newConn(srv, nc)
				written := make(chan error, 1)
				go func() {
					// Pieces of odd sizes, so lines arrive split across reads.
					for rest := stream; len(rest) > 0; {
						n := min(len(rest), 1+len(rest)%7919)
						if _, err := client.Write(rest[:n]); err != nil {
							written <- err
							return
						}
						rest = rest[n:]
					}
					written <- client.(*net.TCPConn).CloseWrite()
				}()
				require.NoError(t, nc.SetReadDeadline(time.Now().Add(hubtest.IOTimeout)))
				assert.Equal(t, want, collectLines(t, c))
				assert.NoError(t, <-written)
			})
			for _, chunk := range []int{1, 7, readBufSize, DefaultMaxLineBytes + 5} {
				for _, eofWithData := range []bool{false, true} {
					t.Run(fmt.Sprintf("maxLine=%d/%s/chunks of %d, eof with data %v", maxLine, name, chunk, eofWithData), func(t *testing.T) {
						if chunk == 1 && len(stream) > 100_000 {
							t.Skip("covered by the larger chunks")
						}
						c := newConn(srv, &chunkConn{in: stream, chunk: chunk, eofWithData: eofWithData})
						assert.Equal(t, want, collectLines(t, c))
					})
				}
			}
		}
	}
}

// waitForInput makes c's next read wait for input that will not come until
// a deadline a moment away, so that the read loop parks as it does on an
// idle connection, and checks that the wait ended with that deadline.
func waitForInput(t *testing.T, c *conn) {
	t.Helper()
	require.NoError(t, c.nc.SetReadDeadline(time.Now().Add(100*time.Millisecond)))
	_, _, err := c.readLine()
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
}

// readLines reads n lines from c and returns them.
func readLines(t *testing.T, c *conn, n int) []string {
	t.Helper()
	require.NoError(t, c.nc.SetReadDeadline(time.Now().Add(hubtest.IOTimeout)))
	var got []string
	for range n {
		line, tooLong, err := c.readLine()
		require.NoError(t, err)
		require.False(t, tooLong)
		got = append(got, string(line))
	}
	return got
}

func TestIdleConnectionHoldsNoBuffers(t *testing.T) {
	srv := lineServer(t, DefaultMaxLineBytes)
	long := "L|CORE|" + strings.Repeat("p", 3*readBufSize)

	t.Run("nothing held after small lines", func(t *testing.T) {
		nc, client := tcpPair(t)
		c := newConn(srv, nc)
		_, err := io.WriteString(client, "A|CORE|1\nB|CORE|2\n")
		require.NoError(t, err)
		assert.Equal(t, []string{"A|CORE|1", "B|CORE|2"}, readLines(t, c, 2))
		waitForInput(t, c)
		assertHoldsNoInput(t, c)
	})

	t.Run("the long-line buffer goes back once the long line is used", func(t *testing.T) {
		nc, client := tcpPair(t)
		c := newConn(srv, nc)
		_, err := io.WriteString(client, "A|CORE|1\n"+long+"\nB|CORE|2\n")
		require.NoError(t, err)
		assert.Equal(t, []string{"A|CORE|1", long, "B|CORE|2"}, readLines(t, c, 3))
		waitForInput(t, c)
		assertHoldsNoInput(t, c)
	})

	t.Run("a partial long line keeps the long-line buffer", func(t *testing.T) {
		nc, client := tcpPair(t)
		c := newConn(srv, nc)
		_, err := io.WriteString(client, "A|CORE|1\n"+long[:2*readBufSize])
		require.NoError(t, err)
		assert.Equal(t, []string{"A|CORE|1"}, readLines(t, c, 1))
		waitForInput(t, c)
		require.NotNil(t, c.in.buf)
		assert.True(t, c.in.inLong)
	})

	t.Run("a short partial line after a long line moves back to a read buffer", func(t *testing.T) {
		nc, client := tcpPair(t)
		c := newConn(srv, nc)
		_, err := io.WriteString(client, long+"\nC|CO")
		require.NoError(t, err)
		assert.Equal(t, []string{long}, readLines(t, c, 1))
		waitForInput(t, c)
		require.NotNil(t, c.in.buf)
		assert.False(t, c.in.inLong)
		assert.Len(t, *c.in.buf, readBufSize)
	})

	t.Run("the read loop hands its buffer back when it ends", func(t *testing.T) {
		nc, client := tcpPair(t)
		c := newConn(srv, nc)
		_, err := io.WriteString(client, "A|NONE|1\n"+long[:2*readBufSize])
		require.NoError(t, err)
		require.NoError(t, client.(*net.TCPConn).CloseWrite())
		assert.Equal(t, endEOF, c.readLoop())
		assert.Nil(t, c.in.buf)
	})

	t.Run("the write buffer goes back with the write that empties it", func(t *testing.T) {
		nc, client := tcpPair(t)
		c := newConn(srv, nc)
		c.out.answerText([]byte("A"), protocol.CodeUnknownTarget, protocol.MsgUnknownTarget, false)
		c.out.mu.Lock()
		require.NotNil(t, c.out.buf, "an unflushed answer is held")
		c.out.mu.Unlock()
		c.out.flush(time.Now())
		c.out.answerText([]byte("B"), protocol.CodeUnknownTarget, protocol.MsgUnknownTarget, true)
		c.out.mu.Lock()
		assert.Nil(t, c.out.buf)
		c.out.mu.Unlock()
		r := bufio.NewReader(client)
		require.NoError(t, client.SetReadDeadline(time.Now().Add(hubtest.IOTimeout)))
		for _, want := range []string{"A|E903|" + protocol.MsgUnknownTarget + "\n", "B|E903|" + protocol.MsgUnknownTarget + "\n"} {
			got, err := r.ReadString('\n')
			require.NoError(t, err)
			assert.Equal(t, want, got)
		}
	})
}

// TestAnswersOverflowTheWriteBuffer checks that a burst of answers larger
// than the write buffer goes out whole and in order.
func TestAnswersOverflowTheWriteBuffer(t *testing.T) {
	srv := lineServer(t, DefaultMaxLineBytes)
	nc, client := tcpPair(t)
	c := newConn(srv, nc)
	long := strings.Repeat("m", protocol.MaxMessageBytes)
	var want strings.Builder
	for i := range 100 { // about 60 KB: many buffers' worth
		txid := fmt.Sprintf("%064d", i)
		want.WriteString(txid + "|B201|" + long + "\n")
	}
	done := make(chan []byte, 1)
	go func() {
		_ = client.SetReadDeadline(time.Now().Add(hubtest.IOTimeout))
		b, _ := io.ReadAll(io.LimitReader(client, int64(want.Len())))
		done <- b
	}()
	for i := range 100 {
		c.out.answerText([]byte(fmt.Sprintf("%064d", i)), "B201", long, false)
		c.out.mu.Lock()
		// Each answer is of the longest kind: seven fit, the eighth sends them.
		require.Len(t, *c.out.buf, (i%7+1)*maxAnswerLen, "answers are written once the next might not fit")
		require.Equal(t, writeBufSize, cap(*c.out.buf), "the write buffer never grows")
		c.out.mu.Unlock()
	}
	c.out.flush(time.Now())
	assert.Equal(t, want.String(), string(<-done))
}

func TestLongLinesThroughTheServer(t *testing.T) {
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	_, addr := startServer(t, cfg)
	line := func(txid string, n int) string {
		s := txid + "|NONE|"
		return s + strings.Repeat("p", n-len(s))
	}
	unknown := func(txid string) string { return txid + "|E903|" + protocol.MsgUnknownTarget }
	tooLong := func(txid string) string { return txid + "|E900|" + protocol.MsgLineTooLong }

	t.Run("limit and one over, right after small lines", func(t *testing.T) {
		c := hubtest.Dial(t, addr)
		c.Send("S1|NONE|a", "S2|NONE|b",
			line("EX1", DefaultMaxLineBytes), line("EX2", DefaultMaxLineBytes)+"\r",
			line("OV1", DefaultMaxLineBytes+1), line("OV2", DefaultMaxLineBytes+1)+"\r",
			"S3|NONE|c")
		assert.Equal(t, map[string]string{
			"S1": unknown("S1"), "S2": unknown("S2"),
			"EX1": unknown("EX1"), "EX2": unknown("EX2"),
			"OV1": tooLong("OV1"), "OV2": tooLong("OV2"),
			"S3": unknown("S3"),
		}, hubtest.Lines(c.ReadByTxID(7)))
	})

	t.Run("pipelined lines of every length", func(t *testing.T) {
		c := hubtest.Dial(t, addr)
		want := map[string]string{}
		var lines []string
		for i := range 300 {
			txid := fmt.Sprintf("P%03d", i)
			n := []int{20, 600, readBufSize - 1, readBufSize + 1, 9000, DefaultMaxLineBytes, DefaultMaxLineBytes + 1, 40000}[i%8]
			lines = append(lines, line(txid, n))
			want[txid] = unknown(txid)
			if n > DefaultMaxLineBytes {
				want[txid] = tooLong(txid)
			}
		}
		sent := make(chan error, 1)
		go func() {
			_, err := io.WriteString(c.Conn(), strings.Join(lines, "\n")+"\n")
			sent <- err
		}()
		assert.Equal(t, want, hubtest.Lines(c.ReadByTxID(len(want))))
		require.NoError(t, <-sent)
	})

	t.Run("a long line written in pieces", func(t *testing.T) {
		c := hubtest.Dial(t, addr)
		full := line("PC", DefaultMaxLineBytes) + "\n"
		for rest := full; len(rest) > 0; {
			n := min(len(rest), 3000)
			_, err := io.WriteString(c.Conn(), rest[:n])
			require.NoError(t, err)
			rest = rest[n:]
		}
		assert.Equal(t, unknown("PC"), c.ReadResponse().String())
		assert.Equal(t, unknown("Z"), c.Exchange("Z|NONE|x").String())
	})
}

// TestFastFailThroughTheConnectionDoesNotAllocate checks that an E904 line
// costs no allocation from the socket to the answer on the socket: the read,
// the lent read and write buffers, the breaker's
// refusal and the deadlines.
func TestFastFailThroughTheConnectionDoesNotAllocate(t *testing.T) {
	_, c, client := openCoreConn(t)
	assert.Zero(t, e904AllocsPerLine(t, c, client))
}

// openCoreConn returns a Server of CORE alone, its breaker open for an
// hour, and both ends of a loopback connection to it, for the tests that
// count allocations: they skip under the race detector, whose sync.Pool
// drops items at random.
func openCoreConn(t *testing.T) (*Server, *conn, net.Conn) {
	t.Helper()
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	srv := openCoreServer(t, cfg)
	nc, client := tcpPair(t)
	return srv, newConn(srv, nc), client
}

// openCoreServer returns a Server of cfg whose CORE breaker is open for an
// hour, closed when the test ends.
func openCoreServer(t *testing.T, cfg Config) *Server {
	t.Helper()
	cfg.FailThreshold, cfg.ResetTimeout = 1, time.Hour
	srv, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, srv.Close()) })
	rt := srv.table.lookup([]byte("CORE"))
	ticket, _, err := rt.breaker.Allow()
	require.NoError(t, err)
	rt.breaker.Done(ticket, true, 0)
	require.Equal(t, breaker.Open, rt.breaker.Snapshot().State)
	return srv
}

// e904AllocsPerLine writes an E904 request line to c from client over and
// over, serving each as the read loop does and reading its answer, and
// returns the allocations per line. c's server must hold CORE's breaker
// open for an hour.
func e904AllocsPerLine(t *testing.T, c *conn, client net.Conn) float64 {
	t.Helper()
	return allocsPerLine(t, c, client, "TX-000123|core|XFER 1001 1002 2500\n", "TX-000123|E904|circuit open; retry after 3600s\n")
}

// allocsPerLine writes request to c from client over and over, serving
// each as the read loop does and reading its answer, which must be want,
// and returns the allocations per line. A request must not start a call.
func allocsPerLine(t *testing.T, c *conn, client net.Conn, request, want string) float64 {
	t.Helper()
	req, got := []byte(request), make([]byte, len(want))
	require.NoError(t, client.SetDeadline(time.Now().Add(hubtest.IOTimeout)))
	var failed error
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := client.Write(req); err != nil {
			failed = err
			return
		}
		c.armReadDeadline(time.Now())
		line, _, err := c.readLine()
		if err != nil {
			failed = err
			return
		}
		if c.serveLine(line) {
			failed = errors.New("the line started a call")
			return
		}
		if !c.in.lineHeld() {
			c.out.flush(time.Now())
		}
		if _, err := io.ReadFull(client, got); err != nil {
			failed = err
		}
	})
	require.NoError(t, failed)
	assert.Equal(t, want, string(got))
	return allocs
}

// errorConn answers every read with no bytes and err.
type errorConn struct {
	net.Conn
	err error
}

func (ec errorConn) Read([]byte) (int, error) { return 0, ec.err }

func TestReadFailureDropsThePartialLine(t *testing.T) {
	srv := lineServer(t, DefaultMaxLineBytes)
	boom := errors.New("boom")
	tests := []struct {
		name    string
		readErr error
		want    error
	}{
		{name: "read error", readErr: boom, want: boom},
		{name: "reads that return nothing", readErr: nil, want: io.ErrNoProgress},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newConn(srv, &chunkConn{in: []byte("A|CORE|1\nB|CO"), chunk: 1 << 10})
			line, _, err := c.readLine()
			require.NoError(t, err)
			require.Equal(t, "A|CORE|1", string(line))
			c.nc = errorConn{err: tt.readErr}
			line, tooLong, err := c.readLine()
			assert.ErrorIs(t, err, tt.want)
			assert.Nil(t, line)
			assert.False(t, tooLong)
		})
	}
}

// deadlineConn records the deadlines set on it and swallows writes.
type deadlineConn struct {
	net.Conn
	read, write []time.Time
}

func (dc *deadlineConn) SetReadDeadline(t time.Time) error {
	dc.read = append(dc.read, t)
	return nil
}

func (dc *deadlineConn) SetWriteDeadline(t time.Time) error {
	dc.write = append(dc.write, t)
	return nil
}

func (dc *deadlineConn) Write(b []byte) (int, error) { return len(b), nil }

// TestDeadlinesMoveOncePerSlack checks the coarse deadlines: at every
// moment the read deadline (the idle check, see afterDeadline) is one to
// two slacks after the last complete line, and a write's deadline at least
// WriteTimeout after the write and at most deadlineSlack later; and a
// connection busy without pause sets each about once per slack, not once
// per line. TestIdleTimeoutWithCoarseDeadlines checks that the idle
// timeout itself is kept.
func TestDeadlinesMoveOncePerSlack(t *testing.T) {
	for _, timeout := range []time.Duration{80 * time.Millisecond, 8 * time.Second, DefaultIdleTimeout} {
		slack := deadlineSlack(timeout)
		t.Run(timeout.String(), func(t *testing.T) {
			require.Equal(t, min(time.Second, timeout/8), slack)
			cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
			cfg.IdleTimeout, cfg.WriteTimeout = timeout, timeout
			srv, err := New(cfg)
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, srv.Close()) })
			dc := &deadlineConn{}
			c := newConn(srv, dc)
			start := time.Now()

			// Given a line and an answer every slack/100 for 50 slacks.
			const steps = 5000
			for i := range steps + 1 {
				now := start.Add(time.Duration(i) * slack / 100)
				c.out.answerText([]byte("A"), protocol.CodeUnknownTarget, protocol.MsgUnknownTarget, false)
				c.out.flush(now)
				c.armReadDeadline(now)

				// Then the deadlines in force are neither early nor late
				// by more than the slack.
				rd, wd := dc.read[len(dc.read)-1], dc.write[len(dc.write)-1]
				require.False(t, rd.Before(now.Add(slack)), "step %d: idle check %v early", i, now.Add(slack).Sub(rd))
				require.False(t, rd.After(now.Add(2*slack)), "step %d: idle check %v late", i, rd.Sub(now.Add(2*slack)))
				require.False(t, wd.Before(now.Add(timeout)), "step %d: write deadline %v early", i, now.Add(timeout).Sub(wd))
				require.False(t, wd.After(now.Add(timeout+slack)), "step %d: write deadline %v late", i, wd.Sub(now.Add(timeout)))
			}
			// And each moved about once per slack.
			assert.InDelta(t, steps/100, len(dc.read), 2, "idle deadlines set")
			assert.InDelta(t, steps/100, len(dc.write), 2, "write deadlines set")

			// When Shutdown stops reading, its past deadline stays.
			c.stopReading()
			c.armReadDeadline(start.Add(time.Hour))
			assert.Equal(t, aLongTimeAgo, dc.read[len(dc.read)-1])
		})
	}
}

func TestIdleTimeoutWithCoarseDeadlines(t *testing.T) {
	t.Run("never closes before IdleTimeout after the last complete line", func(t *testing.T) {
		const idle = 200 * time.Millisecond
		cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
		cfg.IdleTimeout = idle
		_, addr := startServer(t, cfg)
		c := hubtest.Dial(t, addr)
		// Given lines one after the other for a few slacks, so that the last
		// one falls anywhere between two moves of the deadline.
		var last time.Time
		for i, start := 0, time.Now(); i < 100_000 && time.Since(start) < 3*deadlineSlack(idle); i++ {
			last = time.Now()
			require.Equal(t, "B|E903|"+protocol.MsgUnknownTarget, c.Exchange("B|NONE|x").String())
		}
		// When the client then sends only the start of a line.
		_, err := io.WriteString(c.Conn(), "C|NONE|partial")
		require.NoError(t, err)
		// Then the hub closes, but not before IdleTimeout has passed.
		c.ExpectEOF()
		assert.GreaterOrEqual(t, time.Since(last), idle)
	})

	t.Run("a busy connection outlives its idle and write timeouts", func(t *testing.T) {
		const timeout = 100 * time.Millisecond
		cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
		cfg.IdleTimeout, cfg.WriteTimeout = timeout, timeout
		_, addr := startServer(t, cfg)
		c := hubtest.Dial(t, addr)
		n := 0
		for start := time.Now(); n < 1_000_000 && time.Since(start) < 4*timeout; n++ {
			require.Equal(t, "B|E903|"+protocol.MsgUnknownTarget, c.Exchange("B|NONE|x").String(), "after %d lines", n)
		}
		c.ExpectEOF() // and the idle timeout still ends it once it is quiet
	})
}

// TestLinesArriveAfterDrainedReads sends lines in writes that arrive when
// the hub has just read everything before them: while it is handling the
// previous write's lines or already waiting. A hub that missed input
// arriving then would answer only at its idle timeout (5 min), long after
// the client's read deadline.
func TestLinesArriveAfterDrainedReads(t *testing.T) {
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.MaxLineBytes = 2 * readBufSize
	_, addr := startServer(t, cfg)
	unknown := func(txid string) string { return txid + "|E903|" + protocol.MsgUnknownTarget }

	t.Run("each write completes lines and ends inside the next", func(t *testing.T) {
		// Lines of every length, cut at a line's start, just before its
		// "\n", between its "\r" and "\n", or anywhere; the client waits
		// for the answers to each write before the next.
		c := hubtest.Dial(t, addr)
		rnd := rand.New(rand.NewPCG(6, 1))
		var lines []string // each with its "\n"
		answers := map[string]string{}
		for i := range 300 {
			txid := fmt.Sprintf("D%03d", i)
			head := txid + "|NONE|"
			n := []int{0, 1, 30, readBufSize - 1, readBufSize, readBufSize + 700,
				cfg.MaxLineBytes, cfg.MaxLineBytes + 1, cfg.MaxLineBytes + 3000}[rnd.IntN(9)]
			line := head + strings.Repeat("p", max(0, n-len(head)))
			answers[txid] = unknown(txid)
			if len(line) > cfg.MaxLineBytes {
				answers[txid] = txid + "|E900|" + protocol.MsgLineTooLong
			}
			if rnd.IntN(2) == 0 {
				line += "\r"
			}
			lines = append(lines, line+"\n")
		}
		sent, rest := 0, lines[0] // lines[sent] is the first line not complete; rest is what is unsent of it
		for sent < len(lines) {
			// Complete the line begun and up to two more, and begin the next.
			next := min(len(lines), sent+1+rnd.IntN(3))
			w := rest + strings.Join(lines[sent+1:next], "")
			rest = ""
			if next < len(lines) {
				l := lines[next]
				cut := []int{0, 1, len(l) - 1, len(l) - 2, rnd.IntN(len(l))}[rnd.IntN(5)]
				w, rest = w+l[:cut], l[cut:]
			}
			require.NoError(t, c.Conn().SetWriteDeadline(time.Now().Add(hubtest.IOTimeout)))
			_, err := io.WriteString(c.Conn(), w)
			require.NoError(t, err)
			want := map[string]string{}
			for _, l := range lines[sent:next] {
				txid, _, _ := strings.Cut(l, "|")
				want[txid] = answers[txid]
			}
			require.Equal(t, want, hubtest.Lines(c.ReadByTxID(len(want))), "lines %d to %d", sent, next-1)
			sent = next
		}
	})

	t.Run("writes back to back", func(t *testing.T) {
		// The second write arrives while the hub handles the burst of the
		// first, and the client, waiting for answers, leaves its processor
		// free to see the socket's readiness at once.
		c := hubtest.Dial(t, addr)
		var burst strings.Builder
		for j := range 40 {
			fmt.Fprintf(&burst, "A%02d|NONE|x\n", j)
		}
		for i := range 1000 {
			b := fmt.Sprintf("B%d", i)
			require.NoError(t, c.Conn().SetWriteDeadline(time.Now().Add(hubtest.IOTimeout)))
			_, err := io.WriteString(c.Conn(), burst.String())
			require.NoError(t, err)
			c.Send(b + "|NONE|x")
			got := hubtest.Lines(c.ReadByTxID(41))
			require.Len(t, got, 41)
			require.Equal(t, unknown(b), got[b], "round %d", i)
		}
	})
}

// TestLastLinesAndCloseReadTogether checks that a client's last lines and
// its close (or reset), read by the hub in one read, are answered and end
// the connection at once, not at the idle timeout: a read that returns
// fewer bytes than asked for may have reached the end of the input, which
// raises no further readiness.
func TestLastLinesAndCloseReadTogether(t *testing.T) {
	srv := lineServer(t, DefaultMaxLineBytes) // idle timeout 5 min
	tests := []struct {
		name    string
		input   string
		reset   bool
		want    []string
		wantEnd readEnd
	}{
		{
			name:    "complete lines then close",
			input:   "A|NONE|x\nB|NONE|y\n",
			want:    []string{"A|E903|" + protocol.MsgUnknownTarget, "B|E903|" + protocol.MsgUnknownTarget},
			wantEnd: endEOF,
		},
		{
			name:    "an unterminated last line then close",
			input:   "A|NONE|x\nB|NONE|y",
			want:    []string{"A|E903|" + protocol.MsgUnknownTarget, "B|E903|" + protocol.MsgUnknownTarget},
			wantEnd: endEOF,
		},
		{
			name:    "lines then reset",
			input:   "A|NONE|x\nB|NO",
			reset:   true,
			wantEnd: endError,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nc, client := tcpPair(t)
			// Given the input and the close are both there before the hub reads.
			_, err := io.WriteString(client, tt.input)
			require.NoError(t, err)
			if tt.reset {
				require.NoError(t, client.(*net.TCPConn).SetLinger(0))
				require.NoError(t, client.Close())
			} else {
				require.NoError(t, client.(*net.TCPConn).CloseWrite())
			}
			ended := make(chan readEnd, 1)
			go func() { ended <- newConn(srv, nc).readLoop() }()
			select {
			case end := <-ended:
				assert.Equal(t, tt.wantEnd, end)
			case <-time.After(hubtest.IOTimeout):
				nc.Close()
				<-ended
				t.Fatal("the read loop did not see the end of the input")
			}
			if tt.reset {
				return
			}
			r := bufio.NewReader(client)
			require.NoError(t, client.SetReadDeadline(time.Now().Add(hubtest.IOTimeout)))
			for _, want := range tt.want {
				got, err := r.ReadString('\n')
				require.NoError(t, err)
				assert.Equal(t, want+"\n", got)
			}
		})
	}
}

// resetByWriteConn is a client connection reset after its input, where a
// write takes the reset: its reads hand out in, then wait for a write,
// which fails with the reset, and then report a plain end of input, as the
// kernel does once a write has taken a reset's error. Reads time out after
// hubtest.IOTimeout when no write comes.
type resetByWriteConn struct {
	net.Conn // nil: only the methods below are used
	mu       sync.Mutex
	in       []byte // guarded by mu
	once     sync.Once
	reset    chan struct{} // closed by the first write
}

func newResetByWriteConn(in string) *resetByWriteConn {
	return &resetByWriteConn{in: []byte(in), reset: make(chan struct{})}
}

func (rc *resetByWriteConn) Read(p []byte) (int, error) {
	rc.mu.Lock()
	n := copy(p, rc.in)
	rc.in = rc.in[n:]
	rc.mu.Unlock()
	if n > 0 {
		return n, nil
	}
	select {
	case <-rc.reset:
		return 0, io.EOF
	case <-time.After(hubtest.IOTimeout):
		return 0, errors.New("no write took the reset")
	}
}

func (rc *resetByWriteConn) Write([]byte) (int, error) {
	rc.once.Do(func() { close(rc.reset) })
	return 0, &net.OpError{Op: "write", Net: "tcp", Err: syscall.ECONNRESET}
}

func (rc *resetByWriteConn) Close() error                     { return nil }
func (rc *resetByWriteConn) SetDeadline(time.Time) error      { return nil }
func (rc *resetByWriteConn) SetReadDeadline(time.Time) error  { return nil }
func (rc *resetByWriteConn) SetWriteDeadline(time.Time) error { return nil }
func (rc *resetByWriteConn) LocalAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9200}
}
func (rc *resetByWriteConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
}

// TestResetTakenByAWriteDropsTheCutLine: a reset is reported to the first
// call that meets it. When the write of an answer takes it, the read loop
// sees a plain end of input after the start of a line the reset cut; that
// line must not be served as a client's last one, or the target gets a
// withdrawal of 5 for one of 500.
func TestResetTakenByAWriteDropsTheCutLine(t *testing.T) {
	// Given a client that sent a line and the start of another, then reset
	// the connection, the reset taken by the write of the first answer,
	core := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	srv, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, srv.Close()) })
	c := newConn(srv, newResetByWriteConn("A|CORE|BAL 1001\nB|CORE|WD 1001 5"))

	// when the read loop comes to the end of the input,
	end := c.readLoop()
	c.adm.calls.Wait()

	// then the connection ended in error and only the whole line reached
	// the target.
	assert.Equal(t, endError, end)
	assert.Equal(t, 1, core.Calls())
}

func TestShutdownStopsAReaderWaitingWithAPartialLine(t *testing.T) {
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	srv, addr := startServer(t, cfg) // idle timeout 5 min
	c := hubtest.Dial(t, addr)
	// Given a reader waiting with the start of a line longer than its read
	// buffer, after a complete line.
	partial := "P|NONE|" + strings.Repeat("p", 2*readBufSize)
	require.NoError(t, c.Conn().SetWriteDeadline(time.Now().Add(hubtest.IOTimeout)))
	_, err := io.WriteString(c.Conn(), "A|NONE|x\n"+partial)
	require.NoError(t, err)
	require.Equal(t, "A|E903|"+protocol.MsgUnknownTarget, c.ReadResponse().String())

	// When the hub shuts down, then it stops reading at once.
	done := hubtest.ShutdownAsync(srv, hubtest.IOTimeout)
	c.ExpectEOF()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(hubtest.IOTimeout):
		t.Fatal("Shutdown did not return")
	}
}

// TestLastLineSentWithTheEndOfInputIsAnsweredAndClosed has clients write
// their last line and half-close at once, so that the line and the FIN
// mostly arrive under one readiness event: the read that takes the line
// leaves the end unseen, and the wait after it is woken by no further
// event. Each client must get its answer and then the hub's close, long
// before the idle timeout, which the end check deadline (endCheckAfter)
// sees to.
func TestLastLineSentWithTheEndOfInputIsAnsweredAndClosed(t *testing.T) {
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.IdleTimeout = time.Hour
	_, addr := startServer(t, cfg)
	for i := range 20 {
		nc, err := net.DialTimeout("tcp", addr, hubtest.IOTimeout)
		require.NoError(t, err)
		t.Cleanup(func() { nc.Close() })
		tc := nc.(*net.TCPConn)
		_, err = tc.Write(fmt.Appendf(nil, "L%d|NONE|x\n", i))
		require.NoError(t, err)
		require.NoError(t, tc.CloseWrite())

		require.NoError(t, tc.SetReadDeadline(time.Now().Add(hubtest.IOTimeout)))
		got, err := io.ReadAll(tc)
		require.NoError(t, err, "connection %d: the hub must close its side after the answer", i)
		assert.Equal(t, fmt.Sprintf("L%d|E903|%s\n", i, protocol.MsgUnknownTarget), string(got))
	}
}

// TestLinesAfterAPauseAreReadAfterTheEndCheck has a client pause for
// longer than endCheckAfter between lines, so that the end check deadline
// passes while the read loop waits: the loop must go on reading, and the
// connection stay open.
func TestLinesAfterAPauseAreReadAfterTheEndCheck(t *testing.T) {
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.IdleTimeout = time.Hour
	_, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	for i := range 3 {
		txid := fmt.Sprintf("P%d", i)
		assert.Equal(t, txid+"|E903|"+protocol.MsgUnknownTarget, c.Exchange(txid+"|NONE|x").String())
		time.Sleep(60 * time.Millisecond)
	}
}

// assertHoldsNoInput checks that c, waiting with no partial line, holds at
// most an empty read buffer: a long-line buffer goes back at once, and the
// read buffer when the connection goes quiet and hands off
// (TestIdleConnectionsHaveSmallStacksAndNoBuffers).
func assertHoldsNoInput(t *testing.T, c *conn) {
	t.Helper()
	if c.in.buf == nil {
		return
	}
	assert.False(t, c.in.inLong, "a waiting connection must hand a long-line buffer back")
	assert.Len(t, *c.in.buf, readBufSize)
	assert.True(t, c.in.empty(), "no input is held")
}
