package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/internal/loadgen"
	"github.com/relayhub/relayhub/relay/protocol"
)

// answerBufferSize bounds the answer line send accepts: the hub's own
// lines are far shorter.
const answerBufferSize = 64 << 10

// sendCmd is `relayctl send`: its flags, filled by kong. Not for
// concurrent use.
type sendCmd struct {
	Addr        string        `help:"Hub client address, host:port." default:"127.0.0.1:9200" env:"RELAYCTL_ADDR"`
	TxID        string        `name:"txid" help:"Transaction id, 1 to 64 of A-Z a-z 0-9 . _ : - (generated when empty)." env:"RELAYCTL_TXID"`
	Timeout     time.Duration `help:"Limit on connecting, sending and waiting for the answer together, for each try." default:"5s" env:"RELAYCTL_TIMEOUT"`
	ResendOn    []string      `name:"resend-on" placeholder:"CODE" help:"Resend the same line, same TXID, while the answer's code is one of these (repeatable or a comma list, e.g. E901); only to a hub that answers a repeated TXID without a second call." env:"RELAYCTL_RESEND_ON"`
	ResendAfter time.Duration `help:"With --resend-on: the wait before each resend." default:"1s" env:"RELAYCTL_RESEND_AFTER"`
	ResendMax   int           `help:"With --resend-on: the most resends, after the first try." default:"5" env:"RELAYCTL_RESEND_MAX"`
	Target      string        `arg:"" help:"Target name, e.g. CORE."`
	Payload     string        `arg:"" optional:"" help:"Payload, e.g. 'BAL ACC1' (may be empty)."`

	loadgen.TLSFlags `embed:"" envprefix:"RELAYCTL_"`
}

// Validate checks what the tags cannot.
func (c *sendCmd) Validate() error {
	switch {
	case c.TxID != "" && !protocol.ValidTxID([]byte(c.TxID)):
		return fmt.Errorf("--txid %q: want 1 to %d characters of A-Z a-z 0-9 . _ : -", c.TxID, protocol.MaxTxIDLen)
	case c.Target != "" && !loadgen.ValidTarget(c.Target): // kong reports a missing one
		return fmt.Errorf("target %q: want a name without '|', spaces or control characters", c.Target)
	case !loadgen.ValidPayload(c.Payload):
		return errors.New("payload: must not contain a line break")
	case c.Timeout <= 0:
		return fmt.Errorf("--timeout %s: want more than 0", c.Timeout)
	case c.ResendAfter < 0:
		return fmt.Errorf("--resend-after %s: want 0 or more", c.ResendAfter)
	case c.ResendMax < 1:
		return fmt.Errorf("--resend-max %d: want 1 or more", c.ResendMax)
	}
	_, err := c.resendCodes()
	return err
}

// resendCodes returns the --resend-on codes in canonical form (upper case,
// spaces trimmed). Only Ennn codes are accepted: 0000 and Bnnn are the
// target's final word, and resending after them would ask for the
// transaction twice.
func (c *sendCmd) resendCodes() ([]string, error) {
	codes := make([]string, 0, len(c.ResendOn))
	for _, s := range c.ResendOn {
		code := strings.ToUpper(strings.TrimSpace(s))
		if len(code) != 4 || code[0] != 'E' || !protocol.ValidTargetCode(code) {
			return nil, fmt.Errorf("--resend-on %q: want an error code E000 to E999, such as E901", s)
		}
		codes = append(codes, code)
	}
	return codes, nil
}

// Run sends one transaction and prints the answer line. With --resend-on
// it sends the same line again, after --resend-after, while the answer's
// code is one of those, at most --resend-max times, and prints each answer
// as "try N: " and the line. Exit status, from the last answer: 0 for
// 0000 or Bnnn, 1 for any other code or an answer that is not for this
// transaction, 2 when the hub cannot be reached or does not answer in time.
func (c *sendCmd) Run(ctx context.Context, s *streams) error {
	// Picked once: a resend carries the same TXID, which is how the hub
	// knows it for the first call's.
	txid := c.TxID
	if txid == "" {
		txid = newTxID(time.Now())
	}
	resendOn, err := c.resendCodes()
	if err != nil {
		return err
	}
	tlsConfig, err := c.ClientConfig()
	if err != nil {
		return err
	}
	hc := &hubConn{addr: c.Addr, tlsConfig: tlsConfig}
	defer hc.close()
	line := txid + "|" + c.Target + "|" + c.Payload + "\n"
	for try := 1; ; try++ {
		answer, err := c.try(ctx, hc, line)
		if err != nil {
			if len(resendOn) > 0 {
				err = fmt.Errorf("try %d: %w", try, err)
			}
			return cmdline.Exit(2, err)
		}
		if len(resendOn) > 0 {
			fmt.Fprintf(s.Out, "try %d: %s\n", try, answer)
		} else {
			fmt.Fprintln(s.Out, answer)
		}
		a, err := protocol.ParseResponse([]byte(answer))
		switch {
		case err != nil:
			return cmdline.Exit(1, fmt.Errorf("malformed answer %q", answer))
		case string(a.TxID) != txid && string(a.TxID) != protocol.NoTxID:
			return cmdline.Exit(1, fmt.Errorf("answer is for TXID %q, not %q", a.TxID, txid))
		case !slices.Contains(resendOn, string(a.Code)):
			if !loadgen.CodeSucceeded(a.Code) {
				return cmdline.Exit(1, nil)
			}
			return nil
		case try > c.ResendMax:
			return cmdline.Exit(1, fmt.Errorf("still %s after %d resends", a.Code, c.ResendMax))
		}
		if err := wait(ctx, c.ResendAfter); err != nil {
			return cmdline.Exit(1, fmt.Errorf("interrupted before try %d: %w", try+1, err))
		}
	}
}

