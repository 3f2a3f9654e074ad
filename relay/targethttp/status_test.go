package targethttp

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStatusClientLookup(t *testing.T) {
	serve := func(status int, body string) string {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			assert.Equal(t, http.MethodGet, r.Method)
			w.WriteHeader(status)
			_, _ = w.Write([]byte(body))
		}))
		t.Cleanup(ts.Close)
		return ts.URL + "/tx/T1"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://" + ln.Addr().String() + "/tx/T1"
	require.NoError(t, ln.Close())

	tests := []struct {
		name    string
		url     string
		outcome Outcome
		answer  *Answer
		reason  string
	}{
		{"applied", serve(http.StatusOK, `{"txid":"T1","applied":true,"code":"B201","message":"insufficient funds"}`), Applied, &Answer{Code: "B201", Message: "insufficient funds"}, ""},
		{"not applied", serve(http.StatusNotFound, `{"txid":"T1","applied":false}`), NotApplied, nil, ""},
		{"unreachable", closed, Unknown, nil, "connection refused"},
		{"server error", serve(http.StatusServiceUnavailable, "busy"), Unknown, nil, "503"},
		{"404 page of a target without look-up", serve(http.StatusNotFound, "<html>not found</html>\nmore"), Unknown, nil, "not a look-up answer: <html>not found</html>"},
		{"answer about another transaction", serve(http.StatusOK, `{"txid":"OTHER","applied":true}`), Unknown, nil, `"OTHER"`},
		{"404 claiming applied", serve(http.StatusNotFound, `{"txid":"T1","applied":true}`), Unknown, nil, "applied true"},
	}
	c := NewStatusClient(StatusConfig{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outcome, answer, reason := c.Lookup(context.Background(), tt.url, "T1")
			assert.Equal(t, tt.outcome, outcome)
			assert.Equal(t, tt.answer, answer)
			if tt.reason == "" {
				assert.Empty(t, reason)
			} else {
				assert.Contains(t, reason, tt.reason)
			}
		})
	}
}

func TestStatusClientTimeout(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	t.Cleanup(ts.Close)
	c := NewStatusClient(StatusConfig{Timeout: 50 * time.Millisecond})
	outcome, answer, reason := c.Lookup(context.Background(), ts.URL+"/tx/T1", "T1")
	assert.Equal(t, Unknown, outcome)
	assert.Nil(t, answer)
	assert.Contains(t, reason, "deadline exceeded")
}
