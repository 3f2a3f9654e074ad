package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/relay"
)

// TestAnOperatorListsAndSettlesOpenTransactionsInDoubt: a call to a
// manual target ends in doubt; GET /in-doubt?open=1 lists it, /status
// counts it, and POST /in-doubt/{txid}/resolve settles it once.
func TestAnOperatorListsAndSettlesOpenTransactionsInDoubt(t *testing.T) {
	core := hubtest.NewTarget(t, nil)
	core.Set(core.BlockThen(hubtest.AnswerCode("0000", "late")))
	t.Cleanup(core.UnblockAll)
	cfg, _ := testConfig(t, relay.Target{Name: "CORE", URL: core.URL})
	cfg.TargetTimeout, cfg.Dedup = 50*time.Millisecond, true
	srv, addr := startServer(t, cfg)
	base := controlAdmin(t, srv, "", io.Discard)
	c := hubtest.Dial(t, addr)

	// Given W1 in doubt at CORE, which has no status URL,
	require.Contains(t, c.Exchange("W1|CORE|DEP 1001 5").String(), "|E901|")
	hubtest.Eventually(t, func() bool { return len(srv.OpenInDoubt()) == 1 }, "entry open")

	// then /in-doubt?open=1 lists it and /status counts it,
	code, body, _ := get(t, http.MethodGet, base+"/in-doubt?open=1")
	require.Equal(t, http.StatusOK, code, body)
	var got struct {
		Open []map[string]any `json:"open"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &got), body)
	require.Len(t, got.Open, 1)
	e := got.Open[0]
	assert.Equal(t, []string{"age_seconds", "attempts", "in_flight", "policy", "since", "target", "txid"}, keys(e), "a manual entry has no next attempt")
	assert.Equal(t, "CORE", e["target"])
	assert.Equal(t, "W1", e["txid"])
	assert.Equal(t, "manual", e["policy"])
	tg := statusTarget(t, statusJSON(t, base), "CORE")
	assert.Equal(t, 1.0, tg["in_doubt_open"])
	assert.Equal(t, "manual", tg["resolve"])
	assert.Nil(t, tg["next_resolve"])

	tests := []struct {
		name, body string
		status     int
		want       string
	}{
		{name: "no target", body: `{"applied":true,"code":"0000"}`, status: http.StatusBadRequest, want: "no target"},
		{name: "both", body: `{"target":"CORE","applied":true,"not_applied":true}`, status: http.StatusBadRequest, want: "one of applied and not_applied"},
		{name: "applied without code", body: `{"target":"CORE","applied":true}`, status: http.StatusBadRequest, want: "needs the target's code"},
		{name: "bad code", body: `{"target":"CORE","applied":true,"code":"OK"}`, status: http.StatusBadRequest, want: "0000, Bnnn or Ennn"},
		{name: "unknown field", body: `{"target":"CORE","applied":true,"code":"0000","x":1}`, status: http.StatusBadRequest, want: "unknown field"},
		{name: "not open", body: `{"target":"CORE","not_applied":true}`, status: http.StatusNotFound, want: "W9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			txid := "W1"
			if tt.status == http.StatusNotFound {
				txid = "W9"
			}
			code, body, _ := adminDo(t, http.MethodPost, base+"/in-doubt/"+txid+"/resolve", tt.body, "")
			assert.Equal(t, tt.status, code, body)
			assert.Contains(t, body, tt.want)
		})
	}

	// When the operator settles it applied,
	code, body, _ = adminDo(t, http.MethodPost, base+"/in-doubt/W1/resolve", `{"target":"core","applied":true,"code":"0000"}`, "")
	require.Equal(t, http.StatusOK, code, body)
	assert.JSONEq(t, `{"target":"CORE","txid":"W1","outcome":"applied","code":"0000"}`, body)

	// then it is no longer open, and a resend gets 0000 without a call.
	_, body, _ = get(t, http.MethodGet, base+"/in-doubt?open=1")
	assert.JSONEq(t, `{"open":[]}`, body)
	assert.Equal(t, "W1|0000|", c.Exchange("W1|CORE|DEP 1001 5").String())
	assert.Equal(t, 0.0, statusTarget(t, statusJSON(t, base), "CORE")["in_doubt_open"])
	code, _, _ = adminDo(t, http.MethodPost, base+"/in-doubt/W1/resolve", `{"target":"CORE","not_applied":true}`, "")
	assert.Equal(t, http.StatusNotFound, code, "settled once")
}
