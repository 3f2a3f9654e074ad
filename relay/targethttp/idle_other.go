//go:build !unix

package targethttp

// idleCheckSupported reports that there is no peek at a socket here: a
// connection the target closed while idle is found by the request written
// on it, and the call is in doubt.
const idleCheckSupported = false

// peekIdle is never called here.
func (c *targetConn) peekIdle(uintptr) {}
