package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/internal/loadgen"
	"github.com/relayhub/relayhub/relay/admin"
)

// defaultAdmin is the hub's admin port unless --admin-listen says
// otherwise, and --admin's default.
const defaultAdmin = "127.0.0.1:9280"

// maxAdminAnswerBytes bounds an admin answer read, so a wrong address
// serving something huge cannot exhaust memory.
const maxAdminAnswerBytes = 4 << 20

// AdminFlags are the flags of the commands that ask the hub's admin port
// (status, breaker, reload, in-doubt), embedded in each; filled by kong,
// not for concurrent use.
type AdminFlags struct {
	Admin     string        `help:"Hub admin address, host:port (or a base URL)." default:"127.0.0.1:9280" env:"RELAYCTL_ADMIN"`
	Timeout   time.Duration `help:"Limit on the whole request." default:"5s" env:"RELAYCTL_TIMEOUT"`
	Token     string        `name:"admin-token" help:"Bearer token of the admin port (the hub's --admin-token): breaker and reload need it whenever the hub has one, status and in-doubt only from beyond loopback. Prefer --admin-token-file or the environment variable: a flag shows in the process list." env:"RELAYCTL_ADMIN_TOKEN"`
	TokenFile string        `name:"admin-token-file" help:"File holding the bearer token of --admin-token, instead of that flag: the whole file is the token, one line, a trailing newline dropped. Refused when empty or when group or others have any access to it (chmod 600 it)." placeholder:"FILE" env:"RELAYCTL_ADMIN_TOKEN_FILE"`

	loadgen.TLSFlags `embed:"" envprefix:"RELAYCTL_"`
}

// validate checks what the tags cannot; the commands' Validate call it.
func (f *AdminFlags) validate() error {
	switch {
	case f.Timeout <= 0:
		return fmt.Errorf("--timeout %s: want more than 0", f.Timeout)
	case f.Token != "" && f.TokenFile != "":
		return errors.New("--admin-token and --admin-token-file: give one or the other")
	}
	return nil
}

// client reads the TLS and token files the flags name and returns the
// client of the admin port. Its errors end the command with status 2: the
// hub cannot be asked.
func (f *AdminFlags) client() (*adminClient, error) {
	tlsConfig, err := f.ClientConfig()
	if err != nil {
		return nil, cmdline.Exit(2, err)
	}
	base, err := adminBase(f.Admin, tlsConfig != nil)
	if err != nil {
		return nil, cmdline.Exit(2, err)
	}
	token := f.Token
	if f.TokenFile != "" {
		if token, err = admin.ReadTokenFile(f.TokenFile); err != nil {
			return nil, cmdline.Exit(2, fmt.Errorf("--admin-token-file: %w", err))
		}
	}
	a := &adminClient{base: base, token: token, timeout: f.Timeout}
	dialer := &net.Dialer{}
	a.http = &http.Client{Transport: &http.Transport{
		TLSClientConfig: tlsConfig,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			nc, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &sniffConn{Conn: nc, notHTTP: &a.notHTTP}, nil
		},
	}}
	return a, nil
}

// sniffConn is a connection to the admin port that keeps, in notHTTP,
// the first bytes the other end sends when they are no HTTP answer, so
// that an address that is not an admin port (the hub's line port given
// by mistake) is said to be that, rather than by net/http's "malformed
// HTTP status code". Used by one request at a time, as net/http does.
type sniffConn struct {
	net.Conn
	read    bool // the first bytes have been looked at
	notHTTP *atomic.Pointer[string]
}

// Read implements net.Conn.
func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.read && n > 0 {
		c.read = true
		const prefix = "HTTP/"
		if first := p[:n]; !bytes.HasPrefix(first, []byte(prefix[:min(n, len(prefix))])) {
			line, _, _ := bytes.Cut(first[:min(n, 80)], []byte("\n"))
			said := string(line)
			c.notHTTP.Store(&said)
		}
	}
	return n, err
}

