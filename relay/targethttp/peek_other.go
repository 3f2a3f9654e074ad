//go:build !unix

package targethttp

// peekReadable is never called where canPeek is false.
// canPeek reports that peekReadable does not work here: idle target
// connections go unchecked.
const canPeek = false

func peekReadable(uintptr, []byte) bool { return false }
