// Package logtest captures JSON log lines in tests, and reads those a
// process wrote to a file (an access log, an in-doubt journal).
//
// Typical use:
//
//	var logs logtest.Buffer
//	logger := zerolog.New(&logs)
//	// ... run the code under test ...
//	for _, line := range logs.Lines(t) { ... }
package logtest

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Buffer is an io.Writer that keeps everything written to it, for a logger
// that several goroutines use. The zero value is ready to use. It is safe
// for concurrent use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Lines returns what was written, one JSON object per non-empty line; a
// line that is not JSON fails the test.
func (b *Buffer) Lines(t testing.TB) []map[string]any {
	t.Helper()
	return decodeLines(t, b.String())
}

// FileLines returns the file at path, one JSON object per non-empty line;
// a line that is not JSON, or a file that cannot be read, fails the test.
func FileLines(t testing.TB, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return decodeLines(t, string(b))
}

// decodeLines decodes s, one JSON object per non-empty line.
func decodeLines(t testing.TB, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(s), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		out = append(out, m)
	}
	return out
}

// Messages returns the lines of Lines whose "message" is msg, in order.
func (b *Buffer) Messages(t testing.TB, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range b.Lines(t) {
		if l["message"] == msg {
			out = append(out, l)
		}
	}
	return out
}
