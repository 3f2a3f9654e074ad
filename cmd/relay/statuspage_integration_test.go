package main_test

import (
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/hubtest"
)

// getHTML is GET path on r's admin port as a browser asks for it.
func getHTML(t *testing.T, r *adminRelay, path string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, r.admin+path, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/html,application/xhtml+xml,*/*;q=0.8")
	resp, err := adminClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body), resp.Header
}

func TestStatusPageIsForBrowsersAndCanBeTurnedOff(t *testing.T) {
	// Given a relay with the page on (the default), a browser gets the page
	// and curl the text index;
	h := startAdminRelay(t, "--target", "CORE=http://127.0.0.1:1")
	code, body, hdr := getHTML(t, h, "/")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "text/html; charset=utf-8", hdr.Get("Content-Type"))
	assert.Contains(t, body, `id="t-CORE-state"`)
	assert.Contains(t, h.mustGet(t, "/"), "relayhub admin\n")

	// given one with --no-status-page, both get the text index and there
	// is no stream.
	off := startAdminRelay(t, "--target", "CORE=http://127.0.0.1:1", "--no-status-page")
	code, body, _ = getHTML(t, off, "/")
	assert.Equal(t, http.StatusOK, code)
	assert.True(t, strings.HasPrefix(body, "relayhub admin\n"), body)
	assert.NotContains(t, body, "/events")
	code, _, _ = off.get("/events")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, off.Stderr(), `"status_page":false`)
}

func TestStatusPageStreamEndsCleanlyOnSIGTERM(t *testing.T) {
	// Given a browser's stream open on the status page,
	h := startAdminRelay(t, "--target", "CORE=http://127.0.0.1:1")
	events := hubtest.OpenEvents(t, h.admin+"/events")
	next := func() (hubtest.Event, bool) {
		t.Helper()
		return events.Next(t, 5*time.Second)
	}
	for ev, ok := next(); ev.Name != "update"; ev, ok = next() {
		require.True(t, ok, "the stream ended before its first update")
	}

	// when the relay gets SIGTERM, the stream ends with an end event, not
	// cut by the admin server's shutdown timeout, and the relay exits 0.
	h.Signal(syscall.SIGTERM)
	for ev, ok := next(); ev.Name != "end"; ev, ok = next() {
		require.True(t, ok, "the stream ended without an end event")
	}
	_, more := next()
	assert.False(t, more, "nothing after the end event")
	assert.NoError(t, events.Err(), "the stream ends cleanly, not reset")
	assert.Equal(t, 0, h.Wait())
	assert.NotContains(t, h.Stderr(), "admin serve ended with an error")
}
