package main

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/admin"
)

// adminPort serves a hub's real admin handler, with token and reload, on
// an httptest server, and returns its flags for relayctl.
func adminPort(t *testing.T, token string, reload func() (relay.ReloadResult, error)) AdminFlags {
	t.Helper()
	srv, err := relay.New(relay.Config{Targets: []relay.Target{{Name: "CORE", URL: "http://127.0.0.1:9201"}, {Name: "CORE.DR", URL: "http://127.0.0.1:9211"}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	h, err := admin.New(admin.Config{Hub: srv, Token: token, Reload: reload})
	require.NoError(t, err)
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	return AdminFlags{Admin: hs.URL, Token: token, Timeout: 5 * time.Second}
}

// runAdminCmd validates and runs cmd as kong would, and returns what it
// printed, its exit status and its error.
func runAdminCmd(t *testing.T, cmd interface {
	Validate() error
}, run func(*streams) error) (string, int, error) {
	t.Helper()
	require.NoError(t, cmd.Validate())
	var out bytes.Buffer
	err := run(&streams{Out: &out, Err: &bytes.Buffer{}})
	return out.String(), cmdline.Code(err), err
}

func TestBreakerCommand(t *testing.T) {
	flags := adminPort(t, "t0ken", nil)
	run := func(action, target string, json bool, f AdminFlags) (string, int, error) {
		c := &breakerCmd{Action: action, Target: target, JSON: json, AdminFlags: f}
		return runAdminCmd(t, c, func(s *streams) error { return c.Run(t.Context(), s) })
	}

	out, code, err := run("hold", "core.dr", false, flags)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Equal(t, ""+
		"TARGET   STATE        FAILURES  INFLIGHT/LIMIT  RETRY-AFTER  URL\n"+
		"CORE.DR  OPEN (held)  0         0/10            -            http://127.0.0.1:9211\n", out)

	out, _, err = run("disable", "CORE", true, flags)
	require.NoError(t, err)
	assert.Contains(t, out, `"name":"CORE","url":"http://127.0.0.1:9201","state":"CLOSED"`)
	assert.Contains(t, out, `"disabled":true`)

	_, code, err = run("open", "LOANS", false, flags)
	assert.Equal(t, 1, code)
	assert.EqualError(t, err, `POST `+flags.Admin+`/breakers/LOANS: 404 Not Found: unknown target "LOANS"`)

	noToken := flags
	noToken.Token = ""
	_, code, err = run("open", "CORE", false, noToken)
	assert.Equal(t, 1, code)
	assert.EqualError(t, err, `POST `+flags.Admin+`/breakers/CORE: 401 Unauthorized: missing or wrong bearer token: give the hub's admin token with --admin-token-file (or RELAYCTL_ADMIN_TOKEN)`)

	c := &breakerCmd{Action: "open", Target: "CORE|X", AdminFlags: flags}
	assert.ErrorContains(t, c.Validate(), `target "CORE|X"`)
}

func TestReloadCommand(t *testing.T) {
	var next error
	flags := adminPort(t, "t0ken", func() (relay.ReloadResult, error) {
		if next != nil {
			return relay.ReloadResult{}, next
		}
		return relay.ReloadResult{Added: []string{"LOANS", "CARDS"}, Changed: []string{"CORE"}}, nil
	})
	run := func(json bool) (string, int, error) {
		c := &reloadCmd{JSON: json, AdminFlags: flags}
		return runAdminCmd(t, c, func(s *streams) error { return c.Run(t.Context(), s) })
	}

	out, code, err := run(false)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Equal(t, "settings reloaded: added LOANS, CARDS; removed none; changed CORE\n", out)
	out, _, err = run(true)
	require.NoError(t, err)
	assert.JSONEq(t, `{"added":["LOANS","CARDS"],"removed":[],"changed":["CORE"]}`, out)

	next = errors.New("config relay.toml: [CORE] fail_threshold: must be at least 1, got 0")
	out, code, err = run(false)
	assert.Equal(t, 1, code, "the file refused")
	assert.Empty(t, out)
	assert.EqualError(t, err, "POST "+flags.Admin+"/reload: 422 Unprocessable Entity: settings refused, the hub keeps its running settings: config relay.toml: [CORE] fail_threshold: must be at least 1, got 0")

	next = fmt.Errorf("the relay runs without --config: %w", admin.ErrNothingToReload)
	_, code, err = run(false)
	assert.Equal(t, 1, code, "nothing to reload")
	assert.ErrorContains(t, err, "409 Conflict: the relay runs without --config")
}

func TestInDoubtCommand(t *testing.T) {
	var gotQuery string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotQuery = r.URL.RawQuery
		if r.URL.Path != "/in-doubt" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(`{"in_doubt":[` +
			`{"time":"2026-12-01T17:30:00.123Z","hub":"hub-a:9200","txid":"XF-1","target":"CORE","url":"http://10.0.0.7:9201","code":"E901","stage":"request_sent","bytes_sent":142,"payload_sha256":"ab"},` +
			`{"time":"2026-12-01T17:30:02.004Z","hub":"hub-a:9200","txid":"CL-22","target":"CLAIM","url":"http://10.0.0.8:9202","code":"E902","stage":"answer_partly_read","bytes_sent":160,"payload_sha256":"cd","future":1}]}`))
	}))
	t.Cleanup(hs.Close)
	run := func(since string) (string, int, error) {
		c := &inDoubtCmd{Since: since, AdminFlags: AdminFlags{Admin: hs.URL, Timeout: 5 * time.Second}}
		return runAdminCmd(t, c, func(s *streams) error { return c.Run(t.Context(), s) })
	}

	out, code, err := run("")
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Empty(t, gotQuery)
	assert.Equal(t, ""+
		"TIME                      TXID   TARGET  CODE  STAGE               BYTES-SENT  URL\n"+
		"2026-12-01T17:30:00.123Z  XF-1   CORE    E901  request_sent        142         http://10.0.0.7:9201\n"+
		"2026-12-01T17:30:02.004Z  CL-22  CLAIM   E902  answer_partly_read  160         http://10.0.0.8:9202\n"+
		"2 calls in doubt\n", out)

	// A time with an offset reaches the hub intact, its + escaped.
	out, _, err = run("2026-12-01T18:30:00+01:00")
	require.NoError(t, err)
	assert.Equal(t, "since=2026-12-01T18%3A30%3A00%2B01%3A00", gotQuery)
	assert.Contains(t, out, "2 calls in doubt since 2026-12-01T17:30:00Z\n")

	c := &inDoubtCmd{Since: "1h", AdminFlags: AdminFlags{Admin: hs.URL, Timeout: time.Second}}
	assert.EqualError(t, c.Validate(), `--since "1h": want an RFC 3339 time such as 2026-12-01T17:30:00Z`)

	// A hub that has no such list is told apart from an empty one.
	c = &inDoubtCmd{AdminFlags: AdminFlags{Admin: hs.URL + "/elsewhere", Timeout: time.Second}}
	_, code, err = runAdminCmd(t, c, func(s *streams) error { return c.Run(t.Context(), s) })
	assert.Equal(t, 1, code)
	assert.ErrorContains(t, err, "404 Not Found")
}

