package relay

import (
	"bufio"
	"bytes"
	"io"
	"net/netip"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay/protocol"
)

// DefaultAccessLogQueue is the access log queue size when
// Config.AccessLogQueue is zero.
const DefaultAccessLogQueue = 4096

// TimeFormat is how the hub writes times in its logs: RFC 3339 UTC with
// milliseconds, as in the breaker log.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// StampFormat is how the access log writes the breaker clock's readings
// ("start" and "end"): RFC 3339 UTC with nanoseconds, so that a replay can
// put two decisions of one breaker a fraction of a millisecond apart in
// the order they happened.
const StampFormat = "2006-01-02T15:04:05.000000000Z07:00"

// accessLog writes one JSON line per answered request line:
//
//	{"time":"2026-11-30T05:31:19.123Z","txid":"T1","target":"CORE","client":"203.0.113.7:51234","code":"0000","duration_ms":1.843217,"bytes":12,
//	 "breaker":"admitted","start":"2026-11-30T05:31:19.121279870Z","end":"2026-11-30T05:31:19.123123087Z"}
//
// target is the target that answered; when it answered as the fallback of
// the target the client named, that one is in "fallback_for". client is
// the client's address, from the PROXY header when a trusted load balancer
// sent one.
//
// A line whose request reached a breaker also says what that breaker did
// with it ("breaker": admitted, refused or handed_back; "probe" when it was
// the half-open probe; "synthetic" when that probe was the hub's own, sent
// with its payload and TXID, not a client's) and when, on the breaker's clock: "start" is the
// reading the hub asked the breaker with (breaker.AllowAt; on a connection's
// read loop, one reading for a batch of lines, batchclock.go), "end" read
// just before a call's result went to it. Every decision AllowAt makes,
// a refusal or a probe, is at start itself, and "end" is at most a few
// instructions earlier than the breaker's own reading. So a replay of
// the log through the breaker package (relay/replay) sees every decision
// at the time the breaker saw it, to well within the breaker log's
// millisecond.
//
// Answering never waits for it: record only puts the line on a bounded
// queue, and a line that finds the queue full is dropped and counted
// (relay_access_log_dropped_total). One goroutine of the Server, writeLoop,
// drains the queue into a buffered writer, flushing whenever the queue runs
// empty, and flushes a last time when the Server stops. It is safe for
// concurrent use.
type accessLog struct {
	queue   chan accessEntry
	clock   func() time.Time // the breakers' clock
	out     io.Writer
	metrics *Metrics
	log     zerolog.Logger
	stop    sync.Once
	// buffered counts the lines written to the writer's buffer and not yet
	// flushed; only the writer's goroutine uses it.
	buffered int
}

// accessEntry is one queued line. It holds copies of the bytes it needs,
// because the request line it comes from is overwritten by the next one; a
// fixed-size plain value, so queueing it does not allocate.
type accessEntry struct {
	at      time.Time
	took    time.Duration
	breaker breakerNote
	size    int
	code    string
	via     string // the target the client named, when target is its fallback
	txidN   uint8
	targetN uint8
	txid    [protocol.MaxTxIDLen]byte
	target  [protocol.MaxTxIDLen]byte // the canonical target name, or the name as a client wrote it, cut to 64 bytes
	client  netip.AddrPort            // the client's address; zero when not known
}

// accessNote describes one answer for the access log: the TXID (empty for
// "-"), the target (the canonical name, or the client's bytes when no
// configured target matched), the target the client named when target
// answered as its fallback (else empty), the code, how long the target
// call took (zero when there was none), the size of the payload (zero
// when the line did not parse) and what target's breaker did with the
// request. It is a plain value whose slices are only read.
type accessNote struct {
	txid        []byte
	target      []byte
	fallbackFor string
	code        string
	took        time.Duration
	size        int
	breaker     breakerNote
	// client is the client's address: the PROXY header's source when a
	// trusted load balancer sent one, else the connection's peer.
	client netip.AddrPort
}

// breakerNote is what a target's breaker did with a request, for the
// access log; the zero value says the request reached no breaker. It is a
// plain value.
type breakerNote struct {
	use   breakerUse
	probe bool // the breaker admitted the request as its half-open probe
	// synthetic marks the hub's own probe, not a client's request.
	synthetic bool
	start     time.Time // the breakers' clock the breaker was asked with
	end       time.Time // the breakers' clock just before the call's result went to the breaker; zero when none did
}

// breakerUse is what a breaker did with a request.
type breakerUse uint8

