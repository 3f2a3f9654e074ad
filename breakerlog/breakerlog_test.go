package breakerlog_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/breakerlog"
)

var at = time.Date(2026, 11, 30, 5, 31, 19, 123_000_000, time.UTC)

// openTemp opens a log in a fresh directory and closes it when the test ends.
func openTemp(t *testing.T) (*breakerlog.Log, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "breaker.log")
	bl, err := breakerlog.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = bl.Close() })
	return bl, path
}

func readText(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

func TestAppendLine(t *testing.T) {
	cet := time.FixedZone("CET", 3600)
	tests := []struct {
		name string
		tr   breaker.Transition
		want string
	}{
		{
			name: "spec example",
			tr:   breaker.Transition{Name: "CORE", From: breaker.Closed, To: breaker.Open, At: at},
			want: "2026-11-30T05:31:19.123Z|CORE|CLOSED->OPEN\n",
		},
		{
			name: "zero milliseconds keep three digits",
			tr:   breaker.Transition{Name: "CLAIM", From: breaker.Open, To: breaker.HalfOpen, At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)},
			want: "2026-01-02T03:04:05.000Z|CLAIM|OPEN->HALF_OPEN\n",
		},
		{
			name: "non-UTC time is converted to UTC",
			tr:   breaker.Transition{Name: "CORE", From: breaker.HalfOpen, To: breaker.Closed, At: time.Date(2026, 11, 30, 6, 31, 19, 7_000_000, cet)},
			want: "2026-11-30T05:31:19.007Z|CORE|HALF_OPEN->CLOSED\n",
		},
		{
			name: "conversion crosses midnight",
			tr:   breaker.Transition{Name: "CORE", From: breaker.HalfOpen, To: breaker.Open, At: time.Date(2027, 1, 1, 0, 30, 0, 0, cet)},
			want: "2026-12-31T23:30:00.000Z|CORE|HALF_OPEN->OPEN\n",
		},
		{
			name: "sub-millisecond digits are truncated",
			tr:   breaker.Transition{Name: "CORE", From: breaker.Closed, To: breaker.Open, At: time.Date(2026, 11, 30, 5, 31, 19, 999_999_999, time.UTC)},
			want: "2026-11-30T05:31:19.999Z|CORE|CLOSED->OPEN\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, string(breakerlog.AppendLine(nil, tt.tr)))

			prefix := []byte("kept|")
			assert.Equal(t, "kept|"+tt.want, string(breakerlog.AppendLine(prefix, tt.tr)),
				"AppendLine must append, not overwrite")
		})
	}
}

func TestAppendLineDoesNotAllocate(t *testing.T) {
	tr := breaker.Transition{Name: "CORE", From: breaker.HalfOpen, To: breaker.Closed, At: at.In(time.FixedZone("X", -7200))}
	buf := make([]byte, 0, 128)
	allocs := testing.AllocsPerRun(100, func() {
		buf = breakerlog.AppendLine(buf[:0], tr)
	})
	assert.Zero(t, allocs)
}

func TestWriteDoesNotAllocate(t *testing.T) {
	bl, _ := openTemp(t)
	tr := breaker.Transition{Name: "CORE", From: breaker.Closed, To: breaker.Open, At: at}
	allocs := testing.AllocsPerRun(100, func() {
		if err := bl.Write(tr); err != nil {
			panic(err)
		}
	})
	assert.Zero(t, allocs)
}

func TestOpenFailureNamesPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no-such-dir", "breaker.log")

	bl, err := breakerlog.Open(path)

	require.Error(t, err)
	assert.Nil(t, bl)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.ErrorContains(t, err, fmt.Sprintf("breaker log %q", path))
}

func TestOpenKeepsExistingContent(t *testing.T) {
	// Given a log file left by an earlier run
	path := filepath.Join(t.TempDir(), "breaker.log")
	earlier := "2026-11-29T23:59:59.999Z|CORE|CLOSED->OPEN\n"
	require.NoError(t, os.WriteFile(path, []byte(earlier), 0o644))

	// When it is opened again and written to
	bl, err := breakerlog.Open(path)
	require.NoError(t, err)
	require.NoError(t, bl.Write(breaker.Transition{Name: "CLAIM", From: breaker.Closed, To: breaker.Open, At: at}))
	require.NoError(t, bl.Close())

	// Then the earlier line is still there, followed by the new one
	assert.Equal(t, earlier+"2026-11-30T05:31:19.123Z|CLAIM|CLOSED->OPEN\n", readText(t, path))
}

func TestOpenCreatesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "breaker.log")

	bl, err := breakerlog.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = bl.Close() })

	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Zero(t, info.Size())
	assert.Zero(t, info.Mode().Perm()&^0o644, "no more than rw-r--r--")
	assert.Equal(t, path, bl.Path())
}

func TestLineIsInFileWhenWriteReturns(t *testing.T) {
	// No Close and no Sync: a reader (or a kill -9 right now) must already
	// see the line, so Write cannot be holding it in a user-space buffer.
	bl, path := openTemp(t)
	require.NoError(t, bl.Write(breaker.Transition{Name: "CORE", From: breaker.Closed, To: breaker.Open, At: at}))
	assert.Equal(t, "2026-11-30T05:31:19.123Z|CORE|CLOSED->OPEN\n", readText(t, path))
}

func TestConcurrentWritersNeverInterleave(t *testing.T) {
	const (
		writers = 64
		lines   = 1000
	)
	bl, path := openTemp(t)
	cycle := []struct{ from, to breaker.State }{
		{breaker.Closed, breaker.Open},
		{breaker.Open, breaker.HalfOpen},
		{breaker.HalfOpen, breaker.Open},
		{breaker.Open, breaker.HalfOpen},
		{breaker.HalfOpen, breaker.Closed},
	}

	// Given 64 goroutines, each writing its own target's chain, so the file
	// is only a valid set of chains if no line was torn, lost or doubled
	errs := make(chan error, writers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			<-start
			name := fmt.Sprintf("TARGET-%02d", w)
			for i := range lines {
				step := cycle[i%len(cycle)]
				tr := breaker.Transition{Name: name, From: step.from, To: step.to, At: at.Add(time.Duration(i) * time.Millisecond)}
				if err := bl.Write(tr); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, bl.Close())

	// Then every line is whole and parseable and every chain is intact
	text := readText(t, path)
	assert.Equal(t, writers*lines, strings.Count(text, "\n"))
	entries, _, err := breakerlog.ReadFile(path)
	require.NoError(t, err)
	require.Len(t, entries, writers*lines)
	require.NoError(t, breakerlog.CheckChains(entries))
	perTarget := map[string]int{}
	for _, e := range entries {
		perTarget[e.Name]++
	}
	assert.Len(t, perTarget, writers)
	for name, n := range perTarget {
		assert.Equal(t, lines, n, name)
	}
}

func TestWriteAfterClose(t *testing.T) {
	bl, path := openTemp(t)
	tr := breaker.Transition{Name: "CORE", From: breaker.Closed, To: breaker.Open, At: at}
	require.NoError(t, bl.Write(tr))
	require.NoError(t, bl.Close())

	err := bl.Write(tr)

	assert.ErrorIs(t, err, os.ErrClosed)
	assert.ErrorContains(t, err, path)
	assert.Equal(t, "2026-11-30T05:31:19.123Z|CORE|CLOSED->OPEN\n", readText(t, path), "nothing written after Close")
	assert.ErrorIs(t, bl.Close(), os.ErrClosed, "second Close")
}

func TestWriteErrorIsReturned(t *testing.T) {
	// /dev/full accepts the open and fails every write with ENOSPC, like a
	// full disk.
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full on this system")
	}
	bl, err := breakerlog.Open("/dev/full")
	require.NoError(t, err)
	t.Cleanup(func() { _ = bl.Close() })

	err = bl.Write(breaker.Transition{Name: "CORE", From: breaker.Closed, To: breaker.Open, At: at})

	assert.ErrorIs(t, err, syscall.ENOSPC)
	assert.ErrorContains(t, err, `breaker log "/dev/full"`)
}

func TestWriteRejectsUnloggable(t *testing.T) {
	tests := []struct {
		name string
		tr   breaker.Transition
	}{
		{name: "empty name", tr: breaker.Transition{Name: "", From: breaker.Closed, To: breaker.Open, At: at}},
		{name: "pipe in name", tr: breaker.Transition{Name: "CO|RE", From: breaker.Closed, To: breaker.Open, At: at}},
		{name: "newline in name", tr: breaker.Transition{Name: "CORE\n2026-11-30T05:31:19.123Z|X", From: breaker.Closed, To: breaker.Open, At: at}},
		{name: "space in name", tr: breaker.Transition{Name: "CO RE", From: breaker.Closed, To: breaker.Open, At: at}},
		{name: "unknown from state", tr: breaker.Transition{Name: "CORE", From: breaker.State(7), To: breaker.Open, At: at}},
		{name: "unknown to state", tr: breaker.Transition{Name: "CORE", From: breaker.Closed, To: breaker.State(3), At: at}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bl, path := openTemp(t)

			err := bl.Write(tt.tr)

			assert.ErrorIs(t, err, breakerlog.ErrUnloggable)
			assert.ErrorContains(t, err, path)
			assert.Empty(t, readText(t, path))
		})
	}
}

