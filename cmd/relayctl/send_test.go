package main

import (
	"bufio"
	"bytes"
	"net"
	"strings"
	"testing"
	"time"

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
