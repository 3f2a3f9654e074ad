package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sourcegraph/conc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/internal/testutil/fakerelay"
	"github.com/relayhub/relayhub/relay/protocol"
)

func runSend(t *testing.T, c sendCmd) (stdout string, code int, err error) {
	t.Helper()
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Second
	}
	if c.ResendMax == 0 {
		c.ResendMax = 5
	}
	require.NoError(t, c.Validate())
	var out, errOut bytes.Buffer
	err = c.Run(t.Context(), &streams{Out: &out, Err: &errOut})
	return out.String(), cmdline.Code(err), err
}

func TestSendExitStatus(t *testing.T) {
	f := fakerelay.New(t, fakerelay.Config{Code: func(target string) string {
		switch target {
		case "BIZ":
			return "B201"
		case "OPEN":
			return "E904"
		case "DOWN":
			return "E902"
		case "NOPE":
			return "E903"
		}
		return "0000"
	}})
	tests := []struct {
		target string
		code   string
		want   int
	}{
		{"CORE", "0000", 0},
		{"BIZ", "B201", 0},
		{"OPEN", "E904", 1},
		{"DOWN", "E902", 1},
		{"NOPE", "E903", 1},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			out, code, _ := runSend(t, sendCmd{Addr: f.Addr, TxID: "T-1", Target: tt.target, Payload: "BAL ACC1"})
			assert.Equal(t, "T-1|"+tt.code+"|ok\n", out, "the answer line is printed as it came")
			assert.Equal(t, tt.want, code)
		})
	}
}

func TestSendWritesOneRequestLine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		line, _ := bufio.NewReader(c).ReadString('\n')
		got <- line
		txid, _, _ := strings.Cut(line, "|")
		_, _ = c.Write([]byte(txid + "|0000|balance=100000\n"))
	}()

	out, code, err := runSend(t, sendCmd{Addr: ln.Addr().String(), Target: "core", Payload: "XFER A|B 10"})

	require.NoError(t, err)
	assert.Equal(t, 0, code)
	line := <-got
	txid, rest, _ := strings.Cut(line, "|")
	assert.True(t, protocol.ValidTxID([]byte(txid)), "generated TXID %q", txid)
	assert.Equal(t, "core|XFER A|B 10\n", rest, "target and payload go out byte for byte")
	assert.Equal(t, txid+"|0000|balance=100000\n", out)
}

func TestSendAnswerForAnotherTxID(t *testing.T) {
	f := fakerelay.New(t, fakerelay.Config{AnswerTxID: "OTHER"})
	out, code, err := runSend(t, sendCmd{Addr: f.Addr, TxID: "T-1", Target: "CORE"})
	assert.Equal(t, 1, code)
	assert.ErrorContains(t, err, `"OTHER"`)
	assert.Equal(t, "OTHER|0000|ok\n", out)
}

func TestSendDashAnswerIsOurs(t *testing.T) {
	// The hub answers "-" when it refuses a connection before reading it.
	f := fakerelay.New(t, fakerelay.Config{AnswerTxID: "-", Code: func(string) string { return "E906" }})
	out, code, _ := runSend(t, sendCmd{Addr: f.Addr, TxID: "T-1", Target: "CORE"})
	assert.Equal(t, 1, code)
	assert.Equal(t, "-|E906|ok\n", out)
}

func TestSendConnectionProblems(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := closed.Addr().String()
	require.NoError(t, closed.Close())
	silent := fakerelay.New(t, fakerelay.Config{Silent: true})

	tests := []struct {
		name    string
		addr    string
		timeout time.Duration
		wantErr string
	}{
		{"refused", closedAddr, 5 * time.Second, "connect " + closedAddr},
		{"no answer in time", silent.Addr, 100 * time.Millisecond, "no answer before the timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, code, err := runSend(t, sendCmd{Addr: tt.addr, Target: "CORE", Timeout: tt.timeout})
			assert.Equal(t, 2, code)
			assert.ErrorContains(t, err, tt.wantErr)
			assert.Empty(t, out)
		})
	}
}

func TestSendHubClosesWithoutAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = bufio.NewReader(c).ReadString('\n')
			_ = c.Close()
		}
	}()

	out, code, err := runSend(t, sendCmd{Addr: ln.Addr().String(), Target: "CORE"})

	assert.Equal(t, 2, code)
	assert.ErrorContains(t, err, "connection closed without an answer")
	assert.Empty(t, out)
}