func TestParseLine(t *testing.T) {
	good := []struct {
		name string
		line string
		want breakerlog.Entry
	}{
		{
			name: "spec example",
			line: "2026-11-30T05:31:19.123Z|CORE|CLOSED->OPEN",
			want: breakerlog.Entry{At: at, Name: "CORE", From: breaker.Closed, To: breaker.Open},
		},
		{
			name: "half open, zero milliseconds",
			line: "2026-01-02T03:04:05.000Z|CLAIM|OPEN->HALF_OPEN",
			want: breakerlog.Entry{At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Name: "CLAIM", From: breaker.Open, To: breaker.HalfOpen},
		},
		{
			name: "same state both sides is syntax, left to CheckChains",
			line: "2026-11-30T05:31:19.123Z|CORE|OPEN->OPEN",
			want: breakerlog.Entry{At: at, Name: "CORE", From: breaker.Open, To: breaker.Open},
		},
	}
	for _, tt := range good {
		t.Run(tt.name, func(t *testing.T) {
			got, err := breakerlog.ParseLine(tt.line)
			require.NoError(t, err)
			assert.True(t, tt.want.At.Equal(got.At), "time %v, want %v", got.At, tt.want.At)
			assert.Equal(t, time.UTC, got.At.Location())
			assert.Equal(t, tt.want.Name, got.Name)
			assert.Equal(t, tt.want.From, got.From)
			assert.Equal(t, tt.want.To, got.To)
			assert.Equal(t, tt.line, got.String(), "an entry prints back as its line")
		})
	}

	bad := []struct {
		name    string
		line    string
		wantMsg string
	}{
		{name: "empty", line: "", wantMsg: "got 1"},
		{name: "two fields", line: "2026-11-30T05:31:19.123Z|CLOSED->OPEN", wantMsg: "got 2"},
		{name: "four fields", line: "2026-11-30T05:31:19.123Z|CORE|CLOSED->OPEN|x", wantMsg: "got 4"},
		{name: "trailing newline", line: "2026-11-30T05:31:19.123Z|CORE|CLOSED->OPEN\n", wantMsg: "unknown state"},
		{name: "trailing CR", line: "2026-11-30T05:31:19.123Z|CORE|CLOSED->OPEN\r", wantMsg: "unknown state"},
		{name: "not a time", line: "yesterday|CORE|CLOSED->OPEN", wantMsg: "bad time"},
		{name: "no milliseconds", line: "2026-11-30T05:31:19Z|CORE|CLOSED->OPEN", wantMsg: "bad time"},
		{name: "two digits of milliseconds", line: "2026-11-30T05:31:19.12Z|CORE|CLOSED->OPEN", wantMsg: "bad time"},
		{name: "microseconds", line: "2026-11-30T05:31:19.123456Z|CORE|CLOSED->OPEN", wantMsg: "bad time"},
		{name: "offset instead of Z", line: "2026-11-30T06:31:19.123+01:00|CORE|CLOSED->OPEN", wantMsg: "not UTC"},
		{name: "zero offset instead of Z", line: "2026-11-30T05:31:19.123+00:00|CORE|CLOSED->OPEN", wantMsg: "not UTC"},
		{name: "space instead of T", line: "2026-11-30 05:31:19.123Z|CORE|CLOSED->OPEN", wantMsg: "bad time"},
		{name: "impossible date", line: "2026-02-30T05:31:19.123Z|CORE|CLOSED->OPEN", wantMsg: "bad time"},
		{name: "empty name", line: "2026-11-30T05:31:19.123Z||CLOSED->OPEN", wantMsg: "empty target name"},
		{name: "space in name", line: "2026-11-30T05:31:19.123Z| CORE|CLOSED->OPEN", wantMsg: "target name"},
		{name: "no arrow", line: "2026-11-30T05:31:19.123Z|CORE|CLOSED", wantMsg: "want FROM->TO"},
		{name: "other arrow", line: "2026-11-30T05:31:19.123Z|CORE|CLOSED=>OPEN", wantMsg: "want FROM->TO"},
		{name: "two arrows", line: "2026-11-30T05:31:19.123Z|CORE|CLOSED->OPEN->HALF_OPEN", wantMsg: "unknown state"},
		{name: "lower case state", line: "2026-11-30T05:31:19.123Z|CORE|closed->OPEN", wantMsg: "unknown state"},
		{name: "unknown state", line: "2026-11-30T05:31:19.123Z|CORE|CLOSED->UNKNOWN", wantMsg: "unknown state"},
		{name: "half open spelled with a space", line: "2026-11-30T05:31:19.123Z|CORE|OPEN->HALF OPEN", wantMsg: "unknown state"},
		{name: "empty from", line: "2026-11-30T05:31:19.123Z|CORE|->OPEN", wantMsg: "unknown state"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := breakerlog.ParseLine(tt.line)
			require.Error(t, err)
			assert.ErrorIs(t, err, breakerlog.ErrMalformed)
			assert.ErrorContains(t, err, tt.wantMsg)
			assert.ErrorContains(t, err, fmt.Sprintf("%q", tt.line), "the error quotes the line")
		})
	}
}

