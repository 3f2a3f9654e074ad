package targethttp

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// TxIDPlaceholder is what a reverse_url template holds, exactly once,
// where the TXID goes.
const TxIDPlaceholder = "{txid}"

// CheckReverseURL reports what is wrong with tmpl as a reverse_url
// template: it must hold TxIDPlaceholder exactly once and, with a TXID in
// its place, be an http or https URL with a host. nil when it is right.
func CheckReverseURL(tmpl string) error {
	switch n := strings.Count(tmpl, TxIDPlaceholder); n {
	case 0:
		return fmt.Errorf("%q: want %s once, where the TXID goes (http://core:9201/tx/%s/reverse)", tmpl, TxIDPlaceholder, TxIDPlaceholder)
	case 1:
	default:
		return fmt.Errorf("%q: %s appears %d times; want it once", tmpl, TxIDPlaceholder, n)
	}
	u, err := url.Parse(ReverseURL(tmpl, "T1"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q: want http:// or https:// with a host", tmpl)
	}
	return nil
}

// ReverseURL is tmpl, a reverse_url template, with txid, path-escaped, in
// place of TxIDPlaceholder.
func ReverseURL(tmpl, txid string) string {
	return strings.Replace(tmpl, TxIDPlaceholder, url.PathEscape(txid), 1)
}

// ReverseConfig configures a ReverseClient as a StatusConfig does a
// StatusClient: Client makes the reversals, Timeout bounds each. The zero
// value is usable.
type ReverseConfig = StatusConfig

// ReverseClient asks a target to reverse a transaction (docs/PROTOCOL.md,
// "In-doubt journal"). It is safe for concurrent use.
type ReverseClient struct{ sideHTTP }

// NewReverseClient returns a ReverseClient configured by cfg.
func NewReverseClient(cfg ReverseConfig) *ReverseClient {
	return &ReverseClient{newSideHTTP(cfg)}
}

// Reverse posts the reversal of txid to tmpl, a reverse_url template that
// CheckReverseURL accepts, with the headers X-Tx-Id: txid, X-Reversal:
// true and X-Attempt: attempt (2 and up mark a retransmission), and no
// body. err is set when no HTTP answer came (the reason, for the log);
// otherwise code and msg are the answer read as a call's is (DecodeAnswer):
// 0000 or a Bnnn when the target answered in the target protocol in full,
// E400 or E500 otherwise. Whether that reversed the transaction is the
// caller's to say (resolver.ReversalResult).
func (c *ReverseClient) Reverse(ctx context.Context, tmpl, txid string, attempt int) (code string, msg []byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	u := ReverseURL(tmpl, txid)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, http.NoBody)
	if err != nil {
		return "", nil, fmt.Errorf("POST %s: %w", u, err)
	}
	req.Header.Set("X-Tx-Id", txid)
	req.Header.Set("X-Reversal", "true")
	req.Header.Set("X-Attempt", strconv.Itoa(attempt))
	resp, err := c.do(req)
	if err != nil {
		return "", nil, fmt.Errorf("POST %s: %w", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return "", nil, fmt.Errorf("POST %s: read answer: %w", u, err)
	}
	if len(body) > maxAnswerBytes {
		return "", nil, fmt.Errorf("POST %s: %s", u, msgAnswerTooLarge)
	}
	code, msg = DecodeAnswer(resp.StatusCode, body)
	return code, msg, nil
}
