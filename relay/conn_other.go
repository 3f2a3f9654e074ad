//go:build !unix

package relay

import "errors"

// rawReads reports that connections read through net.Conn.Read, holding a
// read buffer while they wait for input: waiting for readability needs a
// Unix read on the descriptor.
const rawReads = false

// readFD and writeFD are not used where rawReads is false.
func readFD(uintptr, []byte) (int, bool, error) {
	return 0, false, errors.ErrUnsupported
}

func writeFD(uintptr, []byte) (int, bool, error) {
	return 0, false, errors.ErrUnsupported
}

// waitReadable is not used where rawReads is false.
func waitReadable(uintptr) bool {
	return true
}
