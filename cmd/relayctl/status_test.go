package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/cmdline"
)

const statusJSON = `{"draining":false,"goroutines":42,"targets":[` +
	`{"name":"CORE","url":"http://127.0.0.1:9201","state":"OPEN","consecutive_failures":5,"inflight":0,"max_inflight":10,"retry_after_seconds":7},` +
	`{"name":"CLAIM","url":"http://127.0.0.1:9202","state":"HALF_OPEN","consecutive_failures":0,"inflight":1,"max_inflight":10,"retry_after_seconds":0.25,"future_field":true},` +
	`{"name":"LEDGER","url":"http://10.0.0.7:8080","state":"CLOSED","consecutive_failures":2,"inflight":10,"max_inflight":10,"retry_after_seconds":0}` +
	`],"build":"x"}`

func newStatusServer(t *testing.T, code int, body string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/status" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func runStatus(t *testing.T, c statusCmd) (string, int, error) {
	t.Helper()
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Second
	}
	require.NoError(t, c.Validate())
	var out bytes.Buffer
	err := c.Run(t.Context(), &streams{Out: &out, Err: &bytes.Buffer{}})
	return out.String(), cmdline.Code(err), err
}

func TestStatusTable(t *testing.T) {
	srv := newStatusServer(t, http.StatusOK, statusJSON)

	out, code, err := runStatus(t, statusCmd{AdminFlags: AdminFlags{Admin: strings.TrimPrefix(srv.URL, "http://")}})

	require.NoError(t, err)
	assert.Equal(t, 0, code)
	want := "" +
		"TARGET  STATE      FAILURES  INFLIGHT/LIMIT  RETRY-AFTER  URL\n" +
		"CORE    OPEN       5         0/10            7s           http://127.0.0.1:9201\n" +
		"CLAIM   HALF_OPEN  0         1/10            250ms        http://127.0.0.1:9202\n" +
		"LEDGER  CLOSED     2         10/10           -            http://10.0.0.7:8080\n" +
		"hub accepting, 42 goroutines\n"
	assert.Equal(t, want, out)
}

func TestStatusOfAHubInAFleet(t *testing.T) {
	srv := newStatusServer(t, http.StatusOK, `{"draining":false,"goroutines":9,"targets":[`+
		`{"name":"CORE","url":"http://127.0.0.1:9201","state":"OPEN","consecutive_failures":0,"inflight":0,"max_inflight":10,"retry_after_seconds":4.2,`+
		`"fleet":{"epoch":7,"opened_by":"hub-a","source":"remote","probe_lease":false}},`+
		`{"name":"CLAIM","url":"http://127.0.0.1:9202","state":"CLOSED","consecutive_failures":0,"inflight":0,"max_inflight":10,"retry_after_seconds":0,`+
		`"fleet":{"epoch":0,"opened_by":"","source":"","probe_lease":false}}`+
		`],"fleet":{"hub_id":"hub-b","store_connected":false}}`)

	out, _, err := runStatus(t, statusCmd{AdminFlags: AdminFlags{Admin: srv.URL}})

	require.NoError(t, err)
	want := "" +
		"TARGET  STATE   FAILURES  INFLIGHT/LIMIT  RETRY-AFTER  EPOCH  OPENED-BY  SOURCE  URL\n" +
		"CORE    OPEN    0         0/10            4.2s         7      hub-a      remote  http://127.0.0.1:9201\n" +
		"CLAIM   CLOSED  0         0/10            -            0      -          -       http://127.0.0.1:9202\n" +
		"hub accepting, 9 goroutines; fleet hub hub-b, store unreachable: breakers decide alone\n"
	assert.Equal(t, want, out)
}

func TestStatusOfAHubWhoseClusterShardIsDown(t *testing.T) {
	srv := newStatusServer(t, http.StatusOK, `{"draining":false,"goroutines":9,"targets":[`+
		`{"name":"CORE","url":"http://127.0.0.1:9201","state":"CLOSED","consecutive_failures":0,"inflight":0,"max_inflight":10,"retry_after_seconds":0,`+
		`"fleet":{"epoch":4,"opened_by":"","source":"remote","probe_lease":false,"alone":true}},`+
		`{"name":"CLAIM","url":"http://127.0.0.1:9202","state":"CLOSED","consecutive_failures":0,"inflight":0,"max_inflight":10,"retry_after_seconds":0,`+
		`"fleet":{"epoch":2,"opened_by":"","source":"remote","probe_lease":false,"alone":false}}`+
		`],"fleet":{"hub_id":"hub-b","store_connected":false}}`)

	out, _, err := runStatus(t, statusCmd{AdminFlags: AdminFlags{Admin: srv.URL}})

	require.NoError(t, err)
	want := "" +
		"TARGET  STATE   FAILURES  INFLIGHT/LIMIT  RETRY-AFTER  EPOCH  OPENED-BY  SOURCE  URL\n" +
		"CORE    CLOSED  0         0/10            -            4      -          alone   http://127.0.0.1:9201\n" +
		"CLAIM   CLOSED  0         0/10            -            2      -          remote  http://127.0.0.1:9202\n" +
		"hub accepting, 9 goroutines; fleet hub hub-b, store unreachable for 1 of 2 targets: their breakers decide alone\n"
	assert.Equal(t, want, out)
}

