package targethttp

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay/protocol"
)

// TestTargetCallTellsTheHubsOwnFaultsFromTheTargets fails the dial as Go's
// dialer does (a *net.OpError around the failed system call): the hub's own
// shortages give E906 "hub overloaded; not sent" with their fault, never
// E902, and are not tried again; the network's failures stay E902.
func TestTargetCallTellsTheHubsOwnFaultsFromTheTargets(t *testing.T) {
	for _, tt := range []struct {
		name      string
		syscall   string
		errno     syscall.Errno
		wantCode  string
		wantMsg   string
		wantFault HubFault
	}{
		{"descriptors of the process", "socket", syscall.EMFILE, "E906", hubOverloadedMsg, FaultDescriptors},
		{"descriptors of the system", "socket", syscall.ENFILE, "E906", hubOverloadedMsg, FaultDescriptors},
		{"buffer space", "connect", syscall.ENOBUFS, "E906", hubOverloadedMsg, FaultMemory},
		{"kernel memory", "socket", syscall.ENOMEM, "E906", hubOverloadedMsg, FaultMemory},
		{"ephemeral ports", "connect", syscall.EADDRNOTAVAIL, "E906", hubOverloadedMsg, FaultPorts},
		{"socket refused locally", "socket", syscall.EACCES, "E906", hubOverloadedMsg, FaultSocket},
		{"no route to the target", "connect", syscall.EHOSTUNREACH, "E902", msgUnreachable + suffixNotSent, NoHubFault},
		{"network down", "connect", syscall.ENETUNREACH, "E902", msgUnreachable + suffixNotSent, NoHubFault},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var dials atomic.Int32
			conns := NewConns(func(_ context.Context, network, _ string) (net.Conn, error) {
				dials.Add(1)
				return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError(tt.syscall, tt.errno)}
			})
			tg := testTargetWith(t, Config{URL: "http://127.0.0.1:9", Timeout: time.Second, Conns: conns})

			res := tg.Call([]byte("TX1"), []byte("DEP 1 5"))

			assert.Equal(t, tt.wantCode, res.Code)
			assert.Equal(t, tt.wantMsg, string(res.Msg))
			assert.Equal(t, tt.wantFault, res.Fault)
			if tt.wantFault != NoHubFault {
				assert.Equal(t, protocol.CodeUnavailable, res.Code)
			}
			assert.Equal(t, NotSent, res.Stage)
			assert.Equal(t, int32(1), dials.Load(), "not tried again")
			if tt.wantFault != NoHubFault {
				assert.ErrorIs(t, res.Err, tt.errno)
			}
		})
	}
}

// hubOverloadedMsg is the message of docs/PROTOCOL.md's E906 row.
const hubOverloadedMsg = "hub overloaded; not sent"

// failingWriteConn is a connection whose writes fail with err after
// writing n bytes of what they are given.
type failingWriteConn struct {
	net.Conn
	n   int
	err error
}

func (c *failingWriteConn) Write(p []byte) (int, error) {
	n := min(c.n, len(p))
	if n > 0 {
		if _, err := c.Conn.Write(p[:n]); err != nil {
			return 0, err
		}
	}
	return n, &net.OpError{Op: "write", Err: os.NewSyscallError("write", c.err)}
}

// TestTargetCallShortOfBuffersAfterTheConnect fails the request's write
// for want of buffer space: with nothing written it is the hub's fault
// (E906, not sent); once a byte went out the call is in doubt, whatever
// the cause, since the target may have the request.
func TestTargetCallShortOfBuffersAfterTheConnect(t *testing.T) {
	for _, tt := range []struct {
		name      string
		written   int
		wantCode  string
		wantMsg   string
		wantStage Stage
		wantFault HubFault
	}{
		{"nothing written", 0, "E906", hubOverloadedMsg, NotSent, FaultMemory},
		{"part written", 20, "E902", msgUnreachable + suffixInDoubt, PartlySent, NoHubFault},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
			}))
			t.Cleanup(srv.Close)
			var d net.Dialer
			conns := NewConns(func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := d.DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return &failingWriteConn{Conn: c, n: tt.written, err: syscall.ENOBUFS}, nil
			})
			tg := testTargetWith(t, Config{URL: srv.URL, Timeout: time.Second, Conns: conns})

			res := tg.Call([]byte("TX1"), []byte("DEP 1 5"))

			require.Equal(t, tt.wantCode, res.Code, string(res.Msg))
			assert.Equal(t, tt.wantMsg, string(res.Msg))
			assert.Equal(t, tt.wantStage, res.Stage)
			assert.Equal(t, tt.wantFault, res.Fault)
		})
	}
}

func TestHubFaultLabels(t *testing.T) {
	want := []string{"none", "descriptors", "memory", "ports", "socket"}
	require.Len(t, want, int(NumHubFaults))
	for f := range NumHubFaults {
		assert.Equal(t, want[f], f.String())
	}
}