// try is one exchange, bounded by --timeout.
func (c *sendCmd) try(ctx context.Context, hc *hubConn, line string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	return hc.exchange(ctx, line)
}

// wait waits d, or until ctx is done.
func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newTxID returns a TXID for a single send: the time in milliseconds (base
// 36) and 32 random bits, so two operators sending in the same millisecond
// still get distinct ids in the hub's logs.
func newTxID(now time.Time) string {
	var r [4]byte
	_, _ = rand.Read(r[:]) // crypto/rand.Read never fails on supported platforms.
	return "ctl-" + strconv.FormatInt(now.UnixMilli(), 36) + "-" + hex.EncodeToString(r[:])
}

// hubConn is send's connection to the hub at addr, over TLS when tlsConfig
// is set. It stays open between tries, so a resend follows the first line
// on the same connection. Not for concurrent use.
type hubConn struct {
	addr      string
	tlsConfig *tls.Config

	nc net.Conn // nil until dialled, and after close
	br *bufio.Reader
}

// exchange writes line and returns the next answer line, without its line
// ending, dialling first when no connection is open. ctx bounds the whole
// exchange, the handshake included. The first answer on a new connection
// is this line's: the hub answers "-" instead of the TXID only when it
// could not read one, or before reading at all (too many connections).
//
// A connection kept from an earlier try may have been closed by the hub
// since (a drain, the idle timeout). When it ends without a byte of
// answer, the line is written once more on a new connection: the hub
// answers every line it has read before it closes, so that one went unread.
func (h *hubConn) exchange(ctx context.Context, line string) (string, error) {
	reused := h.nc != nil
	answer, unanswered, err := h.exchangeOnce(ctx, line)
	if err != nil && reused && unanswered && ctx.Err() == nil {
		h.close()
		answer, _, err = h.exchangeOnce(ctx, line)
	}
	if err != nil {
		h.close()
	}
	return answer, err
}

// exchangeOnce is exchange without the second chance. unanswered reports
// that the connection was found closed or reset before any byte of an
// answer came.
func (h *hubConn) exchangeOnce(ctx context.Context, line string) (answer string, unanswered bool, err error) {
	if h.nc == nil {
		if err := h.dial(ctx); err != nil {
			return "", false, err
		}
	}
	deadline, _ := ctx.Deadline() // zero, no deadline, when ctx has none
	if err := h.nc.SetDeadline(deadline); err != nil {
		return "", false, fmt.Errorf("set deadline: %w", err)
	}
	// Interrupting the exchange (Ctrl-C) closes the socket, ending a
	// blocked read at once rather than at the deadline.
	nc := h.nc
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	defer func() {
		if !stop() {
			h.close() // closed under us: a next try needs a new connection
		}
	}()

	if _, err := io.WriteString(nc, line); err != nil {
		return "", isReset(err), exchangeError(ctx, h.addr, "send to", err)
	}
	answer, err = h.br.ReadString('\n')
	switch {
	case err == nil:
		return strings.TrimSuffix(strings.TrimSuffix(answer, "\n"), "\r"), false, nil
	case errors.Is(err, io.EOF) && answer == "":
		return "", true, fmt.Errorf("read from %s: connection closed without an answer", h.addr)
	default:
		return "", answer == "" && isReset(err), exchangeError(ctx, h.addr, "read from", err)
	}
}

func (h *hubConn) dial(ctx context.Context) error {
	var (
		d   net.Dialer
		nc  net.Conn
		err error
	)
	if h.tlsConfig != nil {
		nc, err = (&tls.Dialer{NetDialer: &d, Config: h.tlsConfig}).DialContext(ctx, "tcp", h.addr)
	} else {
		nc, err = d.DialContext(ctx, "tcp", h.addr)
	}
	if err != nil {
		return fmt.Errorf("connect %s: %w", h.addr, err)
	}
	h.nc, h.br = nc, bufio.NewReaderSize(nc, answerBufferSize)
	return nil
}

// close closes the connection, if one is open.
func (h *hubConn) close() {
	if h.nc != nil {
		_ = h.nc.Close()
		h.nc, h.br = nil, nil
	}
}

// isReset reports whether err is the hub's side of the connection gone:
// reset, or closed under a write.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// exchangeError names a timeout as such: a hub that does not answer within
// --timeout is the operator's question, not the socket error behind it.
func exchangeError(ctx context.Context, addr, op string, err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%s %s: no answer before the timeout", op, addr)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%s %s: %w", op, addr, ctx.Err())
	}
	return fmt.Errorf("%s %s: %w", op, addr, err)
}
