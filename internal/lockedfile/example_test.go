package lockedfile_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/relayhub/relayhub/internal/lockedfile"
)

func Example() {
	dir, err := os.MkdirTemp("", "lockedfile")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "in-doubt.log")

	f, err := lockedfile.Open(path, 0o640)
	if err != nil {
		panic(err)
	}
	_, err = lockedfile.Open(path, 0o640)
	fmt.Println("second open:", errors.Is(err, lockedfile.ErrLocked))

	// logrotate renames the file, then the owner reopens it.
	if err := os.Rename(path, path+".1"); err != nil {
		panic(err)
	}
	nf, err := lockedfile.Reopen(f, path, 0o640)
	if err != nil {
		panic(err)
	}
	_ = f.Close()
	f = nf
	defer f.Close()
	_, err = os.Stat(path)
	fmt.Println("new file at the path:", err == nil)
	// Output:
	// second open: true
	// new file at the path: true
}
