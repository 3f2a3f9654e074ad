// Package logtest captures JSON log lines in tests.
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
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(b.String()), "\n") {
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
