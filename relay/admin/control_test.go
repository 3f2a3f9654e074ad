package admin

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
	"github.com/relayhub/relayhub/relay"
)

// controlAdmin serves srv's admin handler with token and a logger into logs,
// and returns its base URL.
func controlAdmin(t *testing.T, srv *relay.Server, token string, logs io.Writer) string {
	t.Helper()
	a, err := New(Config{Hub: srv, Token: token, Logger: zerolog.New(logs)})
	require.NoError(t, err)
	hs := httptest.NewServer(a)
	t.Cleanup(hs.Close)
	return hs.URL
}

// adminDo sends method url with body and the given Authorization header
// (none when empty), and returns the status, the body and the headers.
func adminDo(t *testing.T, method, url, body, auth string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	return send(t, req)
}

// send sends req and returns the status, the body and the headers.
func send(t *testing.T, req *http.Request) (int, string, http.Header) {
	t.Helper()
	resp, err := (&http.Client{Timeout: hubtest.IOTimeout}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

// decodeTarget decodes an admin answer that is one target's status.
func decodeTarget(t *testing.T, body string) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &m), body)
	return m
}

func TestBreakerActions(t *testing.T) {
	// Given CORE failing, with threshold 2 and reset 5 s, its breaker
	// changes recorded as the breaker log would record them, metrics, and
	// the logs kept,
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(500))
	cfg, clk := testConfig(t, relay.Target{Name: "CORE", URL: core.URL}, relay.Target{Name: "CLAIM", URL: "http://127.0.0.1:1"})
	cfg.FailThreshold, cfg.ResetTimeout = 2, 5*time.Second
	var tr hubtest.Transitions
	cfg.OnTransition = tr.Observe
	reg := withMetrics(t, &cfg)
	var logs logtest.Buffer
	cfg.Logger = zerolog.New(&logs)
	srv, addr := startServer(t, cfg)
	base := controlAdmin(t, srv, "", &logs)
	c := hubtest.Dial(t, addr)
	post := func(target, action string) map[string]any {
		t.Helper()
		code, body, hdr := adminDo(t, http.MethodPost, base+"/breakers/"+target, `{"action":"`+action+`"}`, "")
		require.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, "application/json", hdr.Get("Content-Type"))
		return decodeTarget(t, body)
	}

	// when an operator opens CORE, it is held open: refused with no time to
	// retry, answered with the target's /status entry,
	st := post("core", "open")
	assert.Equal(t, statusTarget(t, statusJSON(t, base), "CORE"), st, "the same shape as an entry of /status")
	assert.Subset(t, st, map[string]any{"name": "CORE", "state": "OPEN", "held": true, "disabled": false, "retry_after_seconds": 0.0})
	assert.Equal(t, "O1|E904|circuit open; held open by operator", c.Exchange("O1|CORE|x").String())
	clk.Advance(time.Hour)
	assert.Equal(t, "O2|E904|circuit open; held open by operator", c.Exchange("O2|CORE|x").String(), "a hold does not time out")

	// enable starts a normal open period of the reset timeout;
	st = post("CORE", "enable")
	assert.Subset(t, st, map[string]any{"state": "OPEN", "held": false, "retry_after_seconds": 5.0})
	assert.Equal(t, "E1|E904|circuit open; retry after 5s", c.Exchange("E1|CORE|x").String())

	// disable closes it and lets every call through: failures never trip
	// it, though they are still counted;
	st = post("CORE", "disable")
	assert.Subset(t, st, map[string]any{"state": "CLOSED", "disabled": true, "consecutive_failures": 0.0})
	for range 4 {
		assert.Contains(t, c.Exchange("D|CORE|x").String(), "|E500|")
	}
	st = decodeTarget(t, mustJSON(t, statusTarget(t, statusJSON(t, base), "CORE")))
	assert.Subset(t, st, map[string]any{"state": "CLOSED", "disabled": true, "consecutive_failures": 4.0})

	// close ends the disable and clears the count;
	st = post("CORE", "close")
	assert.Subset(t, st, map[string]any{"state": "CLOSED", "disabled": false, "held": false, "consecutive_failures": 0.0})
	assert.Contains(t, c.Exchange("C1|CORE|x").String(), "|E500|")
	assert.Contains(t, c.Exchange("C2|CORE|x").String(), "|E500|")
	assert.Contains(t, c.Exchange("C3|CORE|x").String(), "|E904|", "the threshold applies again")

	// and every change went to the observer, the metrics and the log, after
	// the action that caused it.
	want := []string{"CORE:CLOSED->OPEN", "CORE:OPEN->CLOSED", "CORE:CLOSED->OPEN"}
	assert.Equal(t, want, tr.List())
	assert.Equal(t, 2.0, hubtest.MetricValue(t, reg, "relay_breaker_transitions_total", "target", "CORE", "from", "CLOSED", "to", "OPEN"))
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, "relay_breaker_transitions_total", "target", "CORE", "from", "OPEN", "to", "CLOSED"))
	var events []string
	for _, l := range logs.Lines(t) {
		switch l["message"] {
		case "breaker action":
			assert.Equal(t, "info", l["level"])
			assert.Equal(t, "CORE", l["target"])
			assert.Regexp(t, `^127\.0\.0\.1:\d+$`, l["remote"])
			events = append(events, "action "+l["action"].(string))
		case "breaker state changed":
			events = append(events, l["from"].(string)+"->"+l["to"].(string))
		}
	}
	assert.Equal(t, []string{
		"action open", "CLOSED->OPEN", "action enable", "action disable", "OPEN->CLOSED", "action close", "CLOSED->OPEN",
	}, events)
}

