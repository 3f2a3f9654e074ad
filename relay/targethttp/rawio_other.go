//go:build !unix

package targethttp

// canPeek reports that peekReadable, writeFD and readFD do not work here:
// idle target connections go unchecked, and requests are written by Write.
const canPeek = false

// These are never called where canPeek is false.

func peekReadable(uintptr) bool { return false }

func writeFD(uintptr, []byte) (int, bool, error) { return 0, false, nil }

func readFD(uintptr, []byte) (int, bool, error) { return 0, false, nil }
