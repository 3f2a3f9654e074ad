package reconcile_test

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/reconcile"
)

const goodLine = `{"time":"2026-12-01T17:30:00.123Z","hub":"hub-a:9200","txid":"T1","target":"CORE","url":"http://127.0.0.1:9201","code":"E901","stage":"request_sent","bytes_sent":123,"payload_sha256":"5d41402abc4b2a76b9719d911017c592ae1f5c9a4d2c7f5d4d3cde1e2b0e1f1a"}`

func TestReadJournal(t *testing.T) {
	journal := strings.Join([]string{
		goodLine,
		"",
		`{"txid":"T2","target":"CLAIM","url":"https://claims.example:8443/","code":"E902","stage":"request_partly_sent","future_field":{"x":1}}`,
		`{"txid":"T3","target":"CORE","url":"http://127.0.0.1:9201","code":"E500","stage":"answer_partly_read"`,
		`not json at all`,
		`{"target":"CORE","url":"http://127.0.0.1:9201"}`,
		`{"txid":"T4","url":"http://127.0.0.1:9201"}`,
		`{"txid":"T5","target":"CORE"}`,
		`{"txid":"T6","target":"CORE","url":"127.0.0.1:9201"}`,
		`{"txid":"T7","target":"CORE","url":"http://127.0.0.1:9201","time":"yesterday"}`,
		`{"txid":"T8","target":"CORE","url":"http://127.0.0.1:9201"}`, // last line, no newline
	}, "\n")
	entries, bad, err := reconcile.ReadJournal(strings.NewReader(journal))
	require.NoError(t, err)

	require.Len(t, entries, 3)
	assert.Equal(t, reconcile.Entry{
		Line: 1, Time: time.Date(2026, 12, 1, 17, 30, 0, 123e6, time.UTC), Hub: "hub-a:9200",
		TxID: "T1", Target: "CORE", URL: "http://127.0.0.1:9201", Code: "E901", Stage: reconcile.StageRequestSent,
		BytesSent: 123, PayloadSHA256: "5d41402abc4b2a76b9719d911017c592ae1f5c9a4d2c7f5d4d3cde1e2b0e1f1a",
	}, entries[0])
	assert.Equal(t, 3, entries[1].Line)
	assert.Equal(t, "T2", entries[1].TxID, "unknown fields are ignored")
	assert.Equal(t, 11, entries[2].Line)
	assert.Equal(t, "T8", entries[2].TxID)

	var lines []int
	for _, b := range bad {
		lines = append(lines, b.Line)
		assert.NotEmpty(t, b.Error)
	}
	assert.Equal(t, []int{4, 5, 6, 7, 8, 9, 10}, lines)
	assert.True(t, bad[0].Fragment, "a line cut short is a fragment")
	for _, b := range bad[1:] {
		assert.False(t, b.Fragment, "line %d is not the start of an entry", b.Line)
	}
	assert.Contains(t, bad[2].Error, "no txid")
	assert.Contains(t, bad[5].Error, "url")
}

func TestReadJournalSkipsFragments(t *testing.T) {
	line := func(txid string) string { return strings.Replace(goodLine, `"T1"`, `"`+txid+`"`, 1) }
	// Given a journal with a write torn by a full disk on a line of its
	// own (the hub starts the next line after it), one an older hub ran
	// the next entry on from, and a last line torn by a crash,
	journal := strings.Join([]string{
		line("A"),
		line("B")[:40],
		line("C"),
		line("D")[:97] + line("E"),
		line("F"),
		line("G")[:len(line("G"))-1],
	}, "\n")

	// when it is read,
	entries, bad, err := reconcile.ReadJournal(strings.NewReader(journal))
	require.NoError(t, err)

	// then every whole entry is found, the one run on from a fragment too,
	var got []string
	for _, e := range entries {
		got = append(got, fmt.Sprintf("%s@%d", e.TxID, e.Line))
	}
	assert.Equal(t, []string{"A@1", "C@3", "E@4", "F@5"}, got)

	// and the three fragments are skipped, counted apart from bad lines.
	var fragments []int
	for _, b := range bad {
		assert.True(t, b.Fragment, "line %d: %s", b.Line, b.Error)
		fragments = append(fragments, b.Line)
	}
	assert.Equal(t, []int{2, 4, 6}, fragments)
	sum := reconcile.Summarize(nil, bad)
	assert.Equal(t, reconcile.Summary{Fragments: 3}, sum)
	assert.True(t, sum.Settled(), "a fragment alone leaves nothing to look into")
	assert.False(t, reconcile.Summarize(nil, append(bad, reconcile.BadLine{Line: 7, Error: "x"})).Settled())
}

