package lockedfile_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/lockedfile"
)

// openTemp opens a new file in a temporary directory, closed when the test
// ends.
func openTemp(t *testing.T) (*os.File, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "journal.log")
	f, err := lockedfile.Open(path, 0o640)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	return f, path
}

func TestOpenHoldsTheFileUntilClosed(t *testing.T) {
	f, path := openTemp(t)
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Zero(t, info.Mode().Perm()&^0o640, "created with no permission beyond the mode asked")

	_, err = lockedfile.Open(path, 0o640)
	require.ErrorIs(t, err, lockedfile.ErrLocked, "a second open of a held file")

	require.NoError(t, f.Close())
	again, err := lockedfile.Open(path, 0o640)
	require.NoError(t, err, "closing releases the lock")
	require.NoError(t, again.Close())
}

func TestOpenAppendsAndLocksNoFileThatIsNotRegular(t *testing.T) {
	_, path := openTemp(t)
	require.NoError(t, os.WriteFile(path+".old", []byte("kept\n"), 0o640))
	f, err := lockedfile.Open(path+".old", 0o640)
	require.NoError(t, err)
	_, err = f.WriteString("appended\n")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	got, err := os.ReadFile(path + ".old")
	require.NoError(t, err)
	assert.Equal(t, "kept\nappended\n", string(got))

	a, err := lockedfile.Open(os.DevNull, 0o640)
	require.NoError(t, err)
	b, err := lockedfile.Open(os.DevNull, 0o640)
	require.NoError(t, err, "/dev/null is not locked")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
}

func TestReopen(t *testing.T) {
	t.Run("nothing renamed", func(t *testing.T) {
		f, path := openTemp(t)
		nf, err := lockedfile.Reopen(f, path, 0o640)
		require.NoError(t, err)
		assert.Nil(t, nf)
		_, err = lockedfile.Open(path, 0o640)
		assert.ErrorIs(t, err, lockedfile.ErrLocked, "the file is still held through f")
	})
	t.Run("renamed", func(t *testing.T) {
		f, path := openTemp(t)
		require.NoError(t, os.Rename(path, path+".1"))
		nf, err := lockedfile.Reopen(f, path, 0o640)
		require.NoError(t, err)
		require.NotNil(t, nf)
		defer nf.Close()
		_, err = lockedfile.Open(path, 0o640)
		assert.ErrorIs(t, err, lockedfile.ErrLocked, "the new file is held")
		require.NoError(t, f.Close())
		old, err := lockedfile.Open(path+".1", 0o640)
		require.NoError(t, err, "closing the old file released its lock")
		require.NoError(t, old.Close())
	})
	t.Run("the new file held by another", func(t *testing.T) {
		f, path := openTemp(t)
		require.NoError(t, os.Rename(path, path+".1"))
		other, err := lockedfile.Open(path, 0o640)
		require.NoError(t, err)
		defer other.Close()
		nf, err := lockedfile.Reopen(f, path, 0o640)
		assert.ErrorIs(t, err, lockedfile.ErrLocked)
		assert.Nil(t, nf)
	})
	t.Run("after close", func(t *testing.T) {
		f, path := openTemp(t)
		require.NoError(t, f.Close())
		require.NoError(t, os.Rename(path, path+".1"))
		nf, err := lockedfile.Reopen(f, path, 0o640)
		assert.ErrorIs(t, err, os.ErrClosed)
		assert.Nil(t, nf)
		again, err := lockedfile.Open(path, 0o640)
		require.NoError(t, err, "a failed Reopen holds nothing")
		require.NoError(t, again.Close())
	})
}
