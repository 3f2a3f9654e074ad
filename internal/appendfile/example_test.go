package appendfile_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/relayhub/relayhub/internal/appendfile"
)

func Example() {
	dir, err := os.MkdirTemp("", "appendfile-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "access.log")

	f, err := appendfile.Open(path)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	_, _ = f.Write([]byte("T1|CORE|0000\nT2|CO"))
	// logrotate renames the file, then SIGHUP reopens it: the line in
	// progress ends in the old file.
	if err := os.Rename(path, path+".1"); err != nil {
		panic(err)
	}
	if err := f.Reopen(); err != nil {
		panic(err)
	}
	_, _ = f.Write([]byte("RE|0000\nT3|CORE|0000\n"))

	old, _ := os.ReadFile(path + ".1")
	cur, _ := os.ReadFile(path)
	fmt.Printf("old: %q\nnew: %q\n", old, cur)
	// Output:
	// old: "T1|CORE|0000\nT2|CORE|0000\n"
	// new: "T3|CORE|0000\n"
}
