package breakerlog_test

import (
	"fmt"
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

// line returns the log line, newline included, of target's change from
// from to to at at.Add(ms milliseconds).
func line(target string, from, to breaker.State, ms int) (breaker.Transition, string) {
	tr := breaker.Transition{Name: target, From: from, To: to, At: at.Add(time.Duration(ms) * time.Millisecond)}
	return tr, string(breakerlog.AppendLine(nil, tr))
}

// write writes tr and fails the test on error.
func write(t *testing.T, bl *breakerlog.Log, tr breaker.Transition) {
	t.Helper()
	require.NoError(t, bl.Write(tr))
}

func TestSecondOpenOfALockedFileFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "breaker.log")
	link := filepath.Join(dir, "link.log")
	require.NoError(t, os.Symlink(path, link))

	// Given a log that one relay has open
	first, err := breakerlog.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = first.Close() })

	for _, p := range []string{path, link} {
		t.Run(filepath.Base(p), func(t *testing.T) {
			// When a second relay opens the same file, by its path or
			// through another name
			second, err := breakerlog.New(breakerlog.Config{Path: p})

			// Then it is refused with an error that says why and where
			require.Error(t, err)
			assert.Nil(t, second)
			assert.ErrorIs(t, err, breakerlog.ErrLocked)
			assert.ErrorContains(t, err, fmt.Sprintf("breaker log %q", p))
			assert.ErrorContains(t, err, "another relay holds it")
			assert.NotContains(t, err.Error(), "\n", "one line")
		})
	}

	// And the first one keeps its file to itself: nothing was written to it
	tr, want := line("CORE", breaker.Closed, breaker.Open, 0)
	write(t, first, tr)
	assert.Equal(t, want, readText(t, path))

	// Once the first is closed, the file can be opened again.
	require.NoError(t, first.Close())
	again, err := breakerlog.Open(path)
	require.NoError(t, err)
	require.NoError(t, again.Close())
}

func TestDevicesAreNotLocked(t *testing.T) {
	// Two logs on /dev/null have no chains to keep apart. (Close's fsync
	// fails on a device, so its error is not checked here.)
	a, err := breakerlog.Open(os.DevNull)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	b, err := breakerlog.Open(os.DevNull)
	require.NoError(t, err)
	_ = b.Close()
}

func TestReopenAfterRename(t *testing.T) {
	bl, path := openTemp(t)
	rotated := path + ".1"
	tr1, l1 := line("CORE", breaker.Closed, breaker.Open, 0)
	tr2, l2 := line("CORE", breaker.Open, breaker.HalfOpen, 10)
	tr3, l3 := line("CORE", breaker.HalfOpen, breaker.Closed, 20)

	// Given a line in the log, and the file renamed as logrotate does
	write(t, bl, tr1)
	require.NoError(t, os.Rename(path, rotated))

	// when a line comes before Reopen and another after it,
	write(t, bl, tr2)
	require.NoError(t, bl.Reopen())
	write(t, bl, tr3)

	// then the lines before Reopen are in the renamed file, the one after
	// it in a new file at the path, and the chain goes on across the two.
	assert.Equal(t, l1+l2, readText(t, rotated))
	assert.Equal(t, l3, readText(t, path))
	assert.Equal(t, path, bl.Path())
	entries := readRotated(t, rotated, path)
	assert.Len(t, entries, 3)
	assert.NoError(t, breakerlog.CheckChains(entries))

	// The lock went with the log: the new file is held, the renamed one free.
	_, err := breakerlog.Open(path)
	assert.ErrorIs(t, err, breakerlog.ErrLocked)
	old, err := breakerlog.Open(rotated)
	require.NoError(t, err, "the renamed file's lock was not released")
	require.NoError(t, old.Close())
}

func TestReopenWithoutRenameKeepsTheFile(t *testing.T) {
	bl, path := openTemp(t)
	tr1, l1 := line("CORE", breaker.Closed, breaker.Open, 0)
	tr2, l2 := line("CORE", breaker.Open, breaker.HalfOpen, 10)

	// Given a log whose file was not moved, when Reopen is called between
	// two lines
	write(t, bl, tr1)
	require.NoError(t, bl.Reopen())
	write(t, bl, tr2)

	// then both lines are in the one file, and the log still holds its lock.
	assert.Equal(t, l1+l2, readText(t, path))
	_, err := breakerlog.Open(path)
	assert.ErrorIs(t, err, breakerlog.ErrLocked)
}