func TestStatusDraining(t *testing.T) {
	srv := newStatusServer(t, http.StatusOK, `{"draining":true,"goroutines":3,"targets":[]}`)
	out, _, err := runStatus(t, statusCmd{AdminFlags: AdminFlags{Admin: srv.URL + "/"}})
	require.NoError(t, err)
	assert.Equal(t, "TARGET  STATE  FAILURES  INFLIGHT/LIMIT  RETRY-AFTER  URL\nhub draining, 3 goroutines\n", out)
}

func TestStatusJSONIsRaw(t *testing.T) {
	srv := newStatusServer(t, http.StatusOK, statusJSON)
	out, code, err := runStatus(t, statusCmd{AdminFlags: AdminFlags{Admin: srv.URL}, JSON: true})
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Equal(t, statusJSON+"\n", out)
}

func TestStatusErrors(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := closed.Addr().String()
	require.NoError(t, closed.Close())

	tests := []struct {
		name     string
		admin    string
		wantCode int
		wantErr  string
	}{
		{"unreachable", closedAddr, 2, "GET http://" + closedAddr + "/status"},
		{"server error", newStatusServer(t, http.StatusInternalServerError, "boom\nmore").URL, 1, `500 Internal Server Error: "boom"`},
		{"not JSON", newStatusServer(t, http.StatusOK, "<html>").URL, 1, "not a status document"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, code, err := runStatus(t, statusCmd{AdminFlags: AdminFlags{Admin: tt.admin}})
			assert.Equal(t, tt.wantCode, code)
			assert.ErrorContains(t, err, tt.wantErr)
			assert.Empty(t, out)
		})
	}
}

func TestFormatRetryAfter(t *testing.T) {
	tests := []struct {
		in   float64
		want string
	}{
		{0, "-"},
		{-1, "-"},
		{7, "7s"},
		{0.25, "250ms"},
		{1.2504, "1.25s"},
		{0.0001, "0s"},
		{90, "1m30s"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			assert.Equal(t, tt.want, formatRetryAfter(tt.in))
		})
	}
}

func TestAdminBase(t *testing.T) {
	for _, tt := range []struct {
		admin  string
		useTLS bool
		want   string
	}{
		{"127.0.0.1:9280", false, "http://127.0.0.1:9280"},
		{"127.0.0.1:9280", true, "https://127.0.0.1:9280"},
		{"https://hub.example/admin/", false, "https://hub.example/admin"},
		{"https://hub.example/admin/", true, "https://hub.example/admin"},
		{"http://hub.example/admin/", false, "http://hub.example/admin"},
	} {
		got, err := adminBase(tt.admin, tt.useTLS)
		require.NoError(t, err)
		assert.Equal(t, tt.want, got)
	}
	_, err := adminBase("http://hub.example", true)
	assert.ErrorContains(t, err, "--tls wants https://")
}

func TestStatusTellsTheLastSyntheticProbe(t *testing.T) {
	srv := newStatusServer(t, http.StatusOK, `{"draining":false,"goroutines":7,"targets":[`+
		`{"name":"CORE","url":"http://127.0.0.1:9201","state":"HALF_OPEN","consecutive_failures":3,"inflight":0,"max_inflight":10,"retry_after_seconds":1.5,`+
		`"last_probe":{"txid":"PROBE-hub-a-1","at":"2026-12-01T18:00:00.123Z","outcome":"healthy","code":"0000","duration_seconds":0.0021}}]}`)

	out, _, err := runStatus(t, statusCmd{AdminFlags: AdminFlags{Admin: strings.TrimPrefix(srv.URL, "http://")}})

	require.NoError(t, err)
	assert.Contains(t, out, "CORE last synthetic probe: healthy 0000 in 2.1ms at 2026-12-01T18:00:00.123Z (PROBE-hub-a-1)\nhub accepting, 7 goroutines\n")
}

func TestStatusShowsAnOperatorsHoldOrDisable(t *testing.T) {
	srv := newStatusServer(t, http.StatusOK, `{"draining":false,"goroutines":5,"targets":[`+
		`{"name":"CORE","url":"http://127.0.0.1:9201","state":"OPEN","consecutive_failures":0,"inflight":0,"max_inflight":10,"retry_after_seconds":0,"held":true,"disabled":false},`+
		`{"name":"CLAIM","url":"http://127.0.0.1:9202","state":"CLOSED","consecutive_failures":3,"inflight":2,"max_inflight":10,"retry_after_seconds":0,"held":false,"disabled":true}]}`)

	out, _, err := runStatus(t, statusCmd{AdminFlags: AdminFlags{Admin: srv.URL}})

	require.NoError(t, err)
	assert.Equal(t, ""+
		"TARGET  STATE              FAILURES  INFLIGHT/LIMIT  RETRY-AFTER  URL\n"+
		"CORE    OPEN (held)        0         0/10            -            http://127.0.0.1:9201\n"+
		"CLAIM   CLOSED (disabled)  3         2/10            -            http://127.0.0.1:9202\n"+
		"hub accepting, 5 goroutines\n", out)
}
