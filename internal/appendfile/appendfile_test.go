package appendfile

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readFile returns the contents of path.
func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// writtenAndRenamed opens an access log in a temporary directory, writes
// first to it, renames it to path.1 as logrotate does, and writes then. It
// returns the file and its path.
func writtenAndRenamed(t *testing.T, first, then string) (*File, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "access.log")
	a, err := Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	_, err = a.Write([]byte(first))
	require.NoError(t, err)
	require.NoError(t, os.Rename(path, path+".1"))
	_, err = a.Write([]byte(then))
	require.NoError(t, err)
	return a, path
}

func TestFileReopenMovesWritingToANewFile(t *testing.T) {
	// Given an access log with a line in it, renamed as logrotate does,
	// and a line after the rename
	a, path := writtenAndRenamed(t, "one\n", "two\n")

	// When it is reopened, the next lines go to a new file at the path.
	require.NoError(t, a.Reopen())
	_, err := a.Write([]byte("three\n"))
	require.NoError(t, err)
	assert.Equal(t, "one\ntwo\n", readFile(t, path+".1"))
	assert.Equal(t, "three\n", readFile(t, path))
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(fileMode), info.Mode().Perm())
}

func TestFileReopenNeverSplitsALine(t *testing.T) {
	// Given a line half written when the file is rotated and reopened
	a, path := writtenAndRenamed(t, "one\ntw", "")
	require.NoError(t, a.Reopen())

	// When the rest of it comes, with the next lines, in chunks
	for _, chunk := range []string{"o", "-and-more", "\nthr", "ee\nfour\n"} {
		n, err := a.Write([]byte(chunk))
		require.NoError(t, err)
		assert.Equal(t, len(chunk), n)
	}

	// Then the old file ends with the whole line, the new one starts with
	// the next.
	assert.Equal(t, "one\ntwo-and-more\n", readFile(t, path+".1"))
	assert.Equal(t, "three\nfour\n", readFile(t, path))
}

func TestFileReopenFailureKeepsWriting(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "logs", "access.log")
	require.NoError(t, os.Mkdir(filepath.Dir(path), 0o755))
	a, err := Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })

	// When the directory is gone, the reopen fails and writing goes on in
	// the open file.
	require.NoError(t, os.Rename(filepath.Dir(path), filepath.Join(dir, "moved")))
	assert.Error(t, a.Reopen())
	_, err = a.Write([]byte("still here\n"))
	require.NoError(t, err)
	assert.Equal(t, "still here\n", readFile(t, filepath.Join(dir, "moved", "access.log")))
}

// TestAppendFileRotationUnderWrites rotates the file over and over while a
// writer sends lines in chunks of random sizes, as a buffered writer
// flushing a full buffer does. The files, oldest first, must hold every
// line once, in order, each one whole in one file.
func TestFileRotationUnderWrites(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "access.log")
	a, err := Open(path)
	require.NoError(t, err)

	const lines = 5000
	var want strings.Builder
	for i := range lines {
		fmt.Fprintf(&want, `{"txid":"T-%06d","code":"0000"}`+"\n", i)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		rest := []byte(want.String())
		for len(rest) > 0 {
			n := min(len(rest), 1+rng.IntN(200))
			_, err := a.Write(rest[:n])
			assert.NoError(t, err)
			rest = rest[n:]
		}
	})
	var rotated []string
	for i := 0; i < 50; i++ {
		old := fmt.Sprintf("%s.%03d", path, i)
		require.NoError(t, os.Rename(path, old))
		rotated = append(rotated, old)
		require.NoError(t, a.Reopen())
	}
	wg.Wait()
	require.NoError(t, a.Close())

	var got strings.Builder
	for _, p := range append(rotated, path) {
		content := readFile(t, p)
		if content != "" {
			assert.True(t, strings.HasSuffix(content, "\n"), "%s ends in the middle of a line", p)
		}
		got.WriteString(content)
	}
	assert.Equal(t, want.String(), got.String())
}