func TestFailedReopenKeepsWritingToTheOldFile(t *testing.T) {
	tests := []struct {
		name  string
		block func(t *testing.T, path string) (unblock func())
		is    error
	}{
		{
			name: "a directory where the new file should be",
			block: func(t *testing.T, path string) func() {
				require.NoError(t, os.Mkdir(path, 0o755))
				return func() { require.NoError(t, os.Remove(path)) }
			},
			is: syscall.EISDIR,
		},
		{
			name: "another relay already on the new file",
			block: func(t *testing.T, path string) func() {
				other, err := breakerlog.Open(path)
				require.NoError(t, err)
				return func() {
					require.NoError(t, other.Close())
					require.NoError(t, os.Remove(path))
				}
			},
			is: breakerlog.ErrLocked,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bl, path := openTemp(t)
			rotated := path + ".1"
			tr1, l1 := line("CORE", breaker.Closed, breaker.Open, 0)
			tr2, l2 := line("CORE", breaker.Open, breaker.HalfOpen, 10)
			tr3, l3 := line("CORE", breaker.HalfOpen, breaker.Closed, 20)

			// Given a renamed log whose path cannot take a new file,
			write(t, bl, tr1)
			require.NoError(t, os.Rename(path, rotated))
			unblock := tt.block(t, path)

			// when Reopen is called, it fails naming the path,
			err := bl.Reopen()
			require.Error(t, err)
			assert.ErrorIs(t, err, tt.is)
			assert.ErrorContains(t, err, fmt.Sprintf("breaker log %q: reopen", path))

			// and lines go on into the old file, which stays locked.
			write(t, bl, tr2)
			assert.Equal(t, l1+l2, readText(t, rotated))
			_, err = breakerlog.Open(rotated)
			assert.ErrorIs(t, err, breakerlog.ErrLocked)

			// Once the path is free, the next Reopen works.
			unblock()
			require.NoError(t, bl.Reopen())
			write(t, bl, tr3)
			assert.Equal(t, l1+l2, readText(t, rotated))
			assert.Equal(t, l3, readText(t, path))
		})
	}
}

func TestReopenAfterClose(t *testing.T) {
	bl, path := openTemp(t)
	require.NoError(t, bl.Close())
	require.NoError(t, os.Rename(path, path+".1"))

	err := bl.Reopen()

	assert.ErrorIs(t, err, os.ErrClosed)
	assert.ErrorContains(t, err, path)
	_, statErr := os.Stat(path)
	assert.NoError(t, statErr, "Reopen may create the file, it must not hold it")
	again, err := breakerlog.Open(path)
	require.NoError(t, err, "a closed log's Reopen left the new file locked")
	require.NoError(t, again.Close())
}

