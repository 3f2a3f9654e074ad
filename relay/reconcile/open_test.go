package reconcile_test

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/reconcile"
)

func TestOpen(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	line := func(n int, txid, target, stage string, age time.Duration) reconcile.Entry {
		return reconcile.Entry{Line: n, TxID: txid, Target: target, URL: "http://127.0.0.1:9201", Stage: stage, Time: now.Add(-age)}
	}
	entries := []reconcile.Entry{
		line(1, "W1", "CORE", reconcile.StageRequestSent, time.Hour),          // open
		line(2, "W2", "CORE", reconcile.StageRequestSent, time.Hour),          // settled at 3
		line(3, "W2", "CORE", reconcile.StageResolvedApplied, 50*time.Minute), //
		line(4, "W3", "CORE", reconcile.StageRequestSent, 48*time.Hour),       // too old
		line(5, "W4", "CORE", reconcile.StageRequestSent, time.Hour),          // not applied, then in doubt again
		line(6, "W4", "CORE", reconcile.StageResolvedNotApplied, time.Hour),   //
		line(7, "W4", "CORE", reconcile.StageAnswerPartlyRead, time.Minute),   //
		line(8, "W5", "CORE", reconcile.StageRequestSent, 30*time.Hour),       // given up already
		line(9, "W5", "CORE", reconcile.StageUnresolvedExpired, 6*time.Hour),  //
		line(10, "W1", "CLAIM", reconcile.StageRequestSent, time.Minute),      // another target's W1
		line(11, "W6", "CORE", reconcile.StageResolvedReversed, time.Minute),  // a resolution alone
	}

	open, expired := reconcile.Open(entries, now, 24*time.Hour)

	assert.Equal(t, []int{1, 7, 10}, lineNumbers(open))
	assert.Equal(t, []int{4}, lineNumbers(expired))

	t.Run("no expiry", func(t *testing.T) {
		open, expired := reconcile.Open(entries, now, 0)
		assert.Equal(t, []int{1, 4, 7, 10}, lineNumbers(open))
		assert.Empty(t, expired)
	})
	t.Run("from a journal written today and before via", func(t *testing.T) {
		journal := `{"time":"2026-12-02T11:00:00.000Z","txid":"W1","target":"CORE","url":"http://127.0.0.1:9201","code":"E901","stage":"request_sent"}` + "\n" +
			`{"time":"2026-12-02T11:01:00.000Z","txid":"W1","target":"CORE","url":"http://127.0.0.1:9201","code":"0000","stage":"resolved_applied"}` + "\n" +
			`{"time":"2026-12-02T11:02:00.000Z","txid":"W2","target":"CORE","url":"http://127.0.0.1:9201","code":"E901","stage":"request_sent"}` + "\n" +
			`{"time":"2026-12-02T11:03:00.000Z","txid":"W2","target":"CORE","url":"http://127.0.0.1:9201","code":"E901","stage":"request_` // torn
		entries, bad, err := reconcile.ReadJournal(strings.NewReader(journal))
		require.NoError(t, err)
		require.Len(t, bad, 1)
		assert.True(t, bad[0].Fragment)
		assert.Equal(t, "resend", entries[1].Via, "a resolved_applied line without via was resolved on a resend")
		open, _ := reconcile.Open(entries, now, 24*time.Hour)
		assert.Equal(t, []int{3}, lineNumbers(open))
	})
}

func TestUnsettled(t *testing.T) {
	entries := []reconcile.Entry{
		{Line: 1, TxID: "W1", Target: "CORE", Stage: reconcile.StageRequestSent},
		{Line: 2, TxID: "W2", Target: "CORE", Stage: reconcile.StageRequestSent},
		{Line: 3, TxID: "W2", Target: "CORE", Stage: reconcile.StageResolvedNotApplied},
		{Line: 4, TxID: "W3", Target: "CORE", Stage: reconcile.StageRequestSent},
		{Line: 5, TxID: "W3", Target: "CORE", Stage: reconcile.StageUnresolvedExpired},
	}
	tests := []struct {
		name, target, txid string
		line               int // 0: not unsettled
	}{
		{"open", "", "W1", 1},
		{"open, at its target", "CORE", "W1", 1},
		{"at another target", "CLAIM", "W1", 0},
		{"settled", "", "W2", 0},
		{"given up by the hub", "", "W3", 4},
		{"not in the journal", "", "W9", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, ok := reconcile.Unsettled(entries, tt.target, tt.txid)
			assert.Equal(t, tt.line != 0, ok)
			assert.Equal(t, tt.line, e.Line)
		})
	}
}

