//go:build !unix

package sockio

import "errors"

// Supported reports that this package cannot reach a socket's descriptor
// here: callers read and write through net.Conn instead, and call nothing
// below.
const Supported = false

// Read is not supported here.
func Read(uintptr, []byte) (int, bool, error) { return 0, false, errors.ErrUnsupported }

// Write is not supported here.
func Write(uintptr, []byte) (int, bool, error) { return 0, false, errors.ErrUnsupported }

// Readable is not supported here: it reports true, so that a wait for
// readability would end at once.
func Readable(uintptr) bool { return true }