func TestParseLineRoundTrip(t *testing.T) {
	zones := []*time.Location{time.UTC, time.FixedZone("A", 5*3600+1800), time.FixedZone("B", -8*3600)}
	states := []breaker.State{breaker.Closed, breaker.Open, breaker.HalfOpen}
	for i, zone := range zones {
		for _, from := range states {
			for _, to := range states {
				tr := breaker.Transition{
					Name: fmt.Sprintf("T%d", i),
					From: from,
					To:   to,
					At:   time.Date(2026, 11, 30, 5, 31, 19, 123_456_789, zone),
				}
				line := breakerlog.AppendLine(nil, tr)
				got, err := breakerlog.ParseLine(strings.TrimSuffix(string(line), "\n"))
				require.NoError(t, err, "line %q", line)
				assert.True(t, got.At.Equal(tr.At.Truncate(time.Millisecond)), "line %q", line)
				assert.Equal(t, tr.Name, got.Name)
				assert.Equal(t, from, got.From)
				assert.Equal(t, to, got.To)
			}
		}
	}
}

func TestRead(t *testing.T) {
	const (
		l1 = "2026-11-30T05:31:19.123Z|CORE|CLOSED->OPEN"
		l2 = "2026-11-30T05:31:29.123Z|CORE|OPEN->HALF_OPEN"
	)
	tests := []struct {
		name          string
		text          string
		wantN         int
		wantFragments []int
		wantErr       string
	}{
		{name: "empty file", text: "", wantN: 0},
		{name: "two lines", text: l1 + "\n" + l2 + "\n", wantN: 2},
		{name: "a whole last line without its newline", text: l1 + "\n" + l2, wantN: 2},
		{name: "torn last line", text: l1 + "\n2026-11-30T05:3", wantN: 1, wantFragments: []int{2}},
		{name: "torn in the name", text: l1 + "\n2026-11-30T05:31:29.123Z|CO", wantN: 1, wantFragments: []int{2}},
		{name: "torn in the change", text: l1 + "\n2026-11-30T05:31:29.123Z|CORE|OPEN->HA", wantN: 1, wantFragments: []int{2}},
		{name: "torn lines on lines of their own", text: "2026-11\n" + l1 + "\n2026-11-30T05:31:29.123Z|\n" + l2 + "\n2\n", wantN: 2, wantFragments: []int{1, 3, 5}},
		{name: "a line run on from a fragment", text: "2026" + l1 + "\n", wantErr: "line 1:"},
		{name: "a bad time", text: "2026-13-30T05:31:19.123Z|CO\n", wantErr: "line 1:"},
		{name: "an unknown change", text: "2026-11-30T05:31:19.123Z|CORE|OPEN->SHUT\n", wantErr: "line 1:"},
		{name: "garbage last line", text: l1 + "\nhello", wantN: 1, wantErr: "no newline at end of file"},
		{name: "blank line", text: l1 + "\n\n" + l2 + "\n", wantN: 1, wantErr: "line 2:"},
		{name: "garbage line", text: l1 + "\n" + l2 + "\nhello\n", wantN: 2, wantErr: "line 3:"},
		{name: "CRLF line ends", text: l1 + "\r\n", wantN: 0, wantErr: "line 1:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			entries, fragments, err := breakerlog.Read(strings.NewReader(tt.text))
			if tt.wantErr == "" {
				require.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, breakerlog.ErrMalformed)
				assert.ErrorContains(t, err, tt.wantErr)
			}
			assert.Len(t, entries, tt.wantN, "entries read before the error")
			assert.Equal(t, tt.wantFragments, fragments)
		})
	}
}

