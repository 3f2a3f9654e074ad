package statuspage

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// frame is the page's live elements rendered at one instant: each element
// the page updates (the hub's summary, and each target's cells), keyed by
// its id, each wrapped in a template element. Frames are numbered in the
// order they are made. A frame is not changed once published.
type frame struct {
	seq uint64
	at  time.Time
	// full is every element, delta those that differ from the previous
	// frame's; both are HTML, a run of template elements each holding one
	// element with an id.
	full, delta string
	cells       map[string]string
}

// liveCells are the cells of a target's rows that the page updates, by the
// key in their ids ("t-NAME-KEY") and template names ("td-KEY").
var liveCells = [...]string{"state", "since", "retry", "fails", "inflight", "answers", "latency", "probe", "failure", "indoubt", "dedup", "fallback", "control", "history"}

// publishIfWatched makes and publishes a frame at now when a stream is
// open.
func (p *Page) publishIfWatched(now time.Time) {
	p.mu.Lock()
	watched := p.streams > 0
	p.mu.Unlock()
	if watched {
		p.publish(now)
	}
}

// publish makes the frame of now and wakes every stream.
func (p *Page) publish(now time.Time) {
	p.renderMu.Lock()
	defer p.renderMu.Unlock()
	v := p.view(now)
	f := &frame{at: now, cells: make(map[string]string, 1+len(v.Targets)*len(liveCells))}
	var full, delta strings.Builder
	p.mu.Lock()
	prev := p.frame
	p.mu.Unlock()
	add := func(id, name string, data any) {
		var buf bytes.Buffer
		if err := pageTemplate.ExecuteTemplate(&buf, name, data); err != nil {
			// The templates and their data are the page's own: a bug.
			panic("statuspage: render " + name + ": " + err.Error())
		}
		// Each element goes in a template element of its own, where a
		// browser parses a lone table cell as it is.
		html := "<template>" + buf.String() + "</template>"
		f.cells[id] = html
		full.WriteString(html)
		if prev == nil || prev.cells[id] != html {
			delta.WriteString(html)
		}
	}
	add("hub", "hub", v)
	for _, t := range v.Targets {
		for _, key := range liveCells {
			add("t-"+t.Name+"-"+key, "td-"+key, t)
		}
	}
	f.full, f.delta = full.String(), delta.String()

	p.mu.Lock()
	defer p.mu.Unlock()
	if prev != nil {
		f.seq = prev.seq + 1
	}
	p.frame = f
	close(p.published)
	p.published = make(chan struct{})
}

// maxStreams bounds the /events streams served at once, so browsers left
// open cannot take the admin port's connections.
const maxStreams = 32

// streamWriteTimeout bounds each write of a stream: a browser that does
// not read for this long is dropped.
const streamWriteTimeout = 10 * time.Second

// streamRetry is how long a browser waits before it reconnects a stream
// that ended, in milliseconds.
const streamRetry = 2000

// serveEvents is GET /events: a Server-Sent Events stream that sends the
// page's live elements, all of them first and then those that changed,
// within a second of each change, until the browser goes away or
// EndStreams. Each write sets its own deadline, so the stream outlives the
// admin server's WriteTimeout, and the read deadline is lifted, so the
// server's ReadTimeout does not end it.
func (p *Page) serveEvents(w http.ResponseWriter, r *http.Request) {
	if !p.openStream() {
		w.Header().Set("Retry-After", "5")
		http.Error(w, "too many status page streams, or shutting down", http.StatusServiceUnavailable)
		return
	}
	defer p.closeStream()
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Time{}); err != nil {
		p.log.Debug().Err(err).Msg("status page stream: no read deadline control")
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	send := func(event, data string) bool {
		if err := rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout)); err != nil {
			p.log.Debug().Err(err).Msg("status page stream: no write deadline control")
		}
		if _, err := w.Write(appendEvent(nil, event, data)); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !send("", "") {
		return
	}

	var sent *frame
	for {
		p.mu.Lock()
		f, published := p.frame, p.published
		p.mu.Unlock()
		if f == nil || sent == nil && p.now().Sub(f.at) > 2*sampleInterval {
			// No frame since nobody watched: make one for this stream.
			p.publish(p.now())
			continue
		}
		if f != sent {
			data := f.full
			if sent != nil && f.seq == sent.seq+1 {
				data = f.delta
			}
			if data != "" && !send("update", data) {
				return
			}
			sent = f
		}
		select {
		case <-published:
		case <-r.Context().Done():
			return
		case <-p.endStreams:
			send("end", "the relay is shutting down")
			return
		}
	}
}

// openStream counts a new stream, or reports false when there are
// maxStreams already or the streams have ended.
func (p *Page) openStream() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.streamsDone || p.streams >= maxStreams {
		return false
	}
	p.streams++
	return true
}

// closeStream forgets a stream that ended.
func (p *Page) closeStream() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.streams--
}

// appendEvent appends one Server-Sent Event: its name unless empty, each
// line of data as a data field, and a blank line. With neither it appends
// the stream's retry field instead, which is how a stream starts.
func appendEvent(dst []byte, event, data string) []byte {
	if event == "" && data == "" {
		return fmt.Appendf(dst, "retry: %d\n\n", streamRetry)
	}
	if event != "" {
		dst = append(append(append(dst, "event: "...), event...), '\n')
	}
	for line := range strings.SplitSeq(data, "\n") {
		// A carriage return would end the field early; the page's HTML
		// never holds one, but a field must not be cut short.
		line = strings.ReplaceAll(line, "\r", " ")
		dst = append(append(append(dst, "data: "...), line...), '\n')
	}
	return append(dst, '\n')
}
