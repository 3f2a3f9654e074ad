package proctest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// FixturePkg is the package of the fake target binary.
const FixturePkg = "./cmd/fixture"

// httpClient makes every HTTP request of this package: its own timeout, so a hung
// fixture fails the test, and its own transport, so tests do not share
// connections with anything else.
var httpClient = &http.Client{
	Timeout:   ReadTimeout,
	Transport: &http.Transport{MaxIdleConnsPerHost: 16},
}

// FixtureStats is the body of a fixture's GET /_stats (docs/PROTOCOL.md, "Fixture"). It is a
// plain value, safe to copy and share once filled in.
type FixtureStats struct {
	Name        string           `json:"name"`
	Mode        string           `json:"mode"`
	Calls       int64            `json:"calls"`
	InFlight    int64            `json:"inflight"`
	MaxInFlight int64            `json:"max_inflight"`
	Codes       map[string]int64 `json:"codes"`
	// Lookups and Reversals count the GET /tx/{txid} and POST
	// /tx/{txid}/reverse the fixture received.
	Lookups   int64 `json:"lookups"`
	Reversals int64 `json:"reversals"`
}

// TxAnswer is a target's answer to POST /tx: the HTTP status and the JSON
// body's code and message. It is a plain value, safe to copy and share.
type TxAnswer struct {
	Status  int
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Fixture is a running fixture binary. It is safe for concurrent use, with
// the caveat of Process.
type Fixture struct {
	*Process
	// URL is the fixture's base URL, http://ADDR.
	URL string
}

// StartFixture starts the fixture binary with the given name and kind on an
// ephemeral loopback port.
func StartFixture(t testing.TB, name, kind string) *Fixture {
	t.Helper()
	p := Start(t, FixturePkg, "--name", name, "--kind", kind, "--listen", "127.0.0.1:0")
	return &Fixture{Process: p, URL: "http://" + p.Addr()}
}

// Ctl posts body to the fixture's /_ctl as curl -d would (form content
// type, JSON body) and fails the test unless it answers 200.
func (f *Fixture) Ctl(t testing.TB, body string) {
	t.Helper()
	status, answer, err := post(f.URL+"/_ctl", "application/x-www-form-urlencoded", nil, body)
	if err != nil {
		t.Fatalf("fixture control %s: %v", body, err)
	}
	if status != http.StatusOK {
		t.Fatalf("fixture control %s: HTTP %d: %s", body, status, answer)
	}
}

// Stats returns the fixture's /_stats, failing the test on error.
func (f *Fixture) Stats(t testing.TB) FixtureStats {
	t.Helper()
	st, err := f.StatsErr()
	if err != nil {
		t.Fatalf("fixture stats: %v", err)
	}
	return st
}

// SettledStats waits until the fixture has no call in flight and returns
// its /_stats then. A client can have a fixture's answer before the fixture
// has counted its code, so counts of codes are read through this.
func (f *Fixture) SettledStats(t testing.TB) FixtureStats {
	t.Helper()
	var st FixtureStats
	Eventually(t, ReadTimeout, "fixture has no call in flight", func() bool {
		var err error
		st, err = f.StatsErr()
		return err == nil && st.InFlight == 0
	})
	return st
}

// StatsErr returns the fixture's /_stats, for use off the test goroutine.
func (f *Fixture) StatsErr() (FixtureStats, error) {
	resp, err := httpClient.Get(f.URL + "/_stats")
	if err != nil {
		return FixtureStats{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return FixtureStats{}, fmt.Errorf("GET /_stats: HTTP %d", resp.StatusCode)
	}
	var st FixtureStats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return FixtureStats{}, fmt.Errorf("GET /_stats: %w", err)
	}
	return st, nil
}

// Received returns the X-Tx-Ids of the latest calls that reached the
// fixture, oldest first (GET /_received), failing the test on error.
func (f *Fixture) Received(t testing.TB) []string {
	t.Helper()
	resp, err := httpClient.Get(f.URL + "/_received")
	if err != nil {
		t.Fatalf("fixture received: %v", err)
	}
	defer resp.Body.Close()
	var body struct {
		Received []struct {
			TxID string `json:"txid"`
		} `json:"received"`
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /_received: HTTP %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("GET /_received: %v", err)
	}
	out := make([]string, len(body.Received))
	for i, r := range body.Received {
		out[i] = r.TxID
	}
	return out
}

// Tx posts a transaction to baseURL's /tx the way the relay does and
// returns the answer; the body must be JSON unless err is set.
func Tx(baseURL, txid, payload string) (TxAnswer, error) {
	hdr := http.Header{"X-Tx-Id": {txid}}
	status, body, err := post(baseURL+"/tx", "text/plain; charset=utf-8", hdr, payload)
	if err != nil {
		return TxAnswer{}, err
	}
	a := TxAnswer{Status: status}
	if err := json.Unmarshal(body, &a); err != nil {
		return a, fmt.Errorf("POST /tx: HTTP %d, body %q: %w", status, body, err)
	}
	return a, nil
}

// post sends one POST and returns the status and the whole body.
func post(url, contentType string, hdr http.Header, body string) (int, []byte, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b, err
}

// Eventually calls cond every tick until it returns true, and fails the
// test with msg if that has not happened within d. Prefer it to sleeping:
// it returns as soon as the condition holds.
func Eventually(t testing.TB, d time.Duration, msg string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, msg)
		}
		time.Sleep(tick)
	}
}

// tick is the polling interval of Eventually.
const tick = 10 * time.Millisecond
