package admin

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay"
)

// writeTokenFile writes content to a file of the given mode in a
// temporary directory and returns its path.
func writeTokenFile(t *testing.T, content string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	require.NoError(t, os.Chmod(path, mode), "the mode as given, whatever the umask")
	return path
}

func TestReadTokenFile(t *testing.T) {
	tests := []struct {
		name    string
		content string
		mode    os.FileMode
		want    string // the token, when wantErr is empty
		wantErr string
	}{
		{name: "with a newline", content: "s3cret\n", mode: 0o600, want: "s3cret"},
		{name: "without one", content: "s3cret", mode: 0o600, want: "s3cret"},
		{name: "with CRLF", content: "s3cret\r\n", mode: 0o600, want: "s3cret"},
		{name: "read-only", content: "s3cret\n", mode: 0o400, want: "s3cret"},
		{name: "spaces inside", content: "two words\n", mode: 0o600, want: "two words"},
		{name: "readable by others", content: "s3cret\n", mode: 0o644, wantErr: "mode 0644 gives group or others access to the token; chmod 600 it"},
		{name: "readable by group", content: "s3cret\n", mode: 0o640, wantErr: "mode 0640"},
		{name: "writable by group", content: "s3cret\n", mode: 0o620, wantErr: "mode 0620"},
		{name: "executable by others", content: "s3cret\n", mode: 0o601, wantErr: "mode 0601"},
		{name: "empty", content: "", mode: 0o600, wantErr: "empty file: it must hold the token"},
		{name: "a newline only", content: "\n", mode: 0o600, wantErr: "empty file"},
		{name: "two lines", content: "s3cret\nmore\n", mode: 0o600, wantErr: "more than one line"},
		{name: "two newlines", content: "s3cret\n\n", mode: 0o600, wantErr: "more than one line"},
		{name: "a tab at the end", content: "s3cret\t\n", mode: 0o600, wantErr: "control character"},
		{name: "a space at the end", content: "s3cret \n", mode: 0o600, wantErr: "begins or ends with spaces"},
		{name: "too long", content: strings.Repeat("x", maxTokenFileBytes+1), mode: 0o600, wantErr: "over 4096 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeTokenFile(t, tt.content, tt.mode)
			got, err := ReadTokenFile(path)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Equal(t, path+": ", err.Error()[:len(path)+2], "the error names the file first")
				assert.Contains(t, err.Error(), tt.wantErr)
				assert.NotContains(t, err.Error(), "s3cret", "the token is never in an error")
				assert.NotContains(t, err.Error(), "\n", "one line")
				assert.Empty(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}

	_, err := ReadTokenFile(filepath.Join(t.TempDir(), "missing"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	_, err = ReadTokenFile(t.TempDir())
	assert.ErrorContains(t, err, "not a regular file")
}

func TestSetTokenRotatesTheToken(t *testing.T) {
	// Given an admin port with a token,
	cfg, _ := testConfig(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	srv, _ := startServer(t, cfg)
	a, err := New(Config{Hub: srv, Token: "old-token", Logger: zerolog.New(zerolog.NewTestWriter(t))})
	require.NoError(t, err)
	hs := httptest.NewServer(a)
	t.Cleanup(hs.Close)
	post := func(token string) int {
		t.Helper()
		code, body, _ := adminDo(t, http.MethodPost, hs.URL+"/breakers/CORE", `{"action":"close"}`, "Bearer "+token)
		require.Contains(t, []int{http.StatusOK, http.StatusUnauthorized}, code, body)
		return code
	}
	require.Equal(t, http.StatusOK, post("old-token"))

	// when it is replaced, the new one is taken and the old one refused;
	require.NoError(t, a.SetToken("new-token"))
	assert.Equal(t, http.StatusOK, post("new-token"))
	assert.Equal(t, http.StatusUnauthorized, post("old-token"))

	// an empty token would turn the check off, and is refused, changing
	// nothing.
	assert.ErrorContains(t, a.SetToken(""), "empty token")
	assert.Equal(t, http.StatusOK, post("new-token"))
	assert.Equal(t, http.StatusUnauthorized, post(""))
}

func TestSetTokenCannotTurnTheCheckOn(t *testing.T) {
	cfg, _ := testConfig(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	srv, _ := startServer(t, cfg)
	a, err := New(Config{Hub: srv})
	require.NoError(t, err)
	assert.ErrorContains(t, a.SetToken("s3cret"), "started without a token")
	rec := httptest.NewRecorder()
	a.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/breakers/CORE", strings.NewReader(`{"action":"close"}`)))
	assert.Equal(t, http.StatusOK, rec.Code, "still no check")
}

// TestSetTokenWhileServing rotates the token again and again while
// requests are checked, under -race: the token is swapped whole, and one
// never set is never taken.
func TestSetTokenWhileServing(t *testing.T) {
	cfg, _ := testConfig(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	srv, _ := startServer(t, cfg)
	a, err := New(Config{Hub: srv, Token: "token-0"})
	require.NoError(t, err)
	tokens := []string{"token-0", "token-1"}
	stop := make(chan struct{})
	var writer, readers sync.WaitGroup
	writer.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			assert.NoError(t, a.SetToken(tokens[i%2]))
		}
	})
	for range 4 {
		readers.Go(func() {
			for i := range 500 {
				// Any POST needs the token; one that passes finds no route.
				req := httptest.NewRequest(http.MethodPost, "/nowhere", nil)
				req.Header.Set("Authorization", "Bearer "+tokens[i%2])
				rec := httptest.NewRecorder()
				a.ServeHTTP(rec, req)
				assert.Contains(t, []int{http.StatusNotFound, http.StatusUnauthorized}, rec.Code)
				req.Header.Set("Authorization", "Bearer token-2")
				rec = httptest.NewRecorder()
				a.ServeHTTP(rec, req)
				assert.Equal(t, http.StatusUnauthorized, rec.Code, "a token never set is never taken")
			}
		})
	}
	readers.Wait()
	close(stop)
	writer.Wait()
}
