// Package fakerelay is a tiny stand-in for the hub's client port, for
// tests of the tools that drive it: it speaks the line protocol over
// loopback and misbehaves as its Config says (answers out of order, drops,
// stray and garbage lines, hang-ups, silence).
//
// Typical use:
//
//	f := fakerelay.New(t, fakerelay.Config{DropNth: 10})
//	// ... send 50 requests to f.Addr ...
//	assert.Equal(t, int64(50), f.Lines())
package fakerelay

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sourcegraph/conc"
	"github.com/stretchr/testify/require"
)

// Config sets how a Relay misbehaves. The zero value answers every line at
// once, in order, with TXID|0000|ok.
type Config struct {
	// Code returns the answer code for a target; nil answers 0000.
	Code func(target string) string
	// Hold keeps answers back until this many are pending on a connection,
	// then writes them newest first; 0 or 1 answers at once.
	Hold int
	// DropNth leaves the Nth request line (counted over all connections,
	// from 1) without an answer.
	DropNth int64
	// BogusAfterNth writes an extra answer with a TXID nobody sent once
	// the Nth request line is read, just before its answer, so the tool is
	// still reading when it comes.
	BogusAfterNth int64
	// GarbageAfterNth writes a line that is not TXID|CODE|MESSAGE once the
	// Nth request line is read, just before its answer.
	GarbageAfterNth int64
	// CloseAfter closes each connection once it has answered this many
	// lines; 0 never.
	CloseAfter int
	// Silent reads requests and never answers.
	Silent bool
	// AnswerTxID, when set, replaces the TXID of every answer.
	AnswerTxID string
}

// Relay is a running fake hub. It is safe for concurrent use.
type Relay struct {
	// Addr is the address it listens on, host:port.
	Addr string

	cfg Config
	ln  net.Listener

	lines     atomic.Int64 // request lines read over all connections
	reordered atomic.Int64 // batches answered newest first

	mu    sync.Mutex
	conns map[net.Conn]bool // guarded by mu
	loops conc.WaitGroup    // owns acceptLoop and each connection's serveConn
}

// New starts a fake hub on an ephemeral loopback port. It is closed when
// the test ends.
func New(t testing.TB, cfg Config) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &Relay{cfg: cfg, ln: ln, Addr: ln.Addr().String(), conns: make(map[net.Conn]bool)}
	f.loops.Go(f.acceptLoop)
	t.Cleanup(f.Close)
	return f
}

// Lines returns the number of request lines read over all connections.
func (f *Relay) Lines() int64 { return f.lines.Load() }

// Reordered returns the number of batches answered newest first (see
// Config.Hold).
func (f *Relay) Reordered() int64 { return f.reordered.Load() }

// Close stops listening, closes every connection and waits for their
// goroutines. Calling it more than once is harmless, so a test can close
// the hub early to get an address nobody listens on.
func (f *Relay) Close() {
	_ = f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.loops.Wait()
}

func (f *Relay) acceptLoop() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns[c] = true
		f.mu.Unlock()
		f.loops.Go(func() { f.serveConn(c) })
	}
}

func (f *Relay) serveConn(c net.Conn) {
	defer func() {
		f.mu.Lock()
		delete(f.conns, c)
		f.mu.Unlock()
		_ = c.Close()
	}()
	br := bufio.NewReader(c)
	bw := bufio.NewWriter(c)
	var pending [][]byte
	answered := 0
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				_ = bw.Flush()
			}
			return
		}
		n := f.lines.Add(1)
		if f.cfg.Silent || n == f.cfg.DropNth {
			continue
		}
		if n == f.cfg.BogusAfterNth {
			_, _ = bw.WriteString("nobody-1|0000|ok\n")
		}
		if n == f.cfg.GarbageAfterNth {
			_, _ = bw.WriteString("garbage\n")
		}
		if f.cfg.Hold > 1 {
			pending = append(pending, f.appendAnswer(nil, line))
			if len(pending) < f.cfg.Hold {
				continue
			}
			f.reordered.Add(1)
			for i := len(pending) - 1; i >= 0; i-- {
				_, _ = bw.Write(pending[i])
				answered++
			}
			pending = pending[:0]
		} else {
			// Built in bufio's own buffer, so the benchmark counts the
			// tool's allocations, not the fake's.
			_, _ = bw.Write(f.appendAnswer(bw.AvailableBuffer(), line))
			answered++
		}
		if f.cfg.CloseAfter > 0 && answered >= f.cfg.CloseAfter {
			_ = bw.Flush()
			return
		}
		if br.Buffered() == 0 {
			if bw.Flush() != nil {
				return
			}
		}
	}
}

// appendAnswer appends the answer line to one request line to b.
func (f *Relay) appendAnswer(b, line []byte) []byte {
	txid, rest, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte{'|'})
	target, _, _ := bytes.Cut(rest, []byte{'|'})
	if f.cfg.AnswerTxID != "" {
		b = append(b, f.cfg.AnswerTxID...)
	} else {
		b = append(b, txid...)
	}
	b = append(b, '|')
	if f.cfg.Code != nil {
		b = append(b, f.cfg.Code(string(target))...)
	} else {
		b = append(b, "0000"...)
	}
	return append(b, "|ok\n"...)
}