func TestSendValidate(t *testing.T) {
	tests := []struct {
		name    string
		cmd     sendCmd
		wantErr string
	}{
		{"bad txid", sendCmd{TxID: "a b", Target: "CORE", Timeout: time.Second}, "--txid"},
		{"long txid", sendCmd{TxID: strings.Repeat("x", 65), Target: "CORE", Timeout: time.Second}, "--txid"},
		{"bad target", sendCmd{Target: "CO|RE", Timeout: time.Second}, "target"},
		{"line break in payload", sendCmd{Target: "CORE", Payload: "A\nB", Timeout: time.Second}, "line break"},
		{"zero timeout", sendCmd{Target: "CORE"}, "--timeout"},
		{"resend-on not a code", sendCmd{Target: "CORE", Timeout: time.Second, ResendMax: 5, ResendOn: []string{"E9"}}, `--resend-on "E9"`},
		{"resend-on a success", sendCmd{Target: "CORE", Timeout: time.Second, ResendMax: 5, ResendOn: []string{"E901", "0000"}}, `--resend-on "0000"`},
		{"resend-on a business answer", sendCmd{Target: "CORE", Timeout: time.Second, ResendMax: 5, ResendOn: []string{"B201"}}, `--resend-on "B201"`},
		{"negative resend-after", sendCmd{Target: "CORE", Timeout: time.Second, ResendMax: 5, ResendAfter: -time.Second}, "--resend-after"},
		{"zero resend-max", sendCmd{Target: "CORE", Timeout: time.Second}, "--resend-max"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.ErrorContains(t, tt.cmd.Validate(), tt.wantErr)
		})
	}
}

func TestNewTxIDIsValidAndDistinct(t *testing.T) {
	now := time.Date(2026, 11, 30, 5, 31, 19, 0, time.UTC)
	a, b := newTxID(now), newTxID(now)
	assert.True(t, protocol.ValidTxID([]byte(a)), a)
	assert.NotEqual(t, a, b, "two ids in the same millisecond")
}

// scriptedHub stands in for the hub's client port: it answers the request
// lines it reads with the codes of its script in turn, the last one over
// and over once the script runs out, and records every line.
type scriptedHub struct {
	addr string

	codes     []string
	closeEach bool // close each connection after its first answer

	mu    sync.Mutex
	lines []string // guarded by mu
	conns int      // guarded by mu
}

func newScriptedHub(t *testing.T, closeEach bool, codes ...string) *scriptedHub {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	h := &scriptedHub{addr: ln.Addr().String(), codes: codes, closeEach: closeEach}
	var wg conc.WaitGroup
	var mu sync.Mutex
	var open []net.Conn // guarded by mu
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Go(func() { h.serveConn(c) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return h
}

func (h *scriptedHub) serveConn(c net.Conn) {
	defer c.Close()
	h.mu.Lock()
	h.conns++
	h.mu.Unlock()
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		h.mu.Lock()
		h.lines = append(h.lines, line)
		code := h.codes[min(len(h.lines), len(h.codes))-1]
		h.mu.Unlock()
		txid, _, _ := strings.Cut(line, "|")
		if _, err := c.Write([]byte(txid + "|" + code + "|answer " + code + "\n")); err != nil || h.closeEach {
			return
		}
	}
}

// seen returns the lines read so far and the connections accepted.
func (h *scriptedHub) seen() ([]string, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.lines...), h.conns
}