func TestReadJournalLongLine(t *testing.T) {
	long := `{"txid":"T1","target":"CORE","url":"http://127.0.0.1:9201","pad":"` + strings.Repeat("x", reconcile.MaxLineBytes) + `"}`
	entries, bad, err := reconcile.ReadJournal(strings.NewReader(long + "\n" + goodLine + "\n"))
	require.NoError(t, err)
	require.Len(t, bad, 1)
	assert.Equal(t, 1, bad[0].Line)
	require.Len(t, entries, 1)
	assert.Equal(t, 2, entries[0].Line, "the line after a long one is read whole")
}

func TestReadJournalEmpty(t *testing.T) {
	for _, in := range []string{"", "\n\n", "  \n"} {
		entries, bad, err := reconcile.ReadJournal(strings.NewReader(in))
		require.NoError(t, err)
		assert.Empty(t, entries)
		assert.Empty(t, bad)
	}
}

// gzipped returns s compressed as logrotate's compress leaves it.
func gzipped(t *testing.T, s string) []byte {
	t.Helper()
	var out bytes.Buffer
	zw, err := gzip.NewWriterLevel(&out, gzip.DefaultCompression)
	require.NoError(t, err)
	_, err = io.WriteString(zw, s)
	require.NoError(t, errors.Join(err, zw.Close()))
	return out.Bytes()
}

func TestReadJournalGzipped(t *testing.T) {
	journal := goodLine + "\n" + `{"txid":"T2","target":"CORE","url":"http://127.0.0.1:9201"}` + "\n" + "torn{\n"
	t.Run("whole", func(t *testing.T) {
		entries, bad, err := reconcile.ReadJournal(bytes.NewReader(gzipped(t, journal)))
		require.NoError(t, err)
		require.Len(t, entries, 2)
		assert.Equal(t, "T2", entries[1].TxID)
		assert.Equal(t, 2, entries[1].Line)
		require.Len(t, bad, 1)
		assert.Equal(t, 3, bad[0].Line)
	})
	t.Run("cut short", func(t *testing.T) {
		z := gzipped(t, journal)
		_, _, err := reconcile.ReadJournal(bytes.NewReader(z[:len(z)-10]))
		assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	})
	t.Run("gzip's magic and nothing else", func(t *testing.T) {
		_, _, err := reconcile.ReadJournal(strings.NewReader("\x1f\x8bnot gzip"))
		assert.ErrorContains(t, err, "starts as gzip but is not")
	})
}

// TestReadJournalResolved reads a journal the hub's own writer wrote: a
// call in doubt and, later, its resolution on a resend.
func TestReadJournalResolved(t *testing.T) {
	path := filepath.Join(t.TempDir(), "in-doubt.log")
	j, err := indoubt.Open(indoubt.Config{Path: path})
	require.NoError(t, err)
	sum := sha256.Sum256([]byte("WD ACC1 500"))
	call := indoubt.Entry{
		Time: time.Date(2026, 12, 1, 17, 30, 0, 123e6, time.UTC), Hub: "hub-a:9200", TxID: "T1", Target: "CORE",
		URL: "http://127.0.0.1:9201", Code: "E901", Stage: reconcile.StageRequestSent, BytesSent: 120, PayloadSHA256: sum,
	}
	resolution := indoubt.Entry{
		Time: time.Date(2026, 12, 1, 17, 31, 5, 250e6, time.UTC), Hub: "hub-b:9200", TxID: "T1", Target: "CORE",
		URL: "http://127.0.0.1:9201", Code: "0000", Stage: indoubt.StageResolvedApplied, PayloadSHA256: sum,
	}
	require.NoError(t, j.Append(&call))
	require.NoError(t, j.Append(&resolution))
	require.NoError(t, j.Close())

	f, err := os.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	entries, bad, err := reconcile.ReadJournal(f)
	require.NoError(t, err)
	assert.Empty(t, bad)
	require.Len(t, entries, 2)
	assert.Equal(t, reconcile.Entry{
		Line: 2, Time: resolution.Time, Hub: "hub-b:9200", TxID: "T1", Target: "CORE", URL: "http://127.0.0.1:9201",
		Code: "0000", Stage: reconcile.StageResolvedApplied, PayloadSHA256: hex.EncodeToString(sum[:]), Via: "resend",
	}, entries[1])
	assert.Equal(t, entries[0].PayloadSHA256, entries[1].PayloadSHA256)
}

func TestReadJournalResolvedWithoutCode(t *testing.T) {
	journal := `{"txid":"T1","target":"CORE","url":"http://127.0.0.1:9201","stage":"resolved_applied"}` + "\n" + goodLine + "\n"
	entries, bad, err := reconcile.ReadJournal(strings.NewReader(journal))
	require.NoError(t, err)
	require.Len(t, bad, 1, "a resolution must say what the target recorded")
	assert.Equal(t, 1, bad[0].Line)
	assert.Contains(t, bad[0].Error, "no code")
	require.Len(t, entries, 1)
	assert.Equal(t, 2, entries[0].Line)
}