func lineNumbers(entries []reconcile.Entry) []int {
	out := make([]int, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.Line)
	}
	return out
}

// TestReadOpenIsOpen: reading the open entries as the journal streams by
// finds what Open finds on the whole journal.
func TestReadOpenIsOpen(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	var journal strings.Builder
	write := func(txid, target, stage string, age time.Duration) {
		e := indoubt.Entry{Time: now.Add(-age), Hub: "hub-a", TxID: txid, Target: target, URL: "http://127.0.0.1:9201", Code: "E901", Stage: stage}
		journal.Write(append(e.AppendJSON(nil), '\n'))
	}
	write("W1", "CORE", reconcile.StageRequestSent, time.Hour)
	write("W2", "CORE", reconcile.StageRequestSent, time.Hour)
	write("W2", "CORE", reconcile.StageResolvedApplied, 50*time.Minute)
	write("W3", "CORE", reconcile.StageRequestSent, 48*time.Hour)
	write("W4", "CORE", reconcile.StageRequestSent, time.Hour)
	write("W4", "CORE", reconcile.StageResolvedNotApplied, time.Hour)
	journal.WriteString(`{"time":"2026-12-02T11:03:00.000Z","txid":"W9","target":"CORE","url":"http://` + "\n") // torn
	write("W4", "CORE", reconcile.StageAnswerPartlyRead, time.Minute)
	write("W5", "CORE", reconcile.StageRequestSent, 30*time.Hour)
	write("W5", "CORE", reconcile.StageUnresolvedExpired, 6*time.Hour)
	write("W1", "CLAIM", reconcile.StageRequestSent, time.Minute)
	write("W1", "CORE", reconcile.StageRequestSent, 30*time.Minute) // W1 in doubt again: its last line counts

	entries, wantBad, err := reconcile.ReadJournal(strings.NewReader(journal.String()))
	require.NoError(t, err)
	wantOpen, wantExpired := reconcile.Open(entries, now, 24*time.Hour)

	open, expired, bad, err := reconcile.ReadOpen(strings.NewReader(journal.String()), now, 24*time.Hour)
	require.NoError(t, err)
	assert.Equal(t, wantOpen, open)
	assert.Equal(t, wantExpired, expired)
	assert.Equal(t, wantBad, bad)
	assert.Equal(t, []int{8, 11, 12}, lineNumbers(open))
	assert.Equal(t, []int{4}, lineNumbers(expired))
}

// BenchmarkReadOpen reads a journal of a million lines, every call but the
// last thousand settled, as a hub does at start.
func BenchmarkReadOpen(b *testing.B) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	var journal []byte
	const lines = 1_000_000
	for i := range lines / 2 {
		e := indoubt.Entry{Time: now.Add(-time.Hour), Hub: "hub-a:9200", TxID: "W" + strconv.Itoa(i), Target: "CORE",
			URL: "http://127.0.0.1:9201", Code: "E901", Stage: reconcile.StageRequestSent, BytesSent: 120}
		journal = append(e.AppendJSON(journal), '\n')
		if i < lines/2-1000 {
			e.Stage, e.Code = reconcile.StageResolvedApplied, "0000"
		}
		journal = append(e.AppendJSON(journal), '\n')
	}
	b.SetBytes(int64(len(journal)))
	b.ReportAllocs()
	for b.Loop() {
		open, _, _, err := reconcile.ReadOpen(bytes.NewReader(journal), now, 24*time.Hour)
		if err != nil || len(open) != 1000 {
			b.Fatalf("%d open, %v", len(open), err)
		}
	}
}
