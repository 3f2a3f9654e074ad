// Package statuspage is the hub's live status page, served on the admin
// port: one row per target with its breaker state, time in state, retry
// hint, failures, bulkhead, answers per second by kind, latency, last probe,
// last failure, calls in doubt, duplicate-TXID shield and fallback, in
// fleet mode the breaker's state shared with the fleet and the shield's
// store, and under it a timeline of the breaker's state and a sparkline
// of its answers over the last 15 minutes (docs/OPERATING.md, "The status
// page").
//
// The page is rendered on the server with html/template from the hub's own
// snapshots, its Prometheus metrics (read once a second, never on the
// request path) and a Recorder of its breaker state changes, and needs no
// asset from anywhere else. A few lines of JavaScript keep it live through
// Server-Sent Events on GET /events and send an operator's breaker actions
// to POST /breakers/{target} with the token the operator types; without
// JavaScript it refreshes itself every few seconds.
//
// Typical use, in the binary that wires the hub:
//
//	rec := statuspage.NewRecorder()
//	srv, err := relay.New(relay.Config{..., OnTransition: rec.Observe})
//	page, err := statuspage.New(statuspage.Config{Hub: srv, Gatherer: reg, Recorder: rec})
//	defer page.Close()
//	h, err := admin.New(admin.Config{Hub: srv, Gatherer: reg, Page: page})
//	adminServer := &http.Server{Handler: h}
//	adminServer.RegisterOnShutdown(page.EndStreams)
//	// On each reload, with the breakers' clock read just before it:
//	at := time.Now()
//	if res, err := srv.Reload(targets); err == nil {
//		rec.Reloaded(res, at)
//	}
package statuspage

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"errors"
	"html/template"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/admin"
)

// Config configures New. It is a plain value.
type Config struct {
	// Hub is the hub the page shows, read through the admin port's
	// interface: its draining flag, connections and target snapshots, and
	// when it is an admin.FleetHub its place in the fleet and each
	// target's shared state, and when it is an admin.DedupHub the state of
	// its duplicate-TXID shield's store. Required.
	Hub admin.Hub
	// Recorder receives the hub's breaker state changes (it must be the
	// hub's transition observer). Required.
	Recorder *Recorder
	// Gatherer holds the hub's metrics (relay.NewMetrics' registry), read
	// once a second for the rates and latencies. Nil means the page shows
	// neither.
	Gatherer prometheus.Gatherer
	// TokenRequired says the admin port wants a bearer token for breaker
	// actions, so the page asks the operator for it.
	TokenRequired bool
	// Version is the hub's version, shown in the page's title bar; empty
	// shows none.
	Version string
	// Logger receives the errors of reading the metrics and of writing a
	// page. The zero Logger logs nothing.
	Logger zerolog.Logger
	// Now tells the time of the page's samples and drawings; it must be
	// the hub's breakers' clock. Nil means time.Now.
	Now func() time.Time
}

// Page serves the status page (GET /) and its live updates (GET
// /events). New starts its sampler, which reads the hub once a second; Close
// stops it. It is safe for concurrent use.
type Page struct {
	hub           admin.Hub
	rec           *Recorder
	gatherer      prometheus.Gatherer
	tokenRequired bool
	version       string
	log           zerolog.Logger
	errLog        zerolog.Logger // log sampled to one line a minute
	now           func() time.Time
	started       time.Time

	// renderMu is held while a frame is made, so frames are numbered in
	// the order they are made.
	renderMu sync.Mutex

	mu          sync.Mutex
	series      map[string]*series // guarded by mu; by target name
	frame       *frame             // guarded by mu: the latest frame; nil before the first
	published   chan struct{}      // guarded by mu: closed when a frame after frame is published
	streams     int                // guarded by mu: /events streams being served
	streamsDone bool               // guarded by mu: EndStreams was called

	endStreams chan struct{} // closed by EndStreams
	endOnce    sync.Once
	stop       chan struct{} // closed by Close
	stopOnce   sync.Once
	wg         sync.WaitGroup // owns the sampler
}

var _ http.Handler = (*Page)(nil)

