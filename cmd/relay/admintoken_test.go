package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tokenFile writes token to a file of the given mode in a temporary
// directory and returns its path.
func tokenFile(t *testing.T, token string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(path, []byte(token), 0o600))
	require.NoError(t, os.Chmod(path, mode))
	return path
}

func TestAdminTokenFileFlag(t *testing.T) {
	c, err := parse(t, nil)
	require.NoError(t, err)
	assert.Empty(t, c.AdminTokenFile, "none by default")

	c, err = parse(t, []string{"RELAY_ADMIN_TOKEN_FILE=/etc/relayhub/admin-token"})
	require.NoError(t, err)
	assert.Equal(t, "/etc/relayhub/admin-token", c.AdminTokenFile)

	// A token file is a token: the admin port may listen beyond loopback.
	_, err = parse(t, nil, "--admin-token-file", "/etc/relayhub/admin-token", "--admin-listen", "0.0.0.0:9280")
	assert.NoError(t, err)

	assertBadFlags(t, []badFlagCase{
		{name: "both", args: []string{"--admin-token", "t0ken", "--admin-token-file", "/etc/relayhub/admin-token"},
			want: "--admin-token and --admin-token-file: give one or the other"},
		{name: "blank", args: []string{"--admin-token-file", " "}, want: "--admin-token-file: must name a file"},
	})
	_, err = parse(t, []string{"RELAY_ADMIN_TOKEN=t0ken", "RELAY_ADMIN_TOKEN_FILE=/etc/relayhub/admin-token"})
	assert.ErrorContains(t, err, "give one or the other", "from the environment too")
}

func TestRunRefusesATokenFileItCannotUse(t *testing.T) {
	// The file is read at start, before any other file is touched: a
	// usage error, exit status 2, in one line naming the flag and the file.
	for _, tt := range []struct {
		name  string
		token string
		mode  os.FileMode
		want  string
	}{
		{"readable by others", "s3cret\n", 0o644, "mode 0644 gives group or others access to the token; chmod 600 it"},
		{"readable by its group", "s3cret\n", 0o640, "mode 0640"},
		{"empty", "", 0o600, "empty file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := tokenFile(t, tt.token, tt.mode)
			logPath := filepath.Join(t.TempDir(), "breaker.log")
			c, err := parse(t, nil, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
				"--admin-token-file", path, "--breaker-log", logPath, "--in-doubt-log", filepath.Join(filepath.Dir(logPath), "in-doubt.log"))
			require.NoError(t, err)
			err = run(context.Background(), c, zerolog.Nop(), nil)
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), "--admin-token-file: "+path+": "), err.Error())
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), "\n")
			assert.NotContains(t, err.Error(), "s3cret")
			assert.Equal(t, 2, exitStatus(err), "a usage error")
			_, statErr := os.Stat(logPath)
			assert.True(t, os.IsNotExist(statErr), "the breaker log is not created")
		})
	}
	c, err := parse(t, nil, "--listen", "127.0.0.1:0", "--admin-token-file", filepath.Join(t.TempDir(), "missing"), "--in-doubt-log", "")
	require.NoError(t, err)
	err = run(context.Background(), c, zerolog.Nop(), nil)
	assert.ErrorContains(t, err, "--admin-token-file: open ")
	assert.Equal(t, 2, exitStatus(err))
}

func TestStartupLineTellsTheTokenFile(t *testing.T) {
	path := tokenFile(t, "s3cret\n", 0o600)
	line := startupLine(t, "--admin-token-file", path)
	assert.Equal(t, true, line["admin_token"])
	assert.Equal(t, path, line["admin_token_file"])
	assert.NotContains(t, fmt.Sprint(line), "s3cret", "the token is never logged")
}
