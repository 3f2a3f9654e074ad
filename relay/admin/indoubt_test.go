package admin

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/relay"
)

// TestInDoubtListsTheRecentCallsInDoubt: two calls time out after CORE
// took them; GET /in-doubt lists both in the journal's form, ?since keeps
// the later one, and /status counts them.
func TestInDoubtListsTheRecentCallsInDoubt(t *testing.T) {
	core := hubtest.NewTarget(t, nil)
	core.Set(core.BlockThen(hubtest.AnswerCode("0000", "late")))
	t.Cleanup(core.UnblockAll)
	cfg, _ := testConfig(t, relay.Target{Name: "CORE", URL: core.URL})
	cfg.TargetTimeout, cfg.HubID = 50*time.Millisecond, "hub-a"
	srv, addr := startServer(t, cfg)
	base := startAdmin(t, srv, nil)
	c := hubtest.Dial(t, addr)

	// Each call takes the 50 ms timeout, so they end in different
	// milliseconds.
	assert.Contains(t, c.Exchange("T1|CORE|DEP 1001 5").String(), "|E901|")
	assert.Contains(t, c.Exchange("T2|CORE|DEP 1001 7").String(), "|E901|")

	list := func(query string) []map[string]any {
		code, body, hdr := get(t, http.MethodGet, base+"/in-doubt"+query)
		require.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, "application/json", hdr.Get("Content-Type"))
		var got struct {
			InDoubt []map[string]any `json:"in_doubt"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &got), body)
		return got.InDoubt
	}
	all := list("")
	require.Len(t, all, 2)
	assert.Equal(t, "T1", all[0]["txid"])
	assert.Equal(t, "T2", all[1]["txid"])
	for _, e := range all {
		assert.ElementsMatch(t, []string{"time", "hub", "txid", "target", "url", "code", "stage", "bytes_sent", "payload_sha256"}, keys(e))
		assert.Equal(t, "hub-a", e["hub"])
		assert.Equal(t, "request_sent", e["stage"])
	}
	first, err := time.Parse(time.RFC3339Nano, all[0]["time"].(string))
	require.NoError(t, err)
	later := list("?since=" + url.QueryEscape(first.Add(time.Millisecond).Format(time.RFC3339Nano)))
	require.Len(t, later, 1)
	assert.Equal(t, "T2", later[0]["txid"])
	assert.Empty(t, list("?since="+url.QueryEscape(time.Now().Add(time.Hour).Format(time.RFC3339))))

	code, body, _ := get(t, http.MethodGet, base+"/in-doubt?since=yesterday")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "RFC 3339")

	assert.Equal(t, 2.0, statusTarget(t, statusJSON(t, base), "CORE")["in_doubt"])
}
