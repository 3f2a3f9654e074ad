package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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
		c := &inDoubtCmd{Recent: true, Since: since, AdminFlags: AdminFlags{Admin: hs.URL, Timeout: 5 * time.Second}}
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
	c = &inDoubtCmd{Recent: true, AdminFlags: AdminFlags{Admin: hs.URL + "/elsewhere", Timeout: time.Second}}
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

// openHub is a hub's admin port as relayctl's in-doubt commands see it:
// GET /in-doubt?open=1 answers open, POST /in-doubt/{txid}/resolve
// answers status and records its path and body. Safe for one request at
// a time.
type openHub struct {
	open     string
	status   int
	resolved []string // "path body" of each POST
}

func (h *openHub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/in-doubt" && r.URL.RawQuery == "open=1":
		_, _ = w.Write([]byte(h.open))
	case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/in-doubt/"):
		b, _ := io.ReadAll(r.Body)
		h.resolved = append(h.resolved, r.URL.Path+" "+string(b))
		w.WriteHeader(h.status)
		if h.status != http.StatusOK {
			_, _ = w.Write([]byte(`{"error":"W9 is not open in doubt at CORE"}`))
			return
		}
		var req resolveBody
		_ = json.Unmarshal(b, &req)
		_, _ = fmt.Fprintf(w, `{"target":%q}`, strings.ToUpper(req.Target))
	default:
		http.NotFound(w, r)
	}
}

// startOpenHub serves h on an httptest server and returns its admin flags.
func startOpenHub(t *testing.T, h *openHub) AdminFlags {
	t.Helper()
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	return AdminFlags{Admin: hs.URL, Timeout: 5 * time.Second}
}

// twoOpen is a hub's answer with two open entries: a look-up with its
// next attempt, and a manual one.
const twoOpen = `{"open":[` +
	`{"txid":"W1","target":"CORE","since":"2026-12-01T17:30:00.123Z","policy":"lookup","attempts":3,"next_attempt":"2026-12-01T17:31:10Z","in_flight":false},` +
	`{"txid":"CL-22","target":"CLAIM","since":"2026-12-01T17:30:40Z","policy":"manual","attempts":0,"future":1}]}`

func TestInDoubtListsTheOpenEntriesByDefault(t *testing.T) {
	// Given a hub with two open entries,
	flags := startOpenHub(t, &openHub{open: twoOpen})

	// when in-doubt is run with no flag, it asks for the open ones,
	c := &inDoubtCmd{AdminFlags: flags}
	out, code, err := runAdminCmd(t, c, func(s *streams) error { return c.Run(t.Context(), s) })
	require.NoError(t, err)
	assert.Zero(t, code)
	assert.Contains(t, out, "W1")
	assert.Contains(t, out, "2 open calls in doubt\n")

	// and prints each with its attempts and its next one.
	var list openList
	require.NoError(t, json.Unmarshal([]byte(twoOpen), &list))
	now := time.Date(2026, 12, 1, 17, 31, 0, 0, time.UTC)
	var b bytes.Buffer
	require.NoError(t, writeOpen(&b, list.Open, now))
	assert.Equal(t, ""+
		"SINCE                     AGE   TXID   TARGET  RESOLVE  ATTEMPTS  NEXT\n"+
		"2026-12-01T17:30:00.123Z  1m0s  W1     CORE    lookup   3         in 10s\n"+
		"2026-12-01T17:30:40.000Z  20s   CL-22  CLAIM   manual   0         operator (relayctl in-doubt resolve)\n"+
		"2 open calls in doubt\n", b.String())

	// --json prints the hub's answer as it is.
	c = &inDoubtCmd{JSON: true, AdminFlags: flags}
	out, _, err = runAdminCmd(t, c, func(s *streams) error { return c.Run(t.Context(), s) })
	require.NoError(t, err)
	assert.Equal(t, twoOpen+"\n", out)
}

func TestNextText(t *testing.T) {
	now := time.Date(2026, 12, 1, 17, 31, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { x := now.Add(d); return &x }
	for _, tt := range []struct {
		name string
		e    openEntry
		want string
	}{
		{name: "manual", e: openEntry{Policy: "manual"}, want: "operator (relayctl in-doubt resolve)"},
		{name: "to come", e: openEntry{Next: at(2340 * time.Millisecond)}, want: "in 2.3s"},
		{name: "due", e: openEntry{Next: at(-time.Second)}, want: "due"},
		{name: "under way", e: openEntry{Next: at(time.Second), InFlight: true}, want: "under way"},
	} {
		t.Run(tt.name, func(t *testing.T) { assert.Equal(t, tt.want, nextText(tt.e, now)) })
	}
}
