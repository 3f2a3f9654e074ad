package reconcile_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

// forbidden returns the URL of a target that fails the test if asked about
// anything, and counts what it is asked.
func forbidden(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		t.Errorf("target asked %s %s, though the journal settles it", r.Method, r.URL.Path)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(ts.Close)
	return ts.URL, &calls
}

func TestCheckResolvedOnResend(t *testing.T) {
	resolvedAt := time.Date(2026, 12, 1, 17, 31, 5, 250e6, time.UTC)
	inDoubt := func(line int, url string) reconcile.Entry {
		return reconcile.Entry{Line: line, Hub: "hub-a:9200", TxID: "T1", Target: "CORE", URL: url,
			Code: "E901", Stage: reconcile.StageRequestSent, BytesSent: 120}
	}
	resolved := func(line int, url, code string) reconcile.Entry {
		return reconcile.Entry{Line: line, Time: resolvedAt, Hub: "hub-b:9200", TxID: "T1", Target: "CORE", URL: url,
			Code: code, Stage: reconcile.StageResolvedApplied}
	}
	tests := []struct {
		name       string
		lines      func(url string) []reconcile.Entry
		entry      int // index of the line the result is about
		code       string
		resolution reconcile.Resolution
		duplicates []int
	}{
		{
			name:       "in doubt, then resolved",
			lines:      func(u string) []reconcile.Entry { return []reconcile.Entry{inDoubt(1, u), resolved(2, u, "0000")} },
			entry:      0,
			code:       "0000",
			resolution: reconcile.Resolution{Line: 2, Time: resolvedAt, Hub: "hub-b:9200"},
		},
		{
			name:       "resolved, then in doubt",
			lines:      func(u string) []reconcile.Entry { return []reconcile.Entry{resolved(1, u, "B201"), inDoubt(2, u+"/")} },
			entry:      1,
			code:       "B201",
			resolution: reconcile.Resolution{Line: 1, Time: resolvedAt, Hub: "hub-b:9200"},
		},
		{
			name:       "resolved alone",
			lines:      func(u string) []reconcile.Entry { return []reconcile.Entry{resolved(4, u, "0000")} },
			entry:      0,
			code:       "0000",
			resolution: reconcile.Resolution{Line: 4, Time: resolvedAt, Hub: "hub-b:9200"},
		},
		{
			name: "in doubt twice, resolved twice",
			lines: func(u string) []reconcile.Entry {
				return []reconcile.Entry{inDoubt(1, u), resolved(2, u, "0000"), inDoubt(3, u), resolved(4, u, "0000")}
			},
			entry:      0,
			code:       "0000",
			resolution: reconcile.Resolution{Line: 2, Time: resolvedAt, Hub: "hub-b:9200"},
			duplicates: []int{3, 4},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Given a journal whose only transaction a hub resolved on a
			// resend, and a target that must not be asked
			url, calls := forbidden(t)
			lines := tt.lines(url)

			// When it is reconciled
			results := reconcile.New(reconcile.Config{}).Check(context.Background(), lines)

			// Then it is applied with the recorded code, from the journal
			require.Len(t, results, 1)
			r := results[0]
			assert.Equal(t, lines[tt.entry], r.Entry)
			assert.Equal(t, reconcile.Applied, r.Outcome)
			assert.Equal(t, &reconcile.Answer{Code: tt.code}, r.Answer)
			assert.Equal(t, &tt.resolution, r.Resolved)
			assert.Empty(t, r.Reason)
			assert.Equal(t, tt.duplicates, r.Duplicates)
			assert.Zero(t, calls.Load())
			assert.Equal(t, reconcile.Summary{InDoubt: 1, Applied: 1, Resolved: 1}, reconcile.Summarize(results, nil))
		})
	}
}