const (
	breakerNotAsked   breakerUse = iota
	breakerAdmitted              // admitted, and the call's result recorded
	breakerRefused               // refused: E904
	breakerHandedBack            // admitted, then handed back with Cancel: E905, or E907 before a result
)

// breakerUseNames are the values of the access log's "breaker" field.
var breakerUseNames = [...]string{
	breakerAdmitted:   "admitted",
	breakerRefused:    "refused",
	breakerHandedBack: "handed_back",
}

func newAccessLog(out io.Writer, queue int, m *Metrics, log zerolog.Logger, clock breaker.Clock) *accessLog {
	now := time.Now
	if clock != nil {
		now = clock.Now
	}
	return &accessLog{
		queue:   make(chan accessEntry, queue),
		clock:   now,
		out:     out,
		metrics: m,
		log:     log.With().Str("component", "access_log").Logger(),
	}
}

// now reads the breakers' clock for a breakerNote, or returns the zero
// time on a nil accessLog (no access log configured): nothing will be
// written, so nothing is read.
func (a *accessLog) now() time.Time {
	if a == nil {
		return time.Time{}
	}
	return a.clock()
}

// record queues one line, or drops it when the queue is full. It does
// nothing on a nil accessLog (no access log configured).
func (a *accessLog) record(n accessNote) {
	if a == nil {
		return
	}
	e := accessEntry{at: time.Now(), took: n.took, size: n.size, code: n.code, via: n.fallbackFor, breaker: n.breaker, client: n.client}
	e.txidN = uint8(copy(e.txid[:], n.txid))
	e.targetN = uint8(copy(e.target[:], n.target))
	select {
	case a.queue <- e:
	default:
		a.metrics.countDropped()
	}
}

// close ends the queue; writeLoop writes what is left, flushes and returns.
// Every goroutine that records must have ended.
func (a *accessLog) close() {
	a.stop.Do(func() { close(a.queue) })
}

// dropBuffered counts the lines buffered and not flushed as dropped: they
// will never be written.
func (a *accessLog) dropBuffered() {
	for range a.buffered {
		a.metrics.countDropped()
	}
	a.buffered = 0
}

// writeLoop is the access log's goroutine. A write error is logged once,
// the lines it lost are counted as dropped, and the next line tries again
// with a fresh buffer, so a full disk that frees up resumes the log.
func (a *accessLog) writeLoop() {
	w := bufio.NewWriterSize(a.out, 64<<10)
	var line bytes.Buffer
	enc := zerolog.New(&line)
	var ts, addr []byte
	failing := false
	fail := func(err error) {
		a.dropBuffered()
		w.Reset(a.out)
		if !failing {
			failing = true
			a.log.Error().Err(err).Msg("access log write failed; lines are dropped until a write succeeds")
		}
	}
	flush := func() {
		if a.buffered == 0 {
			return
		}
		if err := w.Flush(); err != nil {
			fail(err)
			return
		}
		a.buffered = 0
		if failing {
			failing = false
			a.log.Info().Msg("access log writes succeed again")
		}
	}
	for e := range a.queue {
		line.Reset()
		ts = e.at.UTC().AppendFormat(ts[:0], TimeFormat)
		ev := enc.Log().Bytes("time", ts)
		if e.txidN == 0 {
			ev = ev.Str("txid", protocol.NoTxID)
		} else {
			ev = ev.Bytes("txid", e.txid[:e.txidN])
		}
		if e.targetN > 0 {
			ev = ev.Bytes("target", e.target[:e.targetN])
		}
		if e.via != "" {
			ev = ev.Str("fallback_for", e.via)
		}
		if e.client.IsValid() {
			addr = e.client.AppendTo(addr[:0])
			ev = ev.Bytes("client", addr)
		}
		ev = ev.Str("code", e.code).
			Float64("duration_ms", float64(e.took)/float64(time.Millisecond)).
			Int("bytes", e.size)
		if b := e.breaker; b.use != breakerNotAsked {
			ev = ev.Str("breaker", breakerUseNames[b.use])
			if b.probe {
				ev = ev.Bool("probe", true)
			}
			if b.synthetic {
				ev = ev.Bool("synthetic", true)
			}
			ts = b.start.UTC().AppendFormat(ts[:0], StampFormat)
			ev = ev.Bytes("start", ts)
			if !b.end.IsZero() {
				ts = b.end.UTC().AppendFormat(ts[:0], StampFormat)
				ev = ev.Bytes("end", ts)
			}
		}
		ev.Send()
		a.buffered++
		if _, err := w.Write(line.Bytes()); err != nil {
			fail(err)
			continue
		}
		if len(a.queue) == 0 {
			flush()
		}
	}
	flush()
}
