package reconcile_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/fixtures"
	"github.com/relayhub/relayhub/relay/reconcile"
)

// coreFixture serves a core fixture that has applied W1 (a withdrawal) and
// R1 (an overdraft it rejected).
func coreFixture(t *testing.T) string {
	t.Helper()
	s, err := fixtures.New(fixtures.Config{Name: "CORE", Kind: fixtures.KindCore})
	require.NoError(t, err)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	for id, payload := range map[string]string{"W1": "WD ACC1 500", "R1": "WD ACC2 99999999"} {
		req, err := http.NewRequest(http.MethodPost, ts.URL+"/tx", strings.NewReader(payload))
		require.NoError(t, err)
		req.Header.Set("X-Tx-Id", id)
		resp, err := ts.Client().Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	return ts.URL
}

// serve returns the URL of a server answering every request with status
// and body.
func serve(t *testing.T, status int, body string) string {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(ts.Close)
	return ts.URL
}

// closedURL returns the URL of a loopback port nobody listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return "http://" + addr
}

func TestCheck(t *testing.T) {
	core := coreFixture(t)
	tests := []struct {
		name    string
		url     string
		txid    string
		outcome reconcile.Outcome
		answer  *reconcile.Answer
		reason  string
	}{
		{"applied", core, "W1", reconcile.Applied, &reconcile.Answer{Code: "0000", Message: "balance=99500"}, ""},
		{"applied as a business rejection", core + "/", "R1", reconcile.Applied, &reconcile.Answer{Code: "B201", Message: "insufficient funds"}, ""},
		{"not applied", core, "N1", reconcile.NotApplied, nil, ""},
		{"unreachable", closedURL(t), "U1", reconcile.Unknown, nil, "connection refused"},
		{"server error", serve(t, http.StatusServiceUnavailable, "busy"), "U2", reconcile.Unknown, nil, "503"},
		{"404 page of a target without look-up", serve(t, http.StatusNotFound, `{"error":"not found"}`), "U3", reconcile.Unknown, nil, "not a look-up answer"},
		{"404 that is not JSON", serve(t, http.StatusNotFound, "<html>not found</html>"), "U4", reconcile.Unknown, nil, "not a look-up answer"},
		{"answer about another transaction", serve(t, http.StatusOK, `{"txid":"OTHER","applied":true}`), "U5", reconcile.Unknown, nil, `"OTHER"`},
		{"404 claiming applied", serve(t, http.StatusNotFound, `{"txid":"U6","applied":true}`), "U6", reconcile.Unknown, nil, "applied true"},
		{"200 saying not applied", serve(t, http.StatusOK, `{"txid":"N2","applied":false}`), "N2", reconcile.NotApplied, nil, ""},
	}
	var entries []reconcile.Entry
	for i, tt := range tests {
		entries = append(entries, reconcile.Entry{Line: i + 1, TxID: tt.txid, Target: "CORE", URL: tt.url, Code: "E901"})
	}
	results := reconcile.New(reconcile.Config{Concurrency: 3}).Check(context.Background(), entries)
	require.Len(t, results, len(tests))
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := results[i]
			assert.Equal(t, entries[i], r.Entry, "results keep journal order")
			assert.Equal(t, tt.outcome, r.Outcome)
			assert.Equal(t, tt.answer, r.Answer)
			if tt.reason == "" {
				assert.Empty(t, r.Reason)
			} else {
				assert.Contains(t, r.Reason, tt.reason)
			}
		})
	}
	assert.Equal(t, reconcile.Summary{InDoubt: 10, Applied: 2, NotApplied: 2, Unknown: 6, BadLines: 1},
		reconcile.Summarize(results, []reconcile.BadLine{{Line: 11, Error: "x"}}))
}

func TestCheckAsksOncePerTransaction(t *testing.T) {
	var calls atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = w.Write([]byte(`{"txid":"` + strings.TrimPrefix(r.URL.Path, "/tx/") + `","applied":false}`))
	}))
	t.Cleanup(ts.Close)
	entries := []reconcile.Entry{
		{Line: 1, TxID: "T1", URL: ts.URL},
		{Line: 2, TxID: "T2", URL: ts.URL},
		{Line: 3, TxID: "T1", URL: ts.URL + "/"},
	}
	results := reconcile.New(reconcile.Config{Concurrency: 1}).Check(context.Background(), entries)
	require.Len(t, results, 2)
	assert.Equal(t, []int{3}, results[0].Duplicates)
	assert.Equal(t, "T2", results[1].TxID)
	assert.Equal(t, int64(2), calls.Load())
	assert.Empty(t, results[0].DuplicateFiles, "one journal file")

	// Read from rotated files, the same transaction in two of them is
	// asked about once, and the repeat says which file it is in.
	entries = []reconcile.Entry{
		{File: "in-doubt.log-20261130", Line: 7, TxID: "T1", URL: ts.URL},
		{File: "in-doubt.log", Line: 1, TxID: "T1", URL: ts.URL},
	}
	results = reconcile.New(reconcile.Config{}).Check(context.Background(), entries)
	require.Len(t, results, 1)
	assert.Equal(t, "in-doubt.log-20261130", results[0].File)
	assert.Equal(t, []int{1}, results[0].Duplicates)
	assert.Equal(t, []string{"in-doubt.log"}, results[0].DuplicateFiles)
	assert.Equal(t, int64(3), calls.Load())
}

func TestCheckEscapesTheTxID(t *testing.T) {
	var path string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path = r.URL.EscapedPath()
		_, _ = w.Write([]byte(`{"txid":"a/b?c","applied":false}`))
	}))
	t.Cleanup(ts.Close)
	results := reconcile.New(reconcile.Config{}).Check(context.Background(), []reconcile.Entry{{TxID: "a/b?c", URL: ts.URL}})
	assert.Equal(t, reconcile.NotApplied, results[0].Outcome)
	assert.Equal(t, "/tx/a%2Fb%3Fc", path)
}

func TestCheckEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	results := reconcile.New(reconcile.Config{}).Check(ctx, []reconcile.Entry{{TxID: "W1", URL: coreFixture(t)}})
	assert.Equal(t, reconcile.Unknown, results[0].Outcome)
	assert.Contains(t, results[0].Reason, "context canceled")
}
