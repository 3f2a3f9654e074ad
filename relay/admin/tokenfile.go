package admin

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// maxTokenFileBytes bounds what ReadTokenFile reads: a bearer token is a
// line of a few dozen bytes, a signed one a few hundred.
const maxTokenFileBytes = 4 << 10

// ReadTokenFile reads a bearer token from the file at path, as the relay's
// and relayctl's --admin-token-file take it: the whole file is the token,
// one line, its trailing newline ("\n" or "\r\n") dropped. It refuses,
// with an error naming the file, a file its group or others have any
// access to (mode&0o077 != 0: a secret must be its owner's alone), an
// empty one, one of more than one line, over 4 KiB, or with a control
// character or a space at either end of the token, which no
// "Authorization: Bearer" header could carry.
func ReadTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	// The mode of the file opened, not of the path: a file swapped in
	// between cannot pass the check for another.
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s: not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return "", fmt.Errorf("%s: mode %04o gives group or others access to the token; chmod 600 it", path, perm)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if len(b) > maxTokenFileBytes {
		return "", fmt.Errorf("%s: over %d bytes: not a token", path, maxTokenFileBytes)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	if err := checkToken(string(b)); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return string(b), nil
}

// checkToken says why token cannot be a bearer token, or returns nil.
func checkToken(token string) error {
	switch {
	case token == "":
		return errors.New("empty file: it must hold the token")
	case strings.ContainsAny(token, "\r\n"):
		return errors.New("more than one line: it must hold the token alone")
	case strings.ContainsFunc(token, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return errors.New("a control character in the token")
	case strings.TrimSpace(token) != token:
		return errors.New("the token begins or ends with spaces")
	}
	return nil
}