// New returns the page for cfg.Hub and starts its sampler.
func New(cfg Config) (*Page, error) {
	if cfg.Hub == nil {
		return nil, errors.New("statuspage: no Hub")
	}
	if cfg.Recorder == nil {
		return nil, errors.New("statuspage: no Recorder")
	}
	p := newPage(cfg)
	p.wg.Go(p.sampleLoop)
	return p, nil
}

// newPage returns the page for cfg without starting its sampler.
func newPage(cfg Config) *Page {
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	log := cfg.Logger.With().Str("component", "statuspage").Logger()
	p := &Page{
		hub:           cfg.Hub,
		rec:           cfg.Recorder,
		gatherer:      cfg.Gatherer,
		tokenRequired: cfg.TokenRequired,
		version:       cfg.Version,
		log:           log,
		errLog:        log.Sample(&zerolog.BurstSampler{Burst: 1, Period: time.Minute}),
		now:           now,
		series:        make(map[string]*series),
		published:     make(chan struct{}),
		endStreams:    make(chan struct{}),
		stop:          make(chan struct{}),
	}
	p.started = now()
	p.sample(p.started)
	return p
}

// Close ends every /events stream and stops the sampler, waiting for it.
// Call it once the admin server has stopped.
func (p *Page) Close() {
	p.EndStreams()
	p.stopOnce.Do(func() { close(p.stop) })
	p.wg.Wait()
}

// EndStreams ends every /events stream, each with a last "end" event, and
// answers later ones 503, so that an admin server shutting down does not
// wait for browsers to hang up. Give it to the admin http.Server's
// RegisterOnShutdown.
func (p *Page) EndStreams() {
	p.endOnce.Do(func() {
		p.mu.Lock()
		p.streamsDone = true
		p.mu.Unlock()
		close(p.endStreams)
	})
}

// sampleInterval is how often the sampler reads the hub's metrics and, when
// a browser is watching, sends it what changed.
const sampleInterval = time.Second

// minFrameGap is the least time between two frames: breaker changes
// arriving faster than this are drawn together.
const minFrameGap = 100 * time.Millisecond

// sampleLoop samples the hub every sampleInterval, and publishes a frame
// after each sample and each breaker change while a stream is open, until
// Close. A change that comes less than minFrameGap after the last frame is
// drawn once the gap has passed, with any others that came meanwhile.
func (p *Page) sampleLoop() {
	tick := time.NewTicker(sampleInterval)
	defer tick.Stop()
	var gap *time.Timer
	var gapOver <-chan time.Time // not nil while a change waits for the gap
	defer func() {
		if gap != nil {
			gap.Stop()
		}
	}()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
			now := p.now()
			p.sample(now)
			p.publishIfWatched(now)
		case <-p.rec.changed:
			if gapOver != nil {
				continue
			}
			now := p.now()
			if wait := p.frameGap(now); wait > 0 {
				gap = time.NewTimer(wait)
				gapOver = gap.C
				continue
			}
			p.publishIfWatched(now)
		case <-gapOver:
			gapOver = nil
			p.publishIfWatched(p.now())
		}
	}
}

// frameGap returns how long until a frame may follow the last one.
func (p *Page) frameGap(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frame == nil {
		return 0
	}
	return minFrameGap - now.Sub(p.frame.at)
}

// sample reads the hub's metrics and adds them to every target's series.
func (p *Page) sample(now time.Time) {
	if p.gatherer == nil {
		return
	}
	families, err := p.gatherer.Gather()
	if err != nil {
		// Gather returns what it could read along with the error.
		p.errLog.Warn().Err(err).Msg("status page: metrics read with errors")
	}
	counts := readCounters(families, now)
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, c := range counts {
		s := p.series[name]
		if s == nil {
			s = &series{}
			p.series[name] = s
		}
		s.add(c)
	}
}