// mustJSON encodes v.
func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestBreakerActionErrors(t *testing.T) {
	cfg, _ := testConfig(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	var tr hubtest.Transitions
	cfg.OnTransition = tr.Observe
	srv, _ := startServer(t, cfg)
	base := controlAdmin(t, srv, "", io.Discard)

	tests := []struct {
		name, method, path, body string
		status                   int
		want                     string // a substring of the JSON error
	}{
		{name: "unknown target", method: "POST", path: "/breakers/NOPE", body: `{"action":"open"}`, status: 404, want: `unknown target \"NOPE\"`},
		// The target is looked up before the body is read, so an unknown
		// target is 404 whatever the body.
		{name: "unknown target, unknown action", method: "POST", path: "/breakers/NOPE", body: `{"action":"reboot"}`, status: 404, want: `unknown target \"NOPE\"`},
		{name: "unknown target, not JSON", method: "POST", path: "/breakers/NOPE", body: `action=open`, status: 404, want: `unknown target \"NOPE\"`},
		{name: "unknown target, empty body", method: "POST", path: "/breakers/NOPE", body: ``, status: 404, want: `unknown target \"NOPE\"`},
		{name: "unknown target, two objects", method: "POST", path: "/breakers/NOPE", body: `{"action":"open"}{"action":"close"}`, status: 404, want: `unknown target \"NOPE\"`},
		{name: "unknown target, too large", method: "POST", path: "/breakers/NOPE", body: `{"action":"open","x":"` + strings.Repeat("a", 5000) + `"}`, status: 404, want: `unknown target \"NOPE\"`},
		{name: "unknown action", method: "POST", path: "/breakers/CORE", body: `{"action":"reboot"}`, status: 400, want: `unknown action \"reboot\"`},
		{name: "action not a string", method: "POST", path: "/breakers/CORE", body: `{"action":1}`, status: 400, want: "body"},
		{name: "no action", method: "POST", path: "/breakers/CORE", body: `{}`, status: 400, want: `no \"action\"`},
		{name: "unknown field", method: "POST", path: "/breakers/CORE", body: `{"action":"open","force":true}`, status: 400, want: "unknown field"},
		{name: "not JSON", method: "POST", path: "/breakers/CORE", body: `action=open`, status: 400, want: "want a JSON object"},
		{name: "empty body", method: "POST", path: "/breakers/CORE", body: ``, status: 400, want: "want a JSON object"},
		{name: "two objects", method: "POST", path: "/breakers/CORE", body: `{"action":"open"}{"action":"close"}`, status: 400, want: "nothing after it"},
		{name: "too large", method: "POST", path: "/breakers/CORE", body: `{"action":"open","x":"` + strings.Repeat("a", 5000) + `"}`, status: 400, want: "body over 4096 bytes"},
		{name: "get", method: "GET", path: "/breakers/CORE", status: 405, want: "method GET not allowed"},
		{name: "put", method: "PUT", path: "/breakers/CORE", body: `{"action":"open"}`, status: 405, want: "method PUT not allowed"},
		{name: "no target", method: "POST", path: "/breakers/", body: `{"action":"open"}`, status: 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body, hdr := adminDo(t, tt.method, base+tt.path, tt.body, "")
			assert.Equal(t, tt.status, code, body)
			if tt.want != "" {
				assert.Equal(t, "application/json", hdr.Get("Content-Type"))
				assert.Contains(t, decodeTarget(t, body)["error"], strings.ReplaceAll(tt.want, `\"`, `"`))
			}
			if tt.status == 405 {
				assert.Equal(t, "POST", hdr.Get("Allow"))
			}
		})
	}
	assert.Empty(t, tr.List(), "no refused request changes a breaker")
	assert.Equal(t, "CLOSED", statusTarget(t, statusJSON(t, base), "CORE")["state"])
}

