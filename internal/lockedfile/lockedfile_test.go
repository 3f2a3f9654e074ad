package lockedfile_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/lockedfile"
)

// openTemp opens a new file in a temporary directory, closed when the test
// ends.
func openTemp(t *testing.T) *lockedfile.File {
	t.Helper()
	f, err := lockedfile.Open(lockedfile.Config{Path: filepath.Join(t.TempDir(), "journal.log")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// open opens path, as a second writer would.
func open(path string) (*lockedfile.File, error) {
	return lockedfile.Open(lockedfile.Config{Path: path})
}

// content returns the text of the file at path, or why it could not be
// read.
func content(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

func TestOpenHoldsTheFileUntilClosed(t *testing.T) {
	f := openTemp(t)
	info, err := os.Stat(f.Path())
	require.NoError(t, err)
	assert.Zero(t, info.Mode().Perm()&^0o640, "created with no permission beyond 0640")

	_, err = open(f.Path())
	require.ErrorIs(t, err, lockedfile.ErrLocked, "a second open of a held file")

	require.NoError(t, f.Close())
	assert.ErrorIs(t, f.Close(), os.ErrClosed, "a second Close")
	assert.ErrorIs(t, f.Append([]byte("late\n"), false), os.ErrClosed)
	again, err := open(f.Path())
	require.NoError(t, err, "closing releases the lock")
	require.NoError(t, again.Close())
}

func TestOpenAppendsAndLocksNoFileThatIsNotRegular(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.log")
	require.NoError(t, os.WriteFile(path, []byte("kept\n"), 0o640))
	f, err := open(path)
	require.NoError(t, err)
	require.NoError(t, f.Append([]byte("appended\n"), true))
	require.NoError(t, f.Close())
	assert.Equal(t, "kept\nappended\n", content(path))

	// Close's fsync fails on a device, so its error is not checked here.
	a, err := open(os.DevNull)
	require.NoError(t, err)
	b, err := open(os.DevNull)
	require.NoError(t, err, "/dev/null is not locked")
	_ = a.Close()
	_ = b.Close()
}

func TestAppendSyncs(t *testing.T) {
	var syncs int
	boom := errors.New("disk gone")
	f, err := lockedfile.Open(lockedfile.Config{
		Path: filepath.Join(t.TempDir(), "journal.log"),
		Sync: func(*os.File) error { syncs++; return boom },
	})
	require.NoError(t, err)
	require.NoError(t, f.Append([]byte("a\n"), false))
	assert.Zero(t, syncs, "no fsync unless asked")
	assert.ErrorIs(t, f.Append([]byte("b\n"), true), boom)
	assert.Equal(t, 1, syncs)
	assert.ErrorIs(t, f.Close(), boom, "Close syncs")
	assert.Equal(t, "a\nb\n", content(f.Path()))
}

func TestReopen(t *testing.T) {
	t.Run("nothing renamed", func(t *testing.T) {
		f := openTemp(t)
		require.NoError(t, f.Append([]byte("1\n"), false))
		require.NoError(t, f.Reopen())
		require.NoError(t, f.Append([]byte("2\n"), false))
		assert.Equal(t, "1\n2\n", content(f.Path()))
		_, err := open(f.Path())
		assert.ErrorIs(t, err, lockedfile.ErrLocked, "still held")
	})
	t.Run("renamed", func(t *testing.T) {
		f := openTemp(t)
		require.NoError(t, f.Append([]byte("1\n"), false))
		require.NoError(t, os.Rename(f.Path(), f.Path()+".1"))
		require.NoError(t, f.Append([]byte("2\n"), false))
		require.NoError(t, f.Reopen())
		require.NoError(t, f.Append([]byte("3\n"), false))
		assert.Equal(t, "1\n2\n", content(f.Path()+".1"), "until Reopen, the renamed file")
		assert.Equal(t, "3\n", content(f.Path()))
		_, err := open(f.Path())
		assert.ErrorIs(t, err, lockedfile.ErrLocked, "the new file is held")
		old, err := open(f.Path() + ".1")
		require.NoError(t, err, "the old file is closed, its lock released")
		require.NoError(t, old.Close())
	})
	t.Run("the new file held by another", func(t *testing.T) {
		f := openTemp(t)
		require.NoError(t, os.Rename(f.Path(), f.Path()+".1"))
		other, err := open(f.Path())
		require.NoError(t, err)
		defer other.Close()
		assert.ErrorIs(t, f.Reopen(), lockedfile.ErrLocked)
		require.NoError(t, f.Append([]byte("1\n"), false))
		assert.Equal(t, "1\n", content(f.Path()+".1"), "appends go on in the file they had")
	})
	t.Run("after close", func(t *testing.T) {
		f := openTemp(t)
		require.NoError(t, f.Close())
		require.NoError(t, os.Rename(f.Path(), f.Path()+".1"))
		assert.ErrorIs(t, f.Reopen(), os.ErrClosed)
		again, err := open(f.Path())
		require.NoError(t, err, "a failed Reopen holds nothing")
		require.NoError(t, again.Close())
	})
}

// TestReopenUnderConcurrentAppends renames and reopens the file while 16
// goroutines append lines of different lengths: every line is whole in
// exactly one of the two files.
func TestReopenUnderConcurrentAppends(t *testing.T) {
	const writers, each = 16, 200
	f := openTemp(t)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				line := fmt.Sprintf("w%d-%d %d %s\n", w, i, i%50, strings.Repeat("x", i%50))
				assert.NoError(t, f.Append([]byte(line), false))
			}
		})
	}
	require.NoError(t, os.Rename(f.Path(), f.Path()+".1"))
	require.NoError(t, f.Reopen())
	wg.Wait()

	seen := map[string]bool{}
	for _, path := range []string{f.Path() + ".1", f.Path()} {
		for _, line := range strings.Split(strings.TrimSuffix(content(path), "\n"), "\n") {
			if line == "" {
				continue // an empty file: every append came before or after the switch
			}
			fields := strings.SplitN(line, " ", 3)
			require.Len(t, fields, 3, "line %q", line)
			assert.Equal(t, fields[1], strconv.Itoa(len(fields[2])), "line %q is whole", line)
			assert.False(t, seen[fields[0]], "%s twice", fields[0])
			seen[fields[0]] = true
		}
	}
	assert.Len(t, seen, writers*each)
}