// TestReopenUnderConcurrentWriters rotates the log three times while 32
// goroutines write their targets' chains, and checks that the files, read
// in rotation order, hold every line exactly once, whole, with each chain
// unbroken across the files.
func TestReopenUnderConcurrentWriters(t *testing.T) {
	const (
		writers   = 32
		perPhase  = 200 // lines per writer per phase
		rotations = 3
	)
	bl, path := openTemp(t)
	cycle := []struct{ from, to breaker.State }{
		{breaker.Closed, breaker.Open},
		{breaker.Open, breaker.HalfOpen},
		{breaker.HalfOpen, breaker.Open},
		{breaker.Open, breaker.HalfOpen},
		{breaker.HalfOpen, breaker.Closed},
	}
	next := make([]int, writers) // per writer, the index of its next line
	// phase has every writer write perPhase more lines of its chain at
	// once, while rotate, if not nil, runs beside them.
	phase := func(rotate func() error) {
		t.Helper()
		start := make(chan struct{})
		errs := make(chan error, writers+1)
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				<-start
				name := fmt.Sprintf("TARGET-%02d", w)
				for range perPhase {
					i := next[w]
					next[w]++
					step := cycle[i%len(cycle)]
					tr := breaker.Transition{Name: name, From: step.from, To: step.to, At: at.Add(time.Duration(i) * time.Millisecond)}
					if err := bl.Write(tr); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		if rotate != nil {
			wg.Go(func() {
				<-start
				errs <- rotate()
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
	}

	// Given lines already in the file, then three phases of writing, each
	// with a rename and a Reopen in the middle of it, and a last phase
	var files []string
	phase(nil)
	for r := rotations; r >= 1; r-- {
		rotated := fmt.Sprintf("%s.%d", path, r)
		files = append(files, rotated)
		phase(func() error {
			if err := os.Rename(path, rotated); err != nil {
				return err
			}
			return bl.Reopen()
		})
	}
	files = append(files, path)
	phase(nil)
	require.NoError(t, bl.Close())

	// Then every file has lines, none torn, and all of them read in
	// rotation order are every line written, each chain unbroken.
	for _, f := range files {
		text := readText(t, f)
		assert.NotEmpty(t, text, f)
		assert.True(t, strings.HasSuffix(text, "\n"), "%s ends in a torn line", f)
	}
	entries := readRotated(t, files...)
	require.Len(t, entries, writers*perPhase*(rotations+2))
	require.NoError(t, breakerlog.CheckChains(entries))
	perTarget := map[string]int{}
	for _, e := range entries {
		perTarget[e.Name]++
	}
	assert.Len(t, perTarget, writers)
	for name, n := range perTarget {
		assert.Equal(t, perPhase*(rotations+2), n, name)
	}
}

// readRotated parses files in order, oldest first, as one log.
func readRotated(t *testing.T, files ...string) []breakerlog.Entry {
	t.Helper()
	var all []breakerlog.Entry
	for _, f := range files {
		entries, _, err := breakerlog.ReadFile(f)
		require.NoError(t, err)
		all = append(all, entries...)
	}
	return all
}

func TestSyncFsyncsEveryLine(t *testing.T) {
	// A FIFO takes the write but cannot be fsynced (EINVAL), so it shows
	// whether Write syncs after each line. A reader opened first lets the
	// log open the FIFO without blocking.
	path := filepath.Join(t.TempDir(), "breaker.fifo")
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	reader, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reader.Close() })
	tr, want := line("CORE", breaker.Closed, breaker.Open, 0)

	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprintf("sync=%v", sync), func(t *testing.T) {
			bl, err := breakerlog.New(breakerlog.Config{Path: path, Sync: sync})
			require.NoError(t, err)
			t.Cleanup(func() { _ = bl.Close() })

			err = bl.Write(tr)

			if sync {
				assert.ErrorIs(t, err, syscall.EINVAL, "Write did not fsync")
				assert.ErrorContains(t, err, path)
			} else {
				assert.NoError(t, err, "Write must not fsync by default")
			}
			buf := make([]byte, 256)
			n, err := reader.Read(buf)
			require.NoError(t, err)
			assert.Equal(t, want, string(buf[:n]), "the line is written before the sync")
		})
	}
}

func TestSyncWritesToAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "breaker.log")
	bl, err := breakerlog.New(breakerlog.Config{Path: path, Sync: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = bl.Close() })
	tr1, l1 := line("CORE", breaker.Closed, breaker.Open, 0)
	tr2, l2 := line("CORE", breaker.Open, breaker.HalfOpen, 10)

	write(t, bl, tr1)
	write(t, bl, tr2)

	assert.Equal(t, l1+l2, readText(t, path))
}

// BenchmarkWrite measures one line written to a file on the temporary
// directory's file system, with and without an fsync per line.
func BenchmarkWrite(b *testing.B) {
	for _, sync := range []bool{false, true} {
		b.Run(fmt.Sprintf("sync=%v", sync), func(b *testing.B) {
			bl, err := breakerlog.New(breakerlog.Config{Path: filepath.Join(b.TempDir(), "breaker.log"), Sync: sync})
			require.NoError(b, err)
			b.Cleanup(func() { _ = bl.Close() })
			tr := breaker.Transition{Name: "CORE", From: breaker.Closed, To: breaker.Open, At: at}
			b.ReportAllocs()
			for b.Loop() {
				if err := bl.Write(tr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