// adminBase returns the admin port's base URL, without a final slash, from
// --admin, which is host:port or, for an admin port behind a proxy, a base
// URL; useTLS (--tls and its kin) makes host:port https, and refuses an
// http:// URL.
func adminBase(admin string, useTLS bool) (string, error) {
	switch {
	case strings.HasPrefix(admin, "http://") && useTLS:
		return "", fmt.Errorf("--admin %q: --tls wants https://", admin)
	case strings.HasPrefix(admin, "http://") || strings.HasPrefix(admin, "https://"):
		return strings.TrimSuffix(admin, "/"), nil
	case useTLS:
		return "https://" + admin, nil
	}
	return "http://" + admin, nil
}

// adminClient asks the hub's admin port for one command. It is safe for
// concurrent use.
type adminClient struct {
	base    string // without a final slash
	token   string // the bearer token; empty for none
	timeout time.Duration
	http    *http.Client
	// notHTTP is the first line of an answer that was no HTTP; nil
	// while every answer has been.
	notHTTP atomic.Pointer[string]
}

// adminAnswer is the admin port's answer to one request. A plain value.
type adminAnswer struct {
	method, url string // the request, for messages
	status      int
	statusText  string // "404 Not Found"
	body        []byte
}

// do sends method to path (with its query) on the admin port, with body as
// JSON when it is not nil, and returns the answer whatever its status. It
// fails with status 2 when the admin port cannot be reached or does not
// answer within the timeout.
func (a *adminClient) do(ctx context.Context, method, path string, body []byte) (adminAnswer, error) {
	ans := adminAnswer{method: method, url: a.base + path}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, ans.url, rd)
	if err != nil {
		return ans, cmdline.Exit(2, fmt.Errorf("--admin: %w", err))
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.http.Do(req)
	if err != nil {
		// *url.Error repeats the method and URL this message already has.
		if ue, ok := errors.AsType[*neturl.Error](err); ok {
			err = ue.Err
		}
		if said := a.notHTTP.Load(); said != nil {
			return ans, cmdline.Exit(2, fmt.Errorf("%s %s: the address does not speak HTTP (it answered %q): it is not the hub's admin port, which is the hub's --admin-listen, %s unless set", method, ans.url, *said, defaultAdmin))
		}
		if _, ok := errors.AsType[tls.RecordHeaderError](err); ok {
			return ans, cmdline.Exit(2, fmt.Errorf("%s %s: the address does not speak TLS: %w; is it the hub's admin port (its --admin-listen, %s unless set) and does it serve HTTPS?", method, ans.url, err, defaultAdmin))
		}
		return ans, cmdline.Exit(2, fmt.Errorf("%s %s: %w", method, ans.url, err))
	}
	defer resp.Body.Close()
	ans.status, ans.statusText = resp.StatusCode, resp.Status
	if ans.body, err = io.ReadAll(io.LimitReader(resp.Body, maxAdminAnswerBytes)); err != nil {
		return ans, cmdline.Exit(2, fmt.Errorf("%s %s: read body: %w", method, ans.url, err))
	}
	return ans, nil
}

// refused returns the error of an answer that is not what the command
// asked for, with the hub's reason: the "error" of its JSON body, or the
// body's first line; a 401 says how the token is given. It ends the
// command with status 1.
func (a *adminClient) refused(ans adminAnswer) error {
	reason := answerReason(ans.body)
	if ans.status == http.StatusUnauthorized {
		if a.token == "" {
			reason += ": give the hub's admin token with --admin-token-file (or RELAYCTL_ADMIN_TOKEN)"
		} else {
			reason += ": the hub did not take the token given"
		}
	}
	return cmdline.Exit(1, fmt.Errorf("%s %s: %s: %s", ans.method, ans.url, ans.statusText, reason))
}

// answerReason is what an admin answer says went wrong: the "error" of a
// JSON body, as the admin port answers its refusals, or else the body's
// first line, quoted.
func answerReason(body []byte) string {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return e.Error
	}
	return firstLine(body)
}

// writeRaw prints an admin answer's body as it is, with a final newline.
func writeRaw(w io.Writer, body []byte) error {
	if _, err := w.Write(body); err != nil {
		return err
	}
	if len(body) > 0 && body[len(body)-1] != '\n' {
		_, err := io.WriteString(w, "\n")
		return err
	}
	return nil
}
