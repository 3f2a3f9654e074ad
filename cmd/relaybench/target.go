package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// targetCmd is `relaybench target`: a raw keep-alive HTTP/1.1 target that
// answers every POST /tx with a fixed 0000, in a few microseconds, so that
// what a benchmark measures in front of it is the proxy's cost, not the
// target's. Its flags are filled by kong; not for concurrent use.
type targetCmd struct {
	Listen string `help:"Address to listen on, host:port (port 0 picks a free one)." default:"127.0.0.1:0" env:"RELAYBENCH_LISTEN"`
}

// Run listens, logs the address as one JSON line on the error stream (the
// line scripts/lib.sh's wait_addr reads) and serves until the context ends.
func (c *targetCmd) Run(ctx context.Context, s *streams) error {
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", c.Listen, err)
	}
	fmt.Fprintf(s.Err, "{\"level\":\"info\",\"addr\":%q,\"version\":%q,\"message\":\"listening\"}\n", ln.Addr().String(), version)
	t := &rawTarget{}
	stop := context.AfterFunc(ctx, t.Close)
	defer stop()
	if err := t.Serve(ln); !errors.Is(err, errTargetClosed) {
		return err
	}
	return nil
}

// errTargetClosed is returned by rawTarget.Serve after Close.
var errTargetClosed = errors.New("relaybench: target closed")

// targetAnswer is the whole HTTP answer to a POST /tx: a healthy target's
// 0000 (docs/PROTOCOL.md, "Target protocol"), with a Content-Length so the
// connection stays open.
var targetAnswer = httpAnswer("200 OK", false, "application/json", `{"code":"0000","message":"raw ok"}`)

// targetNotFound answers any other method or path.
var targetNotFound = httpAnswer("404 Not Found", false, "text/plain", "not found\n")

// targetBadRequest answers a request it cannot read; the connection is
// then closed.
var targetBadRequest = httpAnswer("400 Bad Request", true, "text/plain", "bad request\n")

// httpAnswer builds a whole HTTP/1.1 answer, built once so that serving
// one costs a copy.
func httpAnswer(status string, closeConn bool, contentType, body string) []byte {
	s := "HTTP/1.1 " + status + "\r\nContent-Type: " + contentType + "\r\n"
	if closeConn {
		s += "Connection: close\r\n"
	}
	return []byte(s + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}

// Limits of one request the raw target reads: it is a benchmark peer, not
// a general server.
const (
	targetMaxHeaderBytes = 16 << 10
	targetMaxBodyBytes   = 1 << 20
	targetIdleTimeout    = 5 * time.Minute
)

// rawTarget serves the raw target on listeners: one goroutine per
// connection, requests read from a buffered reader and answers appended to
// one write buffer that is written when no pipelined request is waiting, so
// a closed loop costs one read and one write per request. It is safe for
// concurrent use; the zero value is ready.
type rawTarget struct {
	mu      sync.Mutex
	lns     map[net.Listener]struct{} // guarded by mu
	conns   map[net.Conn]struct{}     // guarded by mu
	closed  bool                      // guarded by mu
	serving sync.WaitGroup            // owns each connection's serveConn
}

// Serve accepts connections on ln until Close, then returns
// errTargetClosed; any other accept error ends it too.
func (t *rawTarget) Serve(ln net.Listener) error {
	if !t.track(ln, nil) {
		ln.Close()
		return errTargetClosed
	}
	defer t.untrack(ln, nil)
	for {
		c, err := ln.Accept()
		if err != nil {
			if t.isClosed() {
				return errTargetClosed
			}
			return err
		}
		if !t.track(nil, c) {
			c.Close()
			return errTargetClosed
		}
		t.serving.Add(1)
		go t.serveConn(c)
	}
}

// Close stops every listener and connection and waits for the connections'
// goroutines.
func (t *rawTarget) Close() {
	t.mu.Lock()
	t.closed = true
	for ln := range t.lns {
		ln.Close()
	}
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.serving.Wait()
}

func (t *rawTarget) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// track records a listener or a connection; false once closed.
func (t *rawTarget) track(ln net.Listener, c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	if ln != nil {
		if t.lns == nil {
			t.lns = make(map[net.Listener]struct{})
		}
		t.lns[ln] = struct{}{}
	}
	if c != nil {
		if t.conns == nil {
			t.conns = make(map[net.Conn]struct{})
		}
		t.conns[c] = struct{}{}
	}
	return true
}

func (t *rawTarget) untrack(ln net.Listener, c net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.lns, ln)
	delete(t.conns, c)
}

// serveConn answers the requests of one connection, in order, until the
// peer closes it, asks for close, or sends what it cannot read.
func (t *rawTarget) serveConn(c net.Conn) {
	defer t.serving.Done()
	defer t.untrack(nil, c)
	defer c.Close()
	br := bufio.NewReaderSize(c, 4096)
	out := make([]byte, 0, 4096)
	for {
		if br.Buffered() == 0 {
			c.SetReadDeadline(time.Now().Add(targetIdleTimeout))
		}
		answer, keep, err := readTargetRequest(br)
		if err != nil && answer == nil {
			return // closed, reset or idle: nothing to answer
		}
		out = append(out, answer...)
		if !keep || br.Buffered() == 0 {
			if _, werr := c.Write(out); werr != nil {
				return
			}
			out = out[:0]
		}
		if !keep {
			return
		}
	}
}

// readTargetRequest reads one HTTP/1.1 request from br, body included, and
// returns the answer to it and whether the connection may carry another.
// A nil answer with an error means the connection ended between requests.
func readTargetRequest(br *bufio.Reader) (answer []byte, keep bool, err error) {
	line, err := readHeadLine(br)
	if err != nil {
		return nil, false, err
	}
	method, rest, ok1 := bytes.Cut(line, []byte(" "))
	path, proto, ok2 := bytes.Cut(rest, []byte(" "))
	if !ok1 || !ok2 || !bytes.HasPrefix(proto, []byte("HTTP/1.")) {
		return targetBadRequest, false, errors.New("bad request line")
	}
	keep = string(proto) == "HTTP/1.1"
	isTx := string(method) == "POST" && string(path) == "/tx" // line is reused by the next read
	length := 0
	head := len(line)
	for {
		h, err := readHeadLine(br)
		if err != nil {
			return targetBadRequest, false, err
		}
		if len(h) == 0 {
			break
		}
		if head += len(h); head > targetMaxHeaderBytes {
			return targetBadRequest, false, errors.New("header too large")
		}
		name, value, ok := bytes.Cut(h, []byte(":"))
		if !ok {
			return targetBadRequest, false, errors.New("bad header line")
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			n, err := strconv.Atoi(string(value))
			if err != nil || n < 0 || n > targetMaxBodyBytes {
				return targetBadRequest, false, errors.New("bad Content-Length")
			}
			length = n
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			return targetBadRequest, false, errors.New("chunked bodies are not read")
		case bytes.EqualFold(name, []byte("Connection")):
			if bytes.EqualFold(value, []byte("close")) {
				keep = false
			} else if bytes.EqualFold(value, []byte("keep-alive")) {
				keep = true
			}
		}
	}
	if _, err := br.Discard(length); err != nil {
		return nil, false, err
	}
	if !isTx {
		return targetNotFound, keep, nil
	}
	return targetAnswer, keep, nil
}

// readHeadLine returns one line of a request's head without its CRLF; the
// slice is valid until the next read.
func readHeadLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errors.New("header line too long")
		}
		if len(line) > 0 && errors.Is(err, io.EOF) {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = bytes.TrimSuffix(line[:len(line)-1], []byte("\r"))
	return line, nil
}