func TestReadFileNamesPath(t *testing.T) {
	dir := t.TempDir()

	missing := filepath.Join(dir, "missing.log")
	_, _, err := breakerlog.ReadFile(missing)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.ErrorContains(t, err, missing)

	bad := filepath.Join(dir, "bad.log")
	require.NoError(t, os.WriteFile(bad, []byte("not a log line\n"), 0o644))
	_, _, err = breakerlog.ReadFile(bad)
	assert.ErrorIs(t, err, breakerlog.ErrMalformed)
	assert.ErrorContains(t, err, bad)
	assert.ErrorContains(t, err, "line 1:")
}

func TestCheckChains(t *testing.T) {
	e := func(name string, from, to breaker.State) breakerlog.Entry {
		return breakerlog.Entry{At: at, Name: name, From: from, To: to}
	}
	const (
		c = breaker.Closed
		o = breaker.Open
		h = breaker.HalfOpen
	)
	tests := []struct {
		name    string
		entries []breakerlog.Entry
		wantErr string
	}{
		{name: "empty", entries: nil},
		{
			name: "full cycle with a failed probe",
			entries: []breakerlog.Entry{
				e("CORE", c, o), e("CORE", o, h), e("CORE", h, o), e("CORE", o, h), e("CORE", h, c), e("CORE", c, o),
			},
		},
		{
			name:    "manual close of an open breaker is a chain",
			entries: []breakerlog.Entry{e("CORE", c, o), e("CORE", o, c)},
		},
		{
			name: "two targets interleaved",
			entries: []breakerlog.Entry{
				e("CORE", c, o), e("CLAIM", c, o), e("CORE", o, h), e("CLAIM", o, h), e("CLAIM", h, c), e("CORE", h, o),
			},
		},
		{
			name:    "first FROM not CLOSED",
			entries: []breakerlog.Entry{e("CORE", o, h)},
			wantErr: "line 1 (2026-11-30T05:31:19.123Z|CORE|OPEN->HALF_OPEN): first change of CORE starts from OPEN, want CLOSED",
		},
		{
			name:    "second target's first FROM not CLOSED",
			entries: []breakerlog.Entry{e("CORE", c, o), e("CLAIM", h, c)},
			wantErr: "line 2 (2026-11-30T05:31:19.123Z|CLAIM|HALF_OPEN->CLOSED): first change of CLAIM starts from HALF_OPEN",
		},
		{
			name:    "broken chain",
			entries: []breakerlog.Entry{e("CORE", c, o), e("CORE", o, h), e("CORE", o, h)},
			wantErr: "line 3 (2026-11-30T05:31:19.123Z|CORE|OPEN->HALF_OPEN): CORE starts from OPEN but line 2 left it HALF_OPEN",
		},
		{
			name:    "missing line",
			entries: []breakerlog.Entry{e("CORE", c, o), e("CORE", h, c)},
			wantErr: "line 2 (2026-11-30T05:31:19.123Z|CORE|HALF_OPEN->CLOSED): CORE starts from HALF_OPEN but line 1 left it OPEN",
		},
		{
			name:    "break in one of two interleaved targets",
			entries: []breakerlog.Entry{e("CORE", c, o), e("CLAIM", c, o), e("CORE", o, h), e("CLAIM", h, c)},
			wantErr: "line 4 (2026-11-30T05:31:19.123Z|CLAIM|HALF_OPEN->CLOSED): CLAIM starts from HALF_OPEN but line 2 left it OPEN",
		},
		{
			name:    "targets are not mixed up",
			entries: []breakerlog.Entry{e("CORE", c, o), e("CLAIM", o, h)},
			wantErr: "line 2",
		},
		{
			name:    "FROM equals TO",
			entries: []breakerlog.Entry{e("CORE", c, o), e("CORE", o, o)},
			wantErr: "line 2 (2026-11-30T05:31:19.123Z|CORE|OPEN->OPEN): CORE goes from OPEN to itself",
		},
		{
			name:    "CLOSED to CLOSED as first line",
			entries: []breakerlog.Entry{e("CORE", c, c)},
			wantErr: "to itself",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := breakerlog.CheckChains(tt.entries)
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorIs(t, err, breakerlog.ErrBrokenChain)
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}