// TestCheckResolvedAmongOthers: a resolution settles its own transaction
// only; the others in the journal are looked up as before, and the results
// keep journal order.
func TestCheckResolvedAmongOthers(t *testing.T) {
	core := coreFixture(t)
	var calls atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.URL.Path == "/tx/T1" {
			t.Errorf("asked about T1, which the journal resolves")
		}
		_, _ = w.Write([]byte(`{"txid":"` + strings.TrimPrefix(r.URL.Path, "/tx/") + `","applied":false}`))
	}))
	t.Cleanup(ts.Close)
	entries := []reconcile.Entry{
		{File: "in-doubt.log-20261201", Line: 1, TxID: "T1", Target: "CLAIM", URL: ts.URL, Code: "E901", Stage: reconcile.StageRequestSent},
		{File: "in-doubt.log-20261201", Line: 2, TxID: "T2", Target: "CLAIM", URL: ts.URL, Code: "E901", Stage: reconcile.StageRequestSent},
		{File: "in-doubt.log-20261201", Line: 3, TxID: "W1", Target: "CORE", URL: core, Code: "E902", Stage: reconcile.StageAnswerPartlyRead},
		{File: "in-doubt.log", Line: 1, TxID: "T1", Target: "CLAIM", URL: ts.URL, Code: "0000", Stage: reconcile.StageResolvedApplied, Hub: "hub-a:9200"},
		{File: "in-doubt.log", Line: 2, TxID: "T1", Target: "CORE", URL: core, Code: "0000", Stage: reconcile.StageResolvedApplied, Hub: "hub-a:9200"},
	}
	results := reconcile.New(reconcile.Config{Concurrency: 2}).Check(context.Background(), entries)
	require.Len(t, results, 4, "T1 at another target is another transaction")
	got := make([]string, len(results))
	for i, r := range results {
		got[i] = r.TxID + " " + string(r.Outcome)
		if r.Answer != nil {
			got[i] += " " + r.Answer.Code
		}
		if r.Resolved != nil {
			got[i] += " resolved at " + r.Resolved.File + ":" + strconv.Itoa(r.Resolved.Line)
		}
	}
	assert.Equal(t, []string{
		"T1 applied 0000 resolved at in-doubt.log:1",
		"T2 not_applied",
		"W1 applied 0000",
		"T1 applied 0000 resolved at in-doubt.log:2",
	}, got)
	assert.Equal(t, int64(1), calls.Load(), "only T2 asked of CLAIM")
	assert.Empty(t, results[0].Duplicates, "the resolution is in Resolved, not a duplicate")
	assert.Equal(t, reconcile.Summary{InDoubt: 4, Applied: 3, NotApplied: 1, Resolved: 2}, reconcile.Summarize(results, nil))
}

// TestCheckSettlesEveryResolutionStage: each resolution stage settles its
// transaction from the journal, whatever its via; an expired one is looked
// up all the same.
func TestCheckSettlesEveryResolutionStage(t *testing.T) {
	var calls atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.URL.Path != "/tx/X" {
			t.Errorf("target asked %s %s, though the journal settles it", r.Method, r.URL.Path)
		}
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(ts.Close)
	url := ts.URL
	at := time.Date(2026, 12, 1, 17, 31, 5, 0, time.UTC)
	entries := []reconcile.Entry{
		{Line: 1, TxID: "A", Target: "CORE", URL: url, Code: "E901", Stage: reconcile.StageRequestSent},
		{Line: 2, TxID: "A", Target: "CORE", URL: url, Code: "B201", Stage: reconcile.StageResolvedApplied, Via: "lookup", Hub: "h", Time: at},
		{Line: 3, TxID: "N", Target: "CORE", URL: url, Code: "E901", Stage: reconcile.StageRequestSent},
		{Line: 4, TxID: "N", Target: "CORE", URL: url, Stage: reconcile.StageResolvedNotApplied, Via: "operator", Hub: "h", Time: at},
		{Line: 5, TxID: "R", Target: "CORE", URL: url, Code: "E901", Stage: reconcile.StageRequestSent},
		{Line: 6, TxID: "R", Target: "CORE", URL: url, Code: "0000", Stage: reconcile.StageResolvedReversed, Via: "reversal", Hub: "h", Time: at},
		{Line: 7, TxID: "X", Target: "CORE", URL: url, Code: "E901", Stage: reconcile.StageRequestSent},
		{Line: 8, TxID: "X", Target: "CORE", URL: url, Stage: reconcile.StageUnresolvedExpired, Via: "lookup", Hub: "h", Time: at},
	}
	results := reconcile.New(reconcile.Config{Timeout: time.Second}).Check(context.Background(), entries)
	require.Len(t, results, 4)
	assert.Equal(t, reconcile.Applied, results[0].Outcome)
	assert.Equal(t, &reconcile.Answer{Code: "B201"}, results[0].Answer)
	assert.Equal(t, &reconcile.Resolution{Line: 2, Time: at, Hub: "h", Via: "lookup"}, results[0].Resolved)
	assert.Equal(t, reconcile.NotApplied, results[1].Outcome)
	assert.Equal(t, "operator", results[1].Resolved.Via)
	assert.Equal(t, reconcile.Reversed, results[2].Outcome)
	assert.Equal(t, 7, results[3].Line)
	require.NotNil(t, results[3].Expired)
	assert.Equal(t, 8, results[3].Expired.Line)
	assert.Nil(t, results[3].Resolved)
	assert.Equal(t, reconcile.Unknown, results[3].Outcome, "looked up, and the target refused")
	assert.Equal(t, int64(1), calls.Load(), "only the expired one was looked up")
	assert.Equal(t, reconcile.Summary{InDoubt: 4, Applied: 1, NotApplied: 1, Reversed: 1, Unknown: 1, Resolved: 3, Expired: 1},
		reconcile.Summarize(results, nil))
}
