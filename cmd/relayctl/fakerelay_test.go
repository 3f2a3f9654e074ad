package main

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

// fakeConfig sets how a fakeRelay misbehaves. The zero value answers every
// line at once, in order, with TXID|0000|ok.
type fakeConfig struct {
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

// fakeRelay is a tiny stand-in for the hub's client port, speaking the
// line protocol over loopback. It is safe for concurrent use.
type fakeRelay struct {
	cfg  fakeConfig
	ln   net.Listener
	addr string

	lines     atomic.Int64 // request lines read over all connections
	reordered atomic.Int64 // batches answered newest first

	mu    sync.Mutex
	conns map[net.Conn]bool // guarded by mu
	wg    conc.WaitGroup
}

func newFakeRelay(t testing.TB, cfg fakeConfig) *fakeRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &fakeRelay{cfg: cfg, ln: ln, addr: ln.Addr().String(), conns: make(map[net.Conn]bool)}
	f.wg.Go(f.acceptLoop)
	t.Cleanup(f.close)
	return f
}

func (f *fakeRelay) close() {
	_ = f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *fakeRelay) acceptLoop() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns[c] = true
		f.mu.Unlock()
		f.wg.Go(func() { f.serveConn(c) })
	}
}

func (f *fakeRelay) serveConn(c net.Conn) {
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
func (f *fakeRelay) appendAnswer(b, line []byte) []byte {
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
