package lockedfile_test

import (
	"errors"
	"fmt"
	"os"

	"github.com/relayhub/relayhub/internal/lockedfile"
)

func Example() {
	path := fmt.Sprintf("%s/lockedfile-example-%d.log", os.TempDir(), os.Getpid())
	defer os.Remove(path)
	defer os.Remove(path + ".1")

	f, err := lockedfile.Open(lockedfile.Config{Path: path})
	if err != nil {
		panic(err)
	}
	defer f.Close()
	_, err = lockedfile.Open(lockedfile.Config{Path: path})
	fmt.Println("second open refused:", errors.Is(err, lockedfile.ErrLocked))

	// logrotate renames the file, then the owner reopens it.
	_ = f.Append([]byte("before\n"), true)
	if err := os.Rename(path, path+".1"); err != nil {
		panic(err)
	}
	if err := f.Reopen(); err != nil {
		panic(err)
	}
	_ = f.Append([]byte("after\n"), true)
	old, _ := os.ReadFile(path + ".1")
	cur, _ := os.ReadFile(path)
	fmt.Printf("renamed: %q, new: %q\n", old, cur)
	// Output:
	// second open refused: true
	// renamed: "before\n", new: "after\n"
}