func TestSendResend(t *testing.T) {
	tests := []struct {
		name      string
		codes     []string
		resendOn  []string
		resendMax int
		closeEach bool
		wantCodes []string // of the answers printed, one per try
		wantConns int
		wantExit  int
		wantErr   string
	}{
		{
			name:  "E901 twice, then 0000",
			codes: []string{"E901", "E901", "0000"}, resendOn: []string{"E901"},
			wantCodes: []string{"E901", "E901", "0000"}, wantConns: 1, wantExit: 0,
		},
		{
			name:  "always E901: gives up after --resend-max",
			codes: []string{"E901"}, resendOn: []string{"E901"}, resendMax: 3,
			wantCodes: []string{"E901", "E901", "E901", "E901"}, wantConns: 1, wantExit: 1,
			wantErr: "still E901 after 3 resends",
		},
		{
			name:  "a code not resent on ends it and decides the exit",
			codes: []string{"E901", "E902", "0000"}, resendOn: []string{"e901"},
			wantCodes: []string{"E901", "E902"}, wantConns: 1, wantExit: 1,
		},
		{
			name:  "Bnnn after a resend exits 0",
			codes: []string{"E905", "E901", "B201"}, resendOn: []string{"E901", "E905"},
			wantCodes: []string{"E905", "E901", "B201"}, wantConns: 1, wantExit: 0,
		},
		{
			name:  "a hub that closed the connection gets the resend on a new one",
			codes: []string{"E901", "E901", "0000"}, resendOn: []string{"E901"}, closeEach: true,
			wantCodes: []string{"E901", "E901", "0000"}, wantConns: 3, wantExit: 0,
		},
		{
			name:      "without --resend-on, one try and the plain answer line",
			codes:     []string{"E901", "0000"},
			wantCodes: []string{"E901"}, wantConns: 1, wantExit: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hub := newScriptedHub(t, tt.closeEach, tt.codes...)

			// The TXID is left to send to pick, so that a resend must keep
			// the generated one.
			out, code, err := runSend(t, sendCmd{Addr: hub.addr, Target: "CORE", Payload: "XFER 1001 2002 500",
				ResendOn: tt.resendOn, ResendMax: tt.resendMax})

			assert.Equal(t, tt.wantExit, code, err)
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
			}
			lines, conns := hub.seen()
			require.Len(t, lines, len(tt.wantCodes), "one request line per try")
			txid, rest, _ := strings.Cut(lines[0], "|")
			require.True(t, protocol.ValidTxID([]byte(txid)), "generated TXID %q", txid)
			assert.Equal(t, "CORE|XFER 1001 2002 500\n", rest)
			for i, l := range lines {
				assert.Equal(t, lines[0], l, "try %d sends the first line byte for byte", i+1)
			}
			assert.Equal(t, tt.wantConns, conns)
			var want strings.Builder
			for i, c := range tt.wantCodes {
				if len(tt.resendOn) > 0 {
					fmt.Fprintf(&want, "try %d: ", i+1)
				}
				want.WriteString(txid + "|" + c + "|answer " + c + "\n")
			}
			assert.Equal(t, want.String(), out)
		})
	}
}

func TestSendResendWaitsBetweenTries(t *testing.T) {
	hub := newScriptedHub(t, false, "E901", "E901", "0000")
	start := time.Now()
	_, code, err := runSend(t, sendCmd{Addr: hub.addr, TxID: "T-1", Target: "CORE",
		ResendOn: []string{"E901"}, ResendAfter: 50 * time.Millisecond})
	assert.Equal(t, 0, code, err)
	assert.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "two waits of --resend-after")
}

// cancelOnWrite cancels a context once something is written to it.
type cancelOnWrite struct {
	bytes.Buffer
	cancel context.CancelFunc
}

func (w *cancelOnWrite) Write(p []byte) (int, error) {
	defer w.cancel()
	return w.Buffer.Write(p)
}

func TestSendResendInterruptedWhileWaiting(t *testing.T) {
	hub := newScriptedHub(t, false, "E901", "0000")
	c := sendCmd{Addr: hub.addr, TxID: "T-1", Target: "CORE", Timeout: 5 * time.Second,
		ResendOn: []string{"E901"}, ResendAfter: time.Minute, ResendMax: 5}
	require.NoError(t, c.Validate())
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// Given the first answer printed, when the operator interrupts (the
	// write cancels), then send stops waiting at once without a resend.
	out := &cancelOnWrite{cancel: cancel}
	err := c.Run(ctx, &streams{Out: out, Err: &bytes.Buffer{}})

	assert.Equal(t, 1, cmdline.Code(err), "decided by the last answer, E901")
	assert.ErrorContains(t, err, "interrupted before try 2")
	assert.True(t, errors.Is(err, context.Canceled), err)
	assert.Equal(t, "try 1: T-1|E901|answer E901\n", out.String())
	lines, _ := hub.seen()
	assert.Len(t, lines, 1)
}

func TestSendResendHubGoneExits2(t *testing.T) {
	// A hub that answers E901 and then goes away: the resend finds no hub.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		_ = ln.Close()
		if err != nil {
			return
		}
		defer c.Close()
		line, _ := bufio.NewReader(c).ReadString('\n')
		txid, _, _ := strings.Cut(line, "|")
		_, _ = c.Write([]byte(txid + "|E901|no answer within target timeout; outcome unknown\n"))
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })

	out, code, err := runSend(t, sendCmd{Addr: ln.Addr().String(), TxID: "T-1", Target: "CORE", ResendOn: []string{"E901"}})

	assert.Equal(t, 2, code)
	assert.ErrorContains(t, err, "try 2: connect "+ln.Addr().String())
	assert.Equal(t, "try 1: T-1|E901|no answer within target timeout; outcome unknown\n", out)
}
