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
	"strconv"
	"strings"
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
	Addr    string        `help:"Hub client address, host:port." default:"127.0.0.1:9200" env:"RELAYCTL_ADDR"`
	TxID    string        `name:"txid" help:"Transaction id, 1 to 64 of A-Z a-z 0-9 . _ : - (generated when empty)." env:"RELAYCTL_TXID"`
	Timeout time.Duration `help:"Limit on connecting, sending and waiting for the answer together." default:"5s" env:"RELAYCTL_TIMEOUT"`
	Target  string        `arg:"" help:"Target name, e.g. CORE."`
	Payload string        `arg:"" optional:"" help:"Payload, e.g. 'BAL ACC1' (may be empty)."`

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
	}
	return nil
}

// Run sends one transaction and prints the answer line. Exit status: 0 for
// 0000 or Bnnn, 1 for any other code or an answer that is not for this
// transaction, 2 when the hub cannot be reached or does not answer in time.
func (c *sendCmd) Run(ctx context.Context, s *streams) error {
	txid := c.TxID
	if txid == "" {
		txid = newTxID(time.Now())
	}
	tlsConfig, err := c.ClientConfig()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	answer, err := sendOne(ctx, c.Addr, tlsConfig, txid, c.Target, c.Payload)
	if err != nil {
		return cmdline.Exit(2, err)
	}
	fmt.Fprintln(s.Out, answer)
	a, err := protocol.ParseResponse([]byte(answer))
	switch {
	case err != nil:
		return cmdline.Exit(1, fmt.Errorf("malformed answer %q", answer))
	case string(a.TxID) != txid && string(a.TxID) != protocol.NoTxID:
		return cmdline.Exit(1, fmt.Errorf("answer is for TXID %q, not %q", a.TxID, txid))
	case !loadgen.CodeSucceeded(a.Code):
		return cmdline.Exit(1, nil)
	}
	return nil
}

// newTxID returns a TXID for a single send: the time in milliseconds (base
// 36) and 32 random bits, so two operators sending in the same millisecond
// still get distinct ids in the hub's logs.
func newTxID(now time.Time) string {
	var r [4]byte
	_, _ = rand.Read(r[:]) // crypto/rand.Read never fails on supported platforms.
	return "ctl-" + strconv.FormatInt(now.UnixMilli(), 36) + "-" + hex.EncodeToString(r[:])
}

// sendOne writes one request line to the hub at addr, over TLS when
// tlsConfig is set, and returns the first answer line, without its line
// ending. ctx bounds the whole exchange, the handshake included.
// Each request opens its own connection, so the first answer is this
// request's: the hub answers "-" instead of the TXID only when it could not
// read one, or before reading at all (too many connections).
func sendOne(ctx context.Context, addr string, tlsConfig *tls.Config, txid, target, payload string) (string, error) {
	var (
		d   net.Dialer
		nc  net.Conn
		err error
	)
	if tlsConfig != nil {
		nc, err = (&tls.Dialer{NetDialer: &d, Config: tlsConfig}).DialContext(ctx, "tcp", addr)
	} else {
		nc, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return "", fmt.Errorf("connect %s: %w", addr, err)
	}
	defer nc.Close()
	if deadline, ok := ctx.Deadline(); ok {
		if err := nc.SetDeadline(deadline); err != nil {
			return "", fmt.Errorf("set deadline: %w", err)
		}
	}
	// Interrupting the exchange (Ctrl-C) closes the socket, ending a
	// blocked read at once rather than at the deadline.
	defer context.AfterFunc(ctx, func() { _ = nc.Close() })()

	line := txid + "|" + target + "|" + payload + "\n"
	if _, err := io.WriteString(nc, line); err != nil {
		return "", exchangeError(ctx, addr, "send to", err)
	}
	answer, err := bufio.NewReaderSize(nc, answerBufferSize).ReadString('\n')
	if err != nil {
		if errors.Is(err, io.EOF) && answer == "" {
			return "", fmt.Errorf("read from %s: connection closed without an answer", addr)
		}
		return "", exchangeError(ctx, addr, "read from", err)
	}
	return strings.TrimSuffix(strings.TrimSuffix(answer, "\n"), "\r"), nil
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
