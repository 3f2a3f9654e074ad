package lockedfile_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/lockedfile"
	"github.com/relayhub/relayhub/internal/testutil/disktest"
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
	assert.Equal(t, "a\n", content(f.Path()), "an append whose fsync failed is cut off")
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

// failingWrites is a Config.Write that writes the first n bytes of the
// next append for real and then fails it with ENOSPC, as a full disk does;
// appends after that one succeed.
type failingWrites struct {
	n    int
	used bool
}

func (w *failingWrites) write(f *os.File, p []byte) (int, error) {
	if w.used {
		return f.Write(p)
	}
	w.used = true
	k, err := f.Write(p[:min(w.n, len(p))])
	if err != nil {
		return k, err
	}
	return k, syscall.ENOSPC
}

func TestAFailedAppendIsCutOff(t *testing.T) {
	for _, n := range []int{0, 1, 5, 8} {
		t.Run(fmt.Sprintf("%d bytes written", n), func(t *testing.T) {
			// Given a file with a line in it, whose next append fails
			// after n of its 9 bytes,
			w := &failingWrites{n: n}
			f, err := lockedfile.Open(lockedfile.Config{Path: filepath.Join(t.TempDir(), "j.log"), Write: w.write})
			require.NoError(t, err)
			t.Cleanup(func() { _ = f.Close() })
			w.used = true
			require.NoError(t, f.Append([]byte("first\n"), false))
			w.used = false

			// when it is appended and fails,
			err = f.Append([]byte("torn one\n"), false)

			// then the error is the write's, the file is as it was,
			require.ErrorIs(t, err, syscall.ENOSPC)
			assert.NotErrorIs(t, err, lockedfile.ErrTorn)
			assert.Equal(t, "first\n", content(f.Path()))

			// and the next append is a line of its own.
			require.NoError(t, f.Append([]byte("next\n"), false))
			assert.Equal(t, "first\nnext\n", content(f.Path()))
		})
	}
}

