// Package disktest gives tests a file system of their own to fill or to
// freeze, for the hub's own disk as a failure domain: a small tmpfs that a
// filler file makes full, and a loop-mounted ext4 image that fsfreeze
// stalls. Both need root, which CI has: elsewhere the test is skipped.
// Every mount is undone when the test ends, frozen or not, passed or
// failed.
//
// Typical use:
//
//	dir := disktest.Tmpfs(t, 64<<10)
//	filler := disktest.Fill(t, dir) // the file system is full
//	// ... writes fail with ENOSPC ...
//	require.NoError(t, os.Remove(filler)) // space is back
package disktest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// NeedRoot skips t unless it runs as root; in CI (CI set) it fails it
// instead, so the tests that mount always run there.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	why := "not root (uid " + strconv.Itoa(os.Geteuid()) + "): this test mounts a file system; run it as root, as CI does"
	if os.Getenv("CI") != "" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// run runs a command and fails t with its output if it fails.
func run(t testing.TB, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	require.NoError(t, err, "%s %s: %s", name, strings.Join(args, " "), out)
}

// unmount unmounts dir, lazily if it is busy (a process of the test still
// has a file open there), so that a failed test leaves no mount behind.
func unmount(t testing.TB, dir string) {
	if err := syscall.Unmount(dir, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	}
}

// Tmpfs mounts a tmpfs of size bytes on a new directory and returns it. It
// is unmounted when the test ends.
func Tmpfs(t testing.TB, size int) string {
	t.Helper()
	NeedRoot(t)
	dir := t.TempDir()
	run(t, "mount", "-t", "tmpfs", "-o", "size="+strconv.Itoa(size)+",mode=0755", "tmpfs", dir)
	t.Cleanup(func() { unmount(t, dir) })
	return dir
}

// Fill makes the file system of dir full with a file it creates there, and
// returns that file's path: removing it frees the space again.
func Fill(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	require.NoError(t, err)
	defer f.Close()
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC, "filling %s", dir)
			break
		}
	}
	// The last pages of a tmpfs go one byte at a time.
	for {
		if _, err := f.Write(chunk[:1]); err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC, "filling %s", dir)
			return path
		}
	}
}

// Ext4 makes an ext4 image of size bytes, loop-mounts it on a new directory
// and returns the directory. It is unmounted (thawed first, if frozen) and
// its loop device freed when the test ends.
func Ext4(t testing.TB, size int64) string {
	t.Helper()
	NeedRoot(t)
	image := filepath.Join(t.TempDir(), "disk.img")
	require.NoError(t, os.WriteFile(image, nil, 0o600))
	require.NoError(t, os.Truncate(image, size))
	run(t, "mkfs.ext4", "-q", "-F", image)
	dir := t.TempDir()
	run(t, "mount", "-o", "loop", image, dir)
	t.Cleanup(func() {
		// Unfreeze first: a frozen file system cannot be unmounted, and
		// the processes the test started may still wait on it.
		_ = exec.Command("fsfreeze", "-u", dir).Run()
		unmount(t, dir)
	})
	return dir
}

// Freeze stalls every write to the file system mounted on dir (fsfreeze
// -f) until Thaw or the end of the test. Its cleanup thaws it before those
// registered earlier run: a process stuck writing there cannot be killed
// and waited for until then.
func Freeze(t testing.TB, dir string) {
	t.Helper()
	run(t, "fsfreeze", "-f", dir)
	t.Cleanup(func() { _ = exec.Command("fsfreeze", "-u", dir).Run() })
}

// Thaw lets the writes to the file system mounted on dir go on.
func Thaw(t testing.TB, dir string) {
	t.Helper()
	run(t, "fsfreeze", "-u", dir)
}