// view returns the page's content at now.
func (p *Page) view(now time.Time) pageView {
	snaps := p.hub.Targets()
	v := pageView{
		Version:       p.version,
		Clock:         clockText(now),
		Draining:      p.hub.Draining(),
		Connections:   p.hub.ConnectionsOpen(),
		TokenRequired: p.tokenRequired,
		Targets:       make([]targetView, 0, len(snaps)),
		RateWindow:    spanText(rateWindow),
	}
	fh, inFleet := p.hub.(admin.FleetHub)
	if inFleet {
		fs := fh.FleetStatus()
		v.Fleet = &fleetView{HubID: fs.HubID, Connected: fs.StoreConnected}
	}
	byName := make(map[string]*relay.TargetSnapshot, len(snaps))
	for i := range snaps {
		byName[snaps[i].Name] = &snaps[i]
	}
	shielded := false
	alone, shared := 0, 0
	for _, s := range snaps {
		shielded = shielded || s.Settings.Dedup
		in := targetInput{
			snap:     s,
			hist:     p.rec.history(s.Name, now.Add(-HistorySpan)),
			fallback: byName[s.Fallback],
			started:  p.started,
			now:      now,
		}
		p.mu.Lock()
		if sr := p.series[s.Name]; sr != nil {
			in.rates, in.spark = sr.rates(s.Settings.FailureCodes), sr.spark(now)
		}
		p.mu.Unlock()
		tv := newTargetView(in)
		tv.RateWindow = v.RateWindow
		v.InDoubt += tv.InDoubt
		v.InDoubtOpen += tv.Open.Count
		if inFleet {
			tf, ok := fh.TargetFleet(s.Name)
			tv.Fleet = fleetText(tf, ok, s, v.Fleet.HubID)
			if ok {
				shared++
				if tf.Alone {
					alone++
				}
			}
		}
		v.Targets = append(v.Targets, tv)
	}
	if inFleet && !v.Fleet.Connected {
		v.Fleet.Alone = aloneText(alone, shared)
	}
	if dh, ok := p.hub.(admin.DedupHub); ok {
		v.ShieldStore = shieldStoreText(dh.Dedup(), shielded)
	}
	return v
}

// ServeHTTP serves GET / (the page) and GET /events (its live updates);
// anything else is 404.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	case r.URL.Path == "/":
		p.servePage(w, r)
	case r.URL.Path == "/events":
		p.serveEvents(w, r)
	default:
		http.NotFound(w, r)
	}
}

// servePage writes the whole page as it is now.
func (p *Page) servePage(w http.ResponseWriter, r *http.Request) {
	var buf bytes.Buffer
	if err := pageTemplate.ExecuteTemplate(&buf, "page", pageData{pageView: p.view(p.now()), CSS: pageCSS, JS: pageJS}); err != nil {
		// The template and its data are the page's own: a bug.
		p.log.Error().Err(err).Msg("status page does not render")
		http.Error(w, "status page does not render", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	setPageHeaders(h)
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
}

// setPageHeaders sets the headers of the page that keep it private and
// keep anything but its own script, style and stream out of it.
func setPageHeaders(h http.Header) {
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Vary", "Accept")
}

// The page's style sheet and script, inlined in the page.
var (
	//go:embed page.css
	pageCSSText string
	//go:embed page.js
	pageJSText string
	//go:embed page.html
	pageHTMLText string
)

// pageCSS and pageJS are the style sheet and the script as the template
// inlines them: the page's own constant text.
var (
	pageCSS = template.CSS(pageCSSText)
	pageJS  = template.JS(pageJSText)
)

// pageTemplate draws the page and each of its live elements.
var pageTemplate = template.Must(template.New("statuspage").Parse(pageHTMLText))

// contentSecurityPolicy lets the page run only its own inline script and
// style (by hash), talk only to its own origin, and not be framed: a
// target's message that escaped its escaping still could not run, and no
// other site can overlay the page's buttons.
var contentSecurityPolicy = "default-src 'none'; script-src '" + hashOf(pageJSText) + "'; style-src '" + hashOf(pageCSSText) +
	"'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// hashOf returns the CSP source expression of an inline element's text.
func hashOf(text string) string {
	sum := sha256.Sum256([]byte(text))
	return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
}

// pageData is what the "page" template draws.
type pageData struct {
	pageView
	CSS template.CSS
	JS  template.JS
}