func TestAShortWriteIsAnErrorAndCutOff(t *testing.T) {
	f, err := lockedfile.Open(lockedfile.Config{
		Path:  filepath.Join(t.TempDir(), "j.log"),
		Write: func(f *os.File, p []byte) (int, error) { return f.Write(p[:len(p)/2]) },
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	assert.ErrorIs(t, f.Append([]byte("half of it\n"), false), io.ErrShortWrite)
	assert.Empty(t, content(f.Path()))
}

func TestAFailedAppendThatCannotBeCutOffLeavesALineOfItsOwn(t *testing.T) {
	for _, tt := range []struct {
		name    string
		written int
		sync    error
		want    string
	}{
		{name: "part of it written", written: 5, want: "first\ntorn \nnext\n"},
		{name: "all but its newline written", written: 8, want: "first\ntorn one\nnext\n"},
		{name: "written whole, the fsync failed", written: 9, sync: syscall.EIO, want: "first\ntorn one\nnext\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Given a file whose next append fails part way, or whose
			// fsync fails, and whose cut fails too,
			w := &failingWrites{n: tt.written, used: true}
			cutErr := errors.New("cut refused")
			syncErr := tt.sync
			f, err := lockedfile.Open(lockedfile.Config{
				Path:     filepath.Join(t.TempDir(), "j.log"),
				Write:    w.write,
				Truncate: func(*os.File, int64) error { return cutErr },
				Sync: func(f *os.File) error {
					if err := syncErr; err != nil {
						syncErr = nil
						return err
					}
					return f.Sync()
				},
			})
			require.NoError(t, err)
			t.Cleanup(func() { _ = f.Close() })
			require.NoError(t, f.Append([]byte("first\n"), false))
			w.used = tt.sync != nil

			// when it is appended,
			err = f.Append([]byte("torn one\n"), tt.sync != nil)

			// then the error says what is left in the file and why,
			require.ErrorIs(t, err, lockedfile.ErrTorn)
			require.ErrorIs(t, err, cutErr)
			if tt.sync != nil {
				assert.ErrorIs(t, err, tt.sync)
			} else {
				assert.ErrorIs(t, err, syscall.ENOSPC)
			}

			// and the next append starts on a new line after it, once.
			require.NoError(t, f.Append([]byte("next\n"), false))
			assert.Equal(t, tt.want, content(f.Path()))
		})
	}
}

func TestAFailedAppendAfterAFragmentStillStartsOnANewLine(t *testing.T) {
	// Given a file left with a fragment that could not be cut off,
	w := &failingWrites{n: 3, used: true}
	cut := errors.New("cut refused")
	f, err := lockedfile.Open(lockedfile.Config{
		Path:     filepath.Join(t.TempDir(), "j.log"),
		Write:    w.write,
		Truncate: func(*os.File, int64) error { return cut },
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	w.used = false
	require.ErrorIs(t, f.Append([]byte("torn\n"), false), lockedfile.ErrTorn)

	// when the next append writes only the newline it starts with before
	// it fails too, and is not cut off either,
	w.n, w.used = 1, false
	require.ErrorIs(t, f.Append([]byte("again\n"), false), lockedfile.ErrTorn)

	// then the one after does not start with a second newline.
	require.NoError(t, f.Append([]byte("next\n"), false))
	assert.Equal(t, "tor\nnext\n", content(f.Path()))
}

func TestOpenAfterATornLastLineStartsANewLine(t *testing.T) {
	// Given a file whose last line was torn by a crash of its writer,
	path := filepath.Join(t.TempDir(), "j.log")
	require.NoError(t, os.WriteFile(path, []byte("whole\ntor"), 0o640))

	// when it is opened and appended to,
	f, err := open(path)
	require.NoError(t, err)
	require.NoError(t, f.Append([]byte("next\n"), false))

	// then the fragment stays a line of its own, and so does the next one
	// after a rotation to a file that ends the same way.
	assert.Equal(t, "whole\ntor\nnext\n", content(path))
	require.NoError(t, os.Rename(path, path+".1"))
	require.NoError(t, os.WriteFile(path, []byte("tor"), 0o640))
	require.NoError(t, f.Reopen())
	require.NoError(t, f.Append([]byte("next\n"), false))
	require.NoError(t, f.Close())
	assert.Equal(t, "tor\nnext\n", content(path))
}

// TestAppendsOnAFullFileSystemAreWholeOrAbsent fills a real tmpfs and
// appends until a write fails part way at the end of the file's last
// page: every line in the file is whole, before and after space is freed.
func TestAppendsOnAFullFileSystemAreWholeOrAbsent(t *testing.T) {
	dir := disktest.Tmpfs(t, 64<<10)
	f, err := open(filepath.Join(dir, "j.log"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	line := func(i int) string { return fmt.Sprintf("line %04d %s\n", i, strings.Repeat("x", 290)) }
	require.NoError(t, f.Append([]byte(line(0)), false))

	// Given a full file system,
	filler := disktest.Fill(t, dir)

	// when lines are appended until they fail (the first few fit in the
	// file's last page),
	var written []string
	written = append(written, line(0))
	i := 1
	failed := 0
	for ; failed < 3; i++ {
		if err := f.Append([]byte(line(i)), false); err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC)
			require.NotErrorIs(t, err, lockedfile.ErrTorn)
			failed++
			continue
		}
		require.Zero(t, failed, "an append succeeded after one failed on a full file system")
		written = append(written, line(i))
	}
	// then the file holds exactly the lines that succeeded, none torn,
	assert.Equal(t, strings.Join(written, ""), content(f.Path()))

	// and once space is freed, appends go on after them.
	require.NoError(t, os.Remove(filler))
	require.NoError(t, f.Append([]byte(line(i)), true))
	written = append(written, line(i))
	assert.Equal(t, strings.Join(written, ""), content(f.Path()))
}
