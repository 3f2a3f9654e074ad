package targethttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// DefaultStatusTimeout is the zero value's meaning of StatusConfig.Timeout.
const DefaultStatusTimeout = 5 * time.Second

// Outcome is what a target said about one transaction when asked whether
// it applied it.
type Outcome string

// Outcomes.
const (
	// Applied: the target says it applied the transaction; the Answer is
	// the answer it gave (a Bnnn answer means it was processed and
	// rejected).
	Applied Outcome = "applied"
	// NotApplied: the target says it never applied the transaction.
	NotApplied Outcome = "not_applied"
	// Unknown: the target could not be asked, or answered something that
	// is not a look-up answer for this transaction.
	Unknown Outcome = "unknown"
)

// Answer is a target's recorded answer to a transaction. A plain value.
type Answer struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// StatusConfig configures a StatusClient. The zero value is usable.
type StatusConfig struct {
	// Client makes the look-ups. Nil means a client with its own transport
	// and no TLS settings beyond the system's roots.
	Client *http.Client
	// Timeout bounds each look-up. Zero means DefaultStatusTimeout.
	Timeout time.Duration
}

// StatusClient asks a target whether it applied a transaction, by GET of
// the target's look-up URL (docs/PROTOCOL.md, "Resending a transaction").
// It is safe for concurrent use.
type StatusClient struct{ sideHTTP }

// NewStatusClient returns a StatusClient configured by cfg.
func NewStatusClient(cfg StatusConfig) *StatusClient {
	return &StatusClient{newSideHTTP(cfg)}
}

// sideHTTP is what a look-up or a reversal is made with, beside the
// target's calls: an HTTP client and the timeout of one request.
type sideHTTP struct {
	client  *http.Client
	timeout time.Duration
}

// newSideHTTP returns cfg's client and timeout, or their defaults.
func newSideHTTP(cfg StatusConfig) sideHTTP {
	h := sideHTTP{client: cfg.Client, timeout: cfg.Timeout}
	if h.client == nil {
		h.client = &http.Client{Transport: &http.Transport{}}
	}
	if h.timeout <= 0 {
		h.timeout = DefaultStatusTimeout
	}
	return h
}

// do sends req; its error leaves out what *url.Error repeats of the
// method and URL, which the caller's message already has.
func (h sideHTTP) do(req *http.Request) (*http.Response, error) {
	resp, err := h.client.Do(req)
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err
	}
	return resp, err
}

// statusAnswer is the body of GET /tx/{txid}. Applied is a pointer so an
// answer without it — a 404 page of a target that has no look-up — is not
// read as "not applied".
type statusAnswer struct {
	TxID    string `json:"txid"`
	Applied *bool  `json:"applied"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Lookup asks a target about one transaction, txid, with GET u (its
// look-up URL, the TXID in it). Only an answer that names the transaction
// and says applied true or false settles it: anything else is Unknown,
// with the reason, since "not applied" read from a mere error page could
// get a booked transfer sent twice.
func (c *StatusClient) Lookup(ctx context.Context, u, txid string) (Outcome, *Answer, string) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Unknown, nil, fmt.Sprintf("GET %s: %v", u, err)
	}
	resp, err := c.do(req)
	if err != nil {
		return Unknown, nil, fmt.Sprintf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return Unknown, nil, fmt.Sprintf("GET %s: read answer: %v", u, err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusNotFound {
		return Unknown, nil, fmt.Sprintf("GET %s: %s", u, resp.Status)
	}
	var a statusAnswer
	if err := json.Unmarshal(body, &a); err != nil || a.Applied == nil {
		return Unknown, nil, fmt.Sprintf("GET %s: %s, not a look-up answer: %s", u, resp.Status, firstLine(body))
	}
	switch {
	case a.TxID != txid:
		return Unknown, nil, fmt.Sprintf("GET %s: the answer is about txid %q", u, a.TxID)
	case *a.Applied && resp.StatusCode == http.StatusOK:
		return Applied, &Answer{Code: a.Code, Message: a.Message}, ""
	case !*a.Applied:
		return NotApplied, nil, ""
	default:
		return Unknown, nil, fmt.Sprintf("GET %s: %s with applied true", u, resp.Status)
	}
}

// firstLine returns the start of b's first line, for error messages.
func firstLine(b []byte) string {
	line, _, _ := bytes.Cut(bytes.TrimSpace(b), []byte("\n"))
	const max = 120
	if len(line) > max {
		return string(line[:max]) + "…"
	}
	return string(line)
}
