package statuspage

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/protocol"
)

// hub is a relay.Server with its metrics and a Recorder, served on a
// loopback port for the length of a test.
type hub struct {
	srv  *relay.Server
	addr string
	reg  *prometheus.Registry
	rec  *Recorder
}

// startHub serves a hub for targets, with threshold 2 and a long reset
// timeout, its transitions observed by a Recorder.
func startHub(t *testing.T, targets ...relay.Target) *hub {
	t.Helper()
	h := &hub{reg: prometheus.NewRegistry(), rec: NewRecorder()}
	m, err := relay.NewMetrics(h.reg)
	require.NoError(t, err)
	cfg := relay.Config{
		Targets:      targets,
		Metrics:      m,
		OnTransition: h.rec.Observe,
		Logger:       zerolog.New(zerolog.NewTestWriter(t)),
	}
	cfg.FailThreshold, cfg.ResetTimeout = 2, time.Hour
	h.srv, err = relay.New(cfg)
	require.NoError(t, err)
	h.addr = hubtest.Serve(t, h.srv, relay.ErrServerClosed)
	return h
}

// config returns a page Config for h.
func (h *hub) config(t *testing.T) Config {
	return Config{Hub: h.srv, Recorder: h.rec, Gatherer: h.reg, Logger: zerolog.New(zerolog.NewTestWriter(t)), Version: "v-test"}
}

// get serves one request to p and returns the recorder.
func get(p http.Handler, method, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec
}

// wellFormed parses html as XML, strictly, and returns the text inside
// the element with the given id, and the number of script elements.
func wellFormed(t *testing.T, html, id string) (text string, scripts int) {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader(html))
	dec.Strict = true
	depth, inside := 0, -1
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "the page must be well-formed:\n%s", html)
		switch tok := tok.(type) {
		case xml.StartElement:
			depth++
			if tok.Name.Local == "script" {
				scripts++
			}
			for _, a := range tok.Attr {
				if a.Name.Local == "id" && a.Value == id {
					inside = depth
				}
			}
		case xml.EndElement:
			if depth == inside {
				inside = -1
			}
			depth--
		case xml.CharData:
			if inside > 0 {
				text += string(tok)
			}
		}
	}
	require.Zero(t, depth, "every element is closed")
	return text, scripts
}

func TestPageIsWellFormedAndShowsMarkupAsText(t *testing.T) {
	// Given CORE answering failures whose message is markup, and CLAIM
	// configured with markup in its URL,
	const evil = `<script>alert(1)</script> & "quoted" 'single' <b>bold</b>`
	core := hubtest.NewTarget(t, answerJSON("E500", evil))
	claimURL := "http://127.0.0.1:1/<script>alert(2)</script>"
	h := startHub(t, relay.Target{Name: "CORE", URL: core.URL}, relay.Target{Name: "CLAIM", URL: claimURL, Fallback: ""})
	c := hubtest.Dial(t, h.addr)
	assert.Equal(t, "T1|E500|"+evil, c.Exchange("T1|CORE|x").String())
	assert.Contains(t, c.Exchange("T2|CORE|x").String(), "|E500|")
	assert.Contains(t, c.Exchange("T3|CORE|x").String(), "|E904|")
	p := newPage(h.config(t))

	// when the page is drawn,
	resp := get(p, http.MethodGet, "/")
	require.Equal(t, http.StatusOK, resp.Code)
	body := resp.Body.String()

	// then it is well-formed, with no script but its own, and shows the
	// message and the URL as text.
	msg, scripts := wellFormed(t, body, "t-CORE-failure")
	assert.Equal(t, 1, scripts)
	assert.Contains(t, msg, evil)
	name, _ := wellFormed(t, body, "t-CLAIM-history")
	assert.Contains(t, name, "answers/s")
	assert.NotContains(t, body, "<script>alert")
	assert.NotContains(t, body, "<b>bold")
	assert.Contains(t, body, "&lt;script&gt;alert(2)&lt;/script&gt;")
	state, _ := wellFormed(t, body, "t-CORE-state")
	assert.Contains(t, state, "OPEN")

	// Each live element the stream sends is well-formed on its own too.
	p.publish(p.now())
	for id, cell := range p.frame.cells {
		inner := strings.TrimSuffix(strings.TrimPrefix(cell, "<template>"), "</template>")
		_, scripts := wellFormed(t, inner, id)
		assert.Zero(t, scripts, id)
		assert.NotContains(t, cell, "<script>alert", id)
	}
}