func TestAdminFlags(t *testing.T) {
	c, kctx, err := parse(t, "breaker", "open", "CORE")
	require.NoError(t, err)
	assert.Equal(t, "breaker <action> <target>", kctx.Command())
	assert.Equal(t, "127.0.0.1:9280", c.Breaker.Admin)
	assert.Equal(t, 5*time.Second, c.Breaker.Timeout)

	path := filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(path, []byte("t0ken\n"), 0o600))
	t.Setenv("RELAYCTL_ADMIN_TOKEN_FILE", path)
	c, _, err = parse(t, "reload")
	require.NoError(t, err)
	assert.Equal(t, path, c.Reload.TokenFile)
	client, err := c.Reload.client()
	require.NoError(t, err)
	assert.Equal(t, "t0ken", client.token, "the trailing newline dropped")

	_, _, err = parse(t, "in-doubt", "--admin-token", "t0ken")
	assert.ErrorContains(t, err, "--admin-token and --admin-token-file: give one or the other")

	require.NoError(t, os.WriteFile(path, nil, 0o600))
	c, _, err = parse(t, "status")
	require.NoError(t, err)
	_, err = c.Status.client()
	assert.Equal(t, 2, cmdline.Code(err), "the hub cannot be asked")
	assert.EqualError(t, err, "--admin-token-file: "+path+": empty file: it must hold the token")
}
