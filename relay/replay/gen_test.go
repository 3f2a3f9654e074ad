package replay

import (
	"io"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay"
)

// phase is a stretch of a generated incident: how the target answers for
// how long.
type phase struct {
	last time.Duration // how long the phase lasts
	code string        // what the target answers
	took time.Duration // how long it takes
}

// steadyIncident is the shape the generated logs repeat: healthy, failing,
// slow, timing out, healthy again.
var steadyIncident = []phase{
	{last: 20 * time.Second, code: "0000", took: 2 * time.Millisecond},
	{last: 8 * time.Second, code: "E500", took: time.Millisecond},
	{last: 6 * time.Second, code: "0000", took: 400 * time.Millisecond},
	{last: 4 * time.Second, code: "E901", took: time.Second},
	{last: 12 * time.Second, code: "B201", took: 3 * time.Millisecond},
}

// genLog is an io.Reader of the access log a hub would write with one
// target, CORE, behind a real breaker (Policy, on a clock of its own),
// while requests arrive every Every (with a random spread of up to half of
// it) and the target goes through Phases over and over. Lines come out in
// the order a hub writes them: a call's when it ends, a refusal's at once.
// Memory stays small however many lines are read: only the calls in
// flight are held. Its Transitions are the breaker log the hub would have
// written. Not safe for concurrent use.
type genLog struct {
	Policy relay.TargetSettings
	Every  time.Duration
	Phases []phase
	Lines  int // lines to write, and then those of the calls in flight
	Seed   uint64

	Transitions []breaker.Transition

	started  bool
	rnd      *rand.Rand
	clock    clock
	br       *breaker.Breaker
	next     int64 // unix nanoseconds of the next arrival
	begin    int64
	cycle    time.Duration
	inFlight []genCall // ordered by end; few
	written  int
	buf      []byte
	n        int // txid counter
}

// genCall is a call in flight in the generated hub.
type genCall struct {
	start, end int64
	ticket     breaker.Ticket
	code       string
	took       time.Duration
	txid       int
}

// genStart is the time generated logs begin at.
var genStart = time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)

func (g *genLog) init() {
	g.started = true
	g.rnd = rand.New(rand.NewPCG(g.Seed, 7))
	g.begin = genStart.UnixNano()
	g.next = g.begin
	g.clock.now = genStart
	for _, p := range g.Phases {
		g.cycle += p.last
	}
	ts := g.Policy.WithDefaults()
	g.br = breaker.New(breaker.Settings{
		Name:         "CORE",
		Policy:       ts.Policy,
		Clock:        &g.clock,
		OnTransition: func(t breaker.Transition) { g.Transitions = append(g.Transitions, t) },
		ProbeTimeout: ts.TargetTimeout + relay.ProbeGrace,
	})
}

// phaseAt returns the phase in force at t.
func (g *genLog) phaseAt(t int64) phase {
	in := time.Duration(t-g.begin) % g.cycle
	for _, p := range g.Phases {
		if in < p.last {
			return p
		}
		in -= p.last
	}
	return g.Phases[len(g.Phases)-1]
}

// Read implements io.Reader.
func (g *genLog) Read(p []byte) (int, error) {
	if !g.started {
		g.init()
	}
	for len(g.buf) == 0 {
		if g.written >= g.Lines && len(g.inFlight) == 0 {
			return 0, io.EOF
		}
		g.step()
	}
	n := copy(p, g.buf)
	g.buf = g.buf[n:]
	return n, nil
}

// step writes the next line: the call in flight that ends first, unless the
// next request arrives before it. Once Lines are written no more requests
// arrive, and the calls in flight end.
func (g *genLog) step() {
	if len(g.inFlight) > 0 && (g.inFlight[0].end <= g.next || g.written >= g.Lines) {
		c := g.inFlight[0]
		g.inFlight = g.inFlight[1:]
		g.clock.now = time.Unix(0, c.end).UTC()
		g.br.Done(c.ticket, c.code == "E500" || c.code == "E901", c.took)
		g.line(c.txid, c.end, c.code, c.took, "admitted", c.ticket.Probe(), c.start, c.end)
		return
	}
	at := g.next
	g.next += int64(g.Every) + g.rnd.Int64N(int64(g.Every)/2+1)
	g.n++
	g.clock.now = time.Unix(0, at).UTC()
	ticket, _, err := g.br.Allow()
	if err != nil {
		g.line(g.n, at, "E904", 0, "refused", false, at, 0)
		return
	}
	ph := g.phaseAt(at)
	took := ph.took + time.Duration(g.rnd.Int64N(int64(time.Millisecond)))
	c := genCall{start: at, end: at + int64(took), ticket: ticket, code: ph.code, took: took, txid: g.n}
	i := len(g.inFlight)
	for i > 0 && g.inFlight[i-1].end > c.end {
		i--
	}
	g.inFlight = append(g.inFlight, genCall{})
	copy(g.inFlight[i+1:], g.inFlight[i:])
	g.inFlight[i] = c
}

// line appends one access log line as the hub writes it.
func (g *genLog) line(txid int, at int64, code string, took time.Duration, use string, probe bool, start, end int64) {
	b := g.buf
	b = append(b, `{"time":"`...)
	b = time.Unix(0, at).UTC().AppendFormat(b, relay.TimeFormat)
	b = append(b, `","txid":"G-`...)
	b = strconv.AppendInt(b, int64(txid), 10)
	b = append(b, `","target":"CORE","code":"`...)
	b = append(b, code...)
	b = append(b, `","duration_ms":`...)
	b = strconv.AppendFloat(b, float64(took)/float64(time.Millisecond), 'f', -1, 64)
	b = append(b, `,"bytes":8,"breaker":"`...)
	b = append(b, use...)
	b = append(b, '"')
	if probe {
		b = append(b, `,"probe":true`...)
	}
	b = append(b, `,"start":"`...)
	b = time.Unix(0, start).UTC().AppendFormat(b, relay.StampFormat)
	b = append(b, '"')
	if end != 0 {
		b = append(b, `,"end":"`...)
		b = time.Unix(0, end).UTC().AppendFormat(b, relay.StampFormat)
		b = append(b, '"')
	}
	g.buf = append(b, "}\n"...)
	g.written++
}