func TestAdminTokenGuardsPosts(t *testing.T) {
	// Given an admin port with a token,
	cfg, _ := testConfig(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	var tr hubtest.Transitions
	cfg.OnTransition = tr.Observe
	srv, _ := startServer(t, cfg)
	var logs logtest.Buffer
	const token = "s3cret-token"
	base := controlAdmin(t, srv, token, &logs)
	open := `{"action":"open"}`

	// a POST without the token, or with a wrong one, is refused with 401,
	// and changes nothing;
	for _, auth := range []string{
		"", "Bearer", "Bearer ", "Bearer wrong", "Bearer s3cret-toke", "Bearer s3cret-token-and-more",
		"Basic czNjcmV0LXRva2Vu", "s3cret-token", "Token s3cret-token",
	} {
		code, body, hdr := adminDo(t, http.MethodPost, base+"/breakers/CORE", open, auth)
		assert.Equal(t, http.StatusUnauthorized, code, "Authorization %q: %s", auth, body)
		assert.Equal(t, "Bearer", hdr.Get("WWW-Authenticate"))
		assert.Equal(t, "missing or wrong bearer token", decodeTarget(t, body)["error"])
	}
	code, _, _ := adminDo(t, http.MethodPost, base+"/breakers/NOPE", open, "")
	assert.Equal(t, http.StatusUnauthorized, code, "no target names leak without the token")
	code, _, _ = adminDo(t, http.MethodPut, base+"/status", "", "")
	assert.Equal(t, http.StatusUnauthorized, code, "every method but GET and HEAD needs it")
	assert.Empty(t, tr.List())
	assert.NotContains(t, logs.String(), "s3cret", "the token is never logged")
	assert.Contains(t, logs.String(), "admin request refused")

	// GETs from loopback need no token;
	code, body, _ := adminDo(t, http.MethodGet, base+"/status", "", "")
	assert.Equal(t, http.StatusOK, code, body)
	code, _, _ = adminDo(t, http.MethodGet, base+"/healthz", "", "")
	assert.Equal(t, http.StatusOK, code)

	// and with the token (the scheme in any case) the action is done.
	code, body, _ = adminDo(t, http.MethodPost, base+"/breakers/CORE", open, "Bearer "+token)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "OPEN", decodeTarget(t, body)["state"])
	code, body, _ = adminDo(t, http.MethodPost, base+"/breakers/core", `{"action":"close"}`, "bearer "+token)
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "CLOSED", decodeTarget(t, body)["state"])
	assert.Equal(t, []string{"CORE:CLOSED->OPEN", "CORE:OPEN->CLOSED"}, tr.List())
}

// TestAdminTokenComparedInConstantTime holds authorized to its contract:
// the token is compared with crypto/subtle, never with == or bytes.Equal,
// whose time depends on where the first wrong byte is.
func TestAdminTokenComparedInConstantTime(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "admin.go", nil, 0)
	require.NoError(t, err)
	var fn *ast.FuncDecl
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == "authorized" {
			fn = fd
		}
	}
	require.NotNil(t, fn, "admin.go has no authorized function")
	var constantTime, timed []string
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.CallExpr:
			if sel, ok := x.Fun.(*ast.SelectorExpr); ok {
				pkg, _ := sel.X.(*ast.Ident)
				switch {
				case pkg != nil && pkg.Name == "subtle" && sel.Sel.Name == "ConstantTimeCompare":
					constantTime = append(constantTime, sel.Sel.Name)
				case sel.Sel.Name == "Equal" || sel.Sel.Name == "Compare":
					timed = append(timed, sel.Sel.Name)
				}
			}
		case *ast.BinaryExpr:
			if x.Op == token.EQL || x.Op == token.NEQ {
				// Comparing a call's result with a constant (the 1 of
				// ConstantTimeCompare) is fine; comparing two values is not.
				_, lit := x.Y.(*ast.BasicLit)
				if !lit {
					timed = append(timed, x.Op.String())
				}
			}
		}
		return true
	})
	assert.Equal(t, []string{"ConstantTimeCompare"}, constantTime)
	assert.Empty(t, timed, "the token must not be compared in variable time")
}
