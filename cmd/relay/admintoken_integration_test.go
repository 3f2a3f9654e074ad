package main_test

import (
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// These tests start the real relay and hold --admin-token-file to its
// contract (docs/OPERATING.md, "The admin token"): the token read from a
// file its owner alone may access, at start and again on SIGHUP.

// writeToken writes token and a newline to path, with mode 0600; an
// existing file keeps its mode.
func writeToken(t *testing.T, path, token string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(token+"\n"), 0o600))
}

// closeCore posts {"action":"close"} to CORE's breaker with token and
// returns the status.
func closeCore(t *testing.T, r *adminRelay, token string) int {
	t.Helper()
	code, body := adminPost(t, r, "/breakers/CORE", `{"action":"close"}`, token)
	require.Contains(t, []int{http.StatusOK, http.StatusUnauthorized}, code, body)
	return code
}

func TestSIGHUPRotatesTheAdminTokenFile(t *testing.T) {
	// Given a relay whose admin token is in a file,
	path := filepath.Join(t.TempDir(), "admin-token")
	writeToken(t, path, "old-token")
	r := startAdminRelay(t, "--target", "CORE=http://127.0.0.1:1", "--admin-token-file", path)
	require.Equal(t, http.StatusOK, closeCore(t, r, "old-token"))
	require.Equal(t, http.StatusUnauthorized, closeCore(t, r, "new-token"))

	// when the file gets a new token and the relay a SIGHUP,
	writeToken(t, path, "new-token")
	r.Signal(syscall.SIGHUP)
	proctest.Eventually(t, 5*time.Second, "the relay re-reads the token file", func() bool {
		return len(logMessages(r.Process, "admin token file re-read")) == 1
	})

	// then the new token is taken and the old one refused,
	reread := logMessages(r.Process, "admin token file re-read")[0]
	assert.Equal(t, path, reread["admin_token_file"])
	assert.Equal(t, true, reread["changed"])
	assert.Equal(t, http.StatusOK, closeCore(t, r, "new-token"))
	assert.Equal(t, http.StatusUnauthorized, closeCore(t, r, "old-token"))

	// and when the file is opened to others, or emptied, a SIGHUP refuses
	// it and the token in force stays.
	for i, spoil := range []func(){
		func() { require.NoError(t, os.Chmod(path, 0o644)) },
		func() { require.NoError(t, os.WriteFile(path, nil, 0o600)); require.NoError(t, os.Chmod(path, 0o600)) },
	} {
		spoil()
		r.Signal(syscall.SIGHUP)
		proctest.Eventually(t, 5*time.Second, "the relay refuses the token file", func() bool {
			return len(logMessages(r.Process, "admin token file refused; the token in force stays")) == i+1
		})
		assert.Equal(t, http.StatusOK, closeCore(t, r, "new-token"))
		assert.Equal(t, http.StatusUnauthorized, closeCore(t, r, ""))
	}
	refused := logMessages(r.Process, "admin token file refused; the token in force stays")
	assert.Equal(t, "error", refused[0]["level"])
	assert.Contains(t, refused[0]["error"], "mode 0644 gives group or others access to the token")
	assert.Contains(t, refused[1]["error"], "empty file")
	assert.Len(t, logMessages(r.Process, "admin token file re-read"), 1)
	assert.NotContains(t, r.Stderr(), "new-token", "the token is never logged")
	assert.NotContains(t, r.Stderr(), "old-token", "the token is never logged")
}

func TestTokenFileOpenToOthersStopsTheRelay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "admin-token")
	writeToken(t, path, "s3cret")
	require.NoError(t, os.Chmod(path, 0o644))

	res := proctest.Run(t, "./cmd/relay", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--admin-token-file", path)

	assert.Equal(t, 2, res.ExitCode, "a usage error")
	assert.Equal(t, "relay: error: --admin-token-file: "+path+": mode 0644 gives group or others access to the token; chmod 600 it\n", res.Stderr)
}