func TestPageHeadersAllowOnlyItsOwnScriptAndStyle(t *testing.T) {
	h := startHub(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	p := newPage(h.config(t))
	resp := get(p, http.MethodGet, "/")
	require.Equal(t, http.StatusOK, resp.Code)
	hdr := resp.Header()
	assert.Equal(t, "text/html; charset=utf-8", hdr.Get("Content-Type"))
	assert.Equal(t, "no-store", hdr.Get("Cache-Control"))
	csp := hdr.Get("Content-Security-Policy")
	assert.Contains(t, csp, "frame-ancestors 'none'")
	assert.Contains(t, csp, "connect-src 'self'")

	// The policy's hashes are those of the inline script and style.
	body := resp.Body.String()
	for _, el := range []string{"script", "style"} {
		m := regexp.MustCompile(`(?s)<` + el + `>(.*?)</` + el + `>`).FindStringSubmatch(body)
		require.NotNil(t, m, el)
		sum := sha256.Sum256([]byte(m[1]))
		assert.Contains(t, csp, el+"-src 'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'")
	}

	head := get(p, http.MethodHead, "/")
	assert.Equal(t, http.StatusOK, head.Code)
	assert.Zero(t, head.Body.Len())
	assert.Equal(t, http.StatusMethodNotAllowed, get(p, http.MethodPost, "/").Code)
	assert.Equal(t, http.StatusNotFound, get(p, http.MethodGet, "/nope").Code)
}

func TestPageShowsRatesAndLatencyOfTheLastMinute(t *testing.T) {
	// Given a page that sampled CORE before and 2 s after 10 answers, 2 of
	// them business rejections,
	core := hubtest.NewTarget(t, hubtest.Echo)
	h := startHub(t, relay.Target{Name: "CORE", URL: core.URL})
	p := newPage(h.config(t))
	c := hubtest.Dial(t, h.addr)
	for i := range 8 {
		assert.Contains(t, c.Exchange("T"+string(rune('a'+i))+"|CORE|x").String(), "|0000|")
	}
	core.Set(hubtest.AnswerCode("B201", "insufficient funds"))
	assert.Contains(t, c.Exchange("B1|CORE|x").String(), "|B201|")
	assert.Contains(t, c.Exchange("B2|CORE|x").String(), "|B201|")
	now := p.started.Add(2 * time.Second)
	p.sample(now)

	// then the row shows 5 answers a second, by kind, and latencies.
	v := p.view(now).Targets[0]
	assert.Equal(t, "5.0", v.AnswersTotal)
	assert.Equal(t, []answerView{
		{Label: "0000", Class: "ok", Rate: "4.0", Title: classLabels[classOK].title},
		{Label: "Bnnn E400", Class: "rej", Rate: "1.0", Title: classLabels[classRejected].title},
	}, v.Answers)
	assert.Equal(t, "0 of 10 (0%)", v.FailShare)
	assert.Equal(t, "of calls in the last 2 s", v.FailShareNote)
	assert.NotEqual(t, "—", v.P50)
	assert.NotEqual(t, "—", v.P99)
	assert.True(t, v.HistoryOK)
	assert.NotEmpty(t, v.Spark.All)
	assert.Empty(t, v.Spark.Open, "no E904")
}

func TestPageWithoutMetricsStillShowsTheBreakers(t *testing.T) {
	h := startHub(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg := h.config(t)
	cfg.Gatherer = nil
	p := newPage(cfg)
	c := hubtest.Dial(t, h.addr)
	assert.Contains(t, c.Exchange("T1|CORE|x").String(), "|E902|")
	assert.Contains(t, c.Exchange("T2|CORE|x").String(), "|E902|")
	v := p.view(p.now()).Targets[0]
	assert.Equal(t, "OPEN", v.State.Text)
	assert.Equal(t, "—", v.AnswersTotal)
	assert.Equal(t, "E902", v.Failure.Code)
	body := get(p, http.MethodGet, "/").Body.String()
	wellFormed(t, body, "")
}

func TestNewNeedsHubAndRecorder(t *testing.T) {
	_, err := New(Config{Recorder: NewRecorder()})
	assert.Error(t, err)
	h := startHub(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	_, err = New(Config{Hub: h.srv})
	assert.Error(t, err)
}

func TestEventsStreamChangesAndOutlivesTheServerTimeouts(t *testing.T) {
	// Given the page served by an HTTP server whose read and write
	// timeouts are far shorter than the stream,
	h := startHub(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"}, relay.Target{Name: "CLAIM", URL: "http://127.0.0.1:1"})
	p, err := New(h.config(t))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	hs := httptest.NewUnstartedServer(p)
	hs.Config.ReadTimeout, hs.Config.WriteTimeout = 300*time.Millisecond, 300*time.Millisecond
	hs.Start()
	t.Cleanup(hs.Close)

	events := hubtest.OpenEvents(t, hs.URL+"/events")
	next := func(d time.Duration) hubtest.Event {
		t.Helper()
		ev, ok := events.Next(t, d)
		require.True(t, ok, "the stream ended")
		return ev
	}

	// when it connects, it gets the retry field, then every live element;
	assert.Equal(t, "2000", next(time.Second).Retry)
	first := next(2 * time.Second)
	assert.Equal(t, "update", first.Name)
	for _, id := range []string{`id="hub"`, `id="t-CORE-state"`, `id="t-CORE-dedup"`, `id="t-CLAIM-history"`, `id="t-CORE-control"`} {
		assert.Contains(t, first.Data, id)
	}

	// when an operator opens CORE, the change arrives within a second,
	// without the cells that did not change;
	changed := time.Now()
	_, err = h.srv.ControlBreaker("CORE", relay.ActionOpen)
	require.NoError(t, err)
	for {
		ev := next(time.Second)
		if strings.Contains(ev.Data, `id="t-CORE-state"`) {
			assert.Contains(t, ev.Data, "OPEN")
			assert.NotContains(t, ev.Data, `id="t-CLAIM-state"`)
			break
		}
		require.Less(t, time.Since(changed), time.Second, "CORE's change not sent within a second")
	}

	// and the stream goes on past both server timeouts, an update a second.
	for time.Since(changed) < 1500*time.Millisecond {
		assert.Equal(t, "update", next(2*time.Second).Name)
	}

	// When the streams end, it gets an end event and the stream closes;
	// a new stream is refused.
	p.EndStreams()
	for next(2*time.Second).Name != "end" {
	}
	_, more := events.Next(t, 2*time.Second)
	assert.False(t, more, "nothing after the end event")
	assert.NoError(t, events.Err())
	resp2, err := http.Get(hs.URL + "/events")
	require.NoError(t, err)
	resp2.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp2.StatusCode)
}

func TestEventsStreamsAreBounded(t *testing.T) {
	h := startHub(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	p := newPage(h.config(t))
	for range maxStreams {
		require.True(t, p.openStream())
	}
	assert.False(t, p.openStream())
	p.closeStream()
	assert.True(t, p.openStream())
	assert.Equal(t, http.StatusServiceUnavailable, get(p, http.MethodGet, "/events").Code)
}

func TestAppendEvent(t *testing.T) {
	assert.Equal(t, "retry: 2000\n\n", string(appendEvent(nil, "", "")))
	assert.Equal(t, "event: update\ndata: <a>\ndata: b c\n\n", string(appendEvent(nil, "update", "<a>\nb\rc")))
}

// answerJSON answers code and msg as a target does, msg encoded as JSON
// whatever it holds.
func answerJSON(code, msg string) hubtest.Answer {
	return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		_ = json.NewEncoder(w).Encode(map[string]string{"code": code, "message": msg})
	}
}

func TestPageShowsTheCallsInDoubt(t *testing.T) {
	// Given CORE answering what is not the target protocol, so that each
	// of its calls ends in doubt, and CLAIM never called,
	core := hubtest.NewTarget(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		_, _ = w.Write([]byte("<html>gateway</html>"))
	})
	h := startHub(t, relay.Target{Name: "CORE", URL: core.URL}, relay.Target{Name: "CLAIM", URL: "http://127.0.0.1:1"})
	p := newPage(h.config(t))

	// before any call, the header says none is in doubt and every row 0;
	body := get(p, http.MethodGet, "/").Body.String()
	hub, _ := wellFormed(t, body, "hub")
	assert.Contains(t, hub, "none in doubt")
	for _, id := range []string{"t-CORE-indoubt", "t-CLAIM-indoubt"} {
		cell, _ := wellFormed(t, body, id)
		assert.Equal(t, "0", cell, id)
	}
	p.publish(p.now())

	// when two CORE calls end in doubt,
	c := hubtest.Dial(t, h.addr)
	for _, line := range []string{"T1|CORE|x", "T2|CORE|x"} {
		require.Contains(t, c.Exchange(line).String(), "; outcome unknown")
	}
	// The hub takes a call in doubt up once its client has the answer.
	require.Eventually(t, func() bool { return len(h.srv.OpenInDoubt()) == 2 }, 5*time.Second, time.Millisecond)

	// then the next frame sends CORE's count and the header's total, and
	// nothing of CLAIM's,
	p.publish(p.now())
	delta := p.frame.delta
	assert.Contains(t, delta, `id="t-CORE-indoubt" class="num doubt"`)
	assert.NotContains(t, delta, `id="t-CLAIM-indoubt"`)
	assert.Contains(t, delta, "2 in doubt")

	// and the page shows them open, how old the oldest is, and who
	// settles them (an operator: CORE has no status_url), linking to the
	// list of the open ones.
	body = get(p, http.MethodGet, "/").Body.String()
	hub, _ = wellFormed(t, body, "hub")
	assert.Contains(t, hub, "2 in doubt")
	cell, _ := wellFormed(t, body, "t-CORE-indoubt")
	assert.Regexp(t, `^22 open · oldest \d+ swaits for an operator: list$`, cell)
	cell, _ = wellFormed(t, body, "t-CLAIM-indoubt")
	assert.Equal(t, "0", cell)
	assert.Contains(t, body, `<a class="badge indoubt some" href="in-doubt?open=1"`)
	assert.Contains(t, body, `<a class="sub" href="in-doubt?open=1"`)

	// When both are settled by an operator,
	require.NoError(t, h.srv.SettleInDoubt("CORE", "T1", true, "0000"))
	require.NoError(t, h.srv.SettleInDoubt("CORE", "T2", false, ""))

	// then the next frame takes the amber off CORE's cell, which still
	// counts them since start, and the header says none is in doubt.
	p.publish(p.now())
	delta = p.frame.delta
	assert.Contains(t, delta, `id="t-CORE-indoubt" class="num"`)
	body = get(p, http.MethodGet, "/").Body.String()
	cell, _ = wellFormed(t, body, "t-CORE-indoubt")
	assert.Equal(t, "2all settled: list", cell)
	hub, _ = wellFormed(t, body, "hub")
	assert.Contains(t, hub, "none in doubt (2 settled)")
	assert.Contains(t, body, `<a class="badge indoubt" href="in-doubt?open=1"`)
}

// gateway answers what is not the target protocol: the call ends in
// doubt.
func gateway(w http.ResponseWriter, _ *http.Request, _ []byte) {
	_, _ = w.Write([]byte("<html>gateway</html>"))
}

// lookUps answers a call with then, and a look-up (GET /tx/{txid}) as a
// target's status URL does: applied, with the answer 0000 "booked", for
// the TXIDs in applied, not applied for any other.
func lookUps(then hubtest.Answer, applied ...string) hubtest.Answer {
	return func(w http.ResponseWriter, r *http.Request, payload []byte) {
		if r.Method != http.MethodGet {
			then(w, r, payload)
			return
		}
		txid := strings.TrimPrefix(r.URL.Path, "/tx/")
		if slices.Contains(applied, txid) {
			_ = json.NewEncoder(w).Encode(map[string]any{"txid": txid, "applied": true, "code": "0000", "message": "booked"})
			return
		}
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(map[string]any{"txid": txid, "applied": false})
	}
}

func TestPageShowsTheShield(t *testing.T) {
	// Given CORE shielded without a status URL, LOANS shielded with one,
	// and CLAIM without the shield,
	shielded := &relay.TargetSettings{Dedup: true}
	core := hubtest.NewTarget(t, hubtest.Echo)
	loans := hubtest.NewTarget(t, lookUps(gateway, "L1"))
	h := startHub(t,
		relay.Target{Name: "CORE", URL: core.URL, Settings: shielded},
		relay.Target{Name: "LOANS", URL: loans.URL, Settings: shielded, StatusURL: loans.URL + "/tx/{txid}"},
		relay.Target{Name: "CLAIM", URL: "http://127.0.0.1:1"})
	p := newPage(h.config(t))

	// before any resend, CLAIM's shield is off, the others count nothing,
	// and CORE's says it has no status URL;
	body := get(p, http.MethodGet, "/").Body.String()
	cell, _ := wellFormed(t, body, "t-CLAIM-dedup")
	assert.Equal(t, "off", cell)
	cell, _ = wellFormed(t, body, "t-CORE-dedup")
	assert.Equal(t, "0 replayed · 0 joinedno status_url", cell)
	cell, _ = wellFormed(t, body, "t-LOANS-dedup")
	assert.Equal(t, "0 replayed · 0 joined", cell)
	assert.Contains(t, body, `title="the target has no status_url: a resend of a call in doubt cannot be looked up, and is answered E901 without a call"`)
	p.publish(p.now())

	// when CORE's T1 is answered, resent, and resent with another payload,
	c := hubtest.Dial(t, h.addr)
	first := c.Exchange("T1|CORE|x").String()
	require.Contains(t, first, "|0000|")
	require.Equal(t, first, c.Exchange("T1|CORE|x").String())
	require.Equal(t, "T1|E909|"+protocol.MsgTxIDReused, c.Exchange("T1|CORE|y").String())

	// then the next frame sends CORE's shield, and nothing of the others';
	p.publish(p.now())
	delta := p.frame.delta
	assert.Contains(t, delta, `id="t-CORE-dedup" class="num shield" data-label=`)
	assert.Contains(t, delta, "1 E909")
	assert.NotContains(t, delta, `id="t-LOANS-dedup"`)
	assert.NotContains(t, delta, `id="t-CLAIM-dedup"`)

	// when a CORE call and two LOANS calls end in doubt and are resent,
	// CORE's without a status URL to ask, LOANS's L1 applied and L2 not,
	core.Set(gateway)
	require.Contains(t, c.Exchange("T2|CORE|x").String(), "; outcome unknown")
	require.Equal(t, "T2|E901|"+protocol.MsgStillUnknown, c.Exchange("T2|CORE|x").String())
	for _, line := range []string{"L1|LOANS|x", "L2|LOANS|x"} {
		require.Contains(t, c.Exchange(line).String(), "; outcome unknown")
	}
	loans.Set(lookUps(hubtest.Echo, "L1"))
	require.Equal(t, "L1|0000|booked", c.Exchange("L1|LOANS|x").String())
	require.Equal(t, "L2|0000|got x", c.Exchange("L2|LOANS|x").String())

	// then CORE's unresolved resend is highlighted as a call in doubt is,
	// and LOANS tells its resolved ones, the one sent afresh among them.
	body = get(p, http.MethodGet, "/").Body.String()
	cell, _ = wellFormed(t, body, "t-CORE-dedup")
	assert.Equal(t, "1 replayed · 0 joined1 E9091 unresolvedno status_url", cell)
	assert.Contains(t, body, `id="t-CORE-dedup" class="num shield doubt"`)
	cell, _ = wellFormed(t, body, "t-LOANS-dedup")
	assert.Equal(t, "0 replayed · 0 joinedresolved 2 (1 sent afresh)", cell)
	assert.Contains(t, body, `id="t-LOANS-dedup" class="num shield" data-label=`)
	cell, _ = wellFormed(t, body, "t-CLAIM-dedup")
	assert.Equal(t, "off", cell)
	hub, _ := wellFormed(t, body, "hub")
	assert.NotContains(t, hub, "shield", "no store, no store badge")
}

// TestPageHammer draws the page, samples, publishes and changes breakers
// all at once, for the race detector.
func TestPageHammer(t *testing.T) {
	h := startHub(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"}, relay.Target{Name: "CLAIM", URL: "http://127.0.0.1:1"})
	p := newPage(h.config(t))
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for range 50 {
				assert.Equal(t, http.StatusOK, get(p, http.MethodGet, "/").Code)
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			p.sample(p.now())
			p.publish(p.now())
		}
	})
	wg.Go(func() {
		for i := range 200 {
			action := relay.ActionOpen
			if i%2 == 1 {
				action = relay.ActionClose
			}
			_, err := h.srv.ControlBreaker("CORE", action)
			assert.NoError(t, err)
		}
	})
	wg.Wait()
	assert.Len(t, h.rec.history("CORE", time.Time{}).recent, 200)
}
