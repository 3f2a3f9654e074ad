package targethttp

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckReverseURL(t *testing.T) {
	for tmpl, want := range map[string]string{
		"http://127.0.0.1:9201/tx/{txid}/reverse":  "",
		"https://core.bank:9201/reverse?tx={txid}": "",
		"http://127.0.0.1:9201/tx/reverse":         "want {txid} once",
		"http://127.0.0.1:9201/{txid}/{txid}":      "appears 2 times",
		"ftp://127.0.0.1/{txid}":                   "want http:// or https://",
		"/tx/{txid}/reverse":                       "want http:// or https://",
	} {
		t.Run(tmpl, func(t *testing.T) {
			err := CheckReverseURL(tmpl)
			if want == "" {
				assert.NoError(t, err)
			} else {
				assert.ErrorContains(t, err, want)
			}
		})
	}
	assert.Equal(t, "http://h/tx/A%2FB/reverse", ReverseURL("http://h/tx/{txid}/reverse", "A/B"))
}

func TestReverseClient(t *testing.T) {
	type seen struct {
		method, path, txid, reversal, attempt, length string
		body                                          []byte
	}
	got := make(chan seen, 1)
	serve := func(status int, body string) string {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			got <- seen{r.Method, r.URL.Path, r.Header.Get("X-Tx-Id"), r.Header.Get("X-Reversal"), r.Header.Get("X-Attempt"),
				r.Header.Get("Content-Length"), b}
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
		}))
		t.Cleanup(ts.Close)
		return ts.URL + "/tx/{txid}/reverse"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://" + ln.Addr().String() + "/tx/{txid}/reverse"
	require.NoError(t, ln.Close())

	tests := []struct {
		name, tmpl, code, msg, err string
	}{
		{"reversed", serve(200, `{"code":"0000","message":"reversed"}`), "0000", "reversed", ""},
		{"nothing to reverse", serve(200, `{"code":"0000","message":"nothing to reverse"}`), "0000", "nothing to reverse", ""},
		{"a business refusal", serve(200, `{"code":"B404","message":"no such transaction"}`), "B404", "no such transaction", ""},
		{"the target's own failure", serve(200, `{"code":"E500","message":"ledger locked"}`), "E500", "ledger locked", ""},
		{"not the target protocol", serve(200, `reversed`), "E500", msgNotProtocol + suffixInDoubt, ""},
		{"server error", serve(503, `busy`), "E500", "target failed: HTTP 503", ""},
		{"unreachable", closed, "", "", "connection refused"},
	}
	c := NewReverseClient(ReverseConfig{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, msg, err := c.Reverse(context.Background(), tt.tmpl, "W 2", 3)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				assert.Empty(t, code)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.code, code)
			assert.Contains(t, string(msg), tt.msg)
			s := <-got
			assert.Equal(t, seen{method: "POST", path: "/tx/W 2/reverse", txid: "W 2", reversal: "true", attempt: "3", length: "0", body: []byte{}}, s)
		})
	}
}

func TestReverseClientTimeout(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	t.Cleanup(ts.Close)
	c := NewReverseClient(ReverseConfig{Timeout: 50 * time.Millisecond})
	code, _, err := c.Reverse(context.Background(), ts.URL+"/tx/{txid}/reverse", "T1", 1)
	assert.Empty(t, code)
	assert.ErrorContains(t, err, "deadline exceeded")
}
