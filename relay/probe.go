package relay

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/targethttp"
)

// Synthetic recovery probes (docs/PROTOCOL.md, "Synthetic recovery
// probes"): a target with a probe payload (TargetSettings.ProbePayload) is
// never probed with a customer's transaction. Its breaker takes only
// synthetic probes (breaker.Policy.SyntheticProbes), and one goroutine of
// the Server per such target, its prober, sends the probe when the breaker
// says one is due: a call like any other (POST /tx, X-Tx-Id, through the
// target's bulkhead and timeout) with a TXID of the hub's own and the
// payload, judged healthy when its answer code is one of ProbeExpect.

// DefaultProbeExpect is the answer code of a healthy probe when
// TargetSettings.ProbeExpect is empty.
const DefaultProbeExpect = protocol.CodeOK

// ProbeTxIDPrefix begins the TXID of every synthetic probe:
// PROBE-<hub id>-<hub start, base 36 ms>-<n>, cut from the left of the hub
// id to 64 characters. Clients should not use TXIDs that begin with it.
const ProbeTxIDPrefix = "PROBE-"

// Timings of the prober.
const (
	// probePoll is how often a prober asks again while its breaker waits
	// for a permit, or for a probe it did not send.
	probePoll = 50 * time.Millisecond
	// probeMaxSleep bounds a prober's sleep, so that a change that does
	// not wake it (an operator's Enable, an open period adopted from
	// another hub, a permit) is seen within it.
	probeMaxSleep = time.Second
	// probeIdle is a prober's sleep while its breaker is closed: the
	// breaker's next change wakes it.
	probeIdle = time.Hour
	// probeRestartPause is how long a prober that panicked waits before it
	// starts again.
	probeRestartPause = time.Second
)

// ParseProbeCode checks one answer code for ProbeExpect and returns it in
// canonical (upper-case) form: 0000, a business code Bnnn, or a target's
// own error code from E000 to E899 but E500 (a failure is never healthy).
// The hub's own codes (E900 and above) never come from a target.
func ParseProbeCode(s string) (string, error) {
	c := s
	if len(c) == 4 && (c[0] == 'b' || c[0] == 'e') {
		c = string(c[0]-('a'-'A')) + c[1:]
	}
	switch {
	case !protocol.ValidTargetCode(c):
		return "", fmt.Errorf("probe code %q: want 0000, Bnnn or a target's own Ennn below E900", s)
	case c == protocol.CodeTargetFailed:
		return "", fmt.Errorf("probe code %s: a failure is never healthy", c)
	case c[0] == 'E' && c[1] == '9':
		return "", fmt.Errorf("probe code %s: E900 and above are the hub's own, never a target's answer", c)
	}
	return c, nil
}

// parseProbeExpect checks codes with ParseProbeCode and returns them in
// canonical form; none means DefaultProbeExpect.
func parseProbeExpect(in []string) ([]string, error) {
	if len(in) == 0 {
		return []string{DefaultProbeExpect}, nil
	}
	out := make([]string, 0, len(in))
	for _, c := range in {
		code, err := ParseProbeCode(c)
		if err != nil {
			return nil, err
		}
		out = append(out, code)
	}
	return out, nil
}

// checkProbePayload refuses a probe payload that cannot be a line's
// payload: one with a line break.
func checkProbePayload(p string) error {
	if strings.ContainsAny(p, "\r\n") {
		return errors.New("ProbePayload must not hold a line break")
	}
	return nil
}

// ProbeResult is a target's latest synthetic probe. It is a plain value.
type ProbeResult struct {
	// TxID is the probe's own TXID.
	TxID string
	// At is when the probe's answer came (or its call ended).
	At time.Time
	// Healthy reports that the breaker took it as healthy: its code was one
	// of ProbeExpect and, with SlowCall set, it was not slow.
	Healthy bool
	// Code is the answer code, the hub's (E901, E902, E500) when the call
	// failed.
	Code string
	// Duration is how long the call took.
	Duration time.Duration
}

// prober is a target's side of its synthetic probes. It is safe for
// concurrent use.
type prober struct {
	// wake tells the prober to look at its breaker again; buffered, so a
	// wake-up sent while it probes is not lost.
	wake chan struct{}
	mu   sync.Mutex
	on   bool // guarded by mu: the prober's goroutine runs
	last atomic.Pointer[ProbeResult]
}

// poke wakes the prober, unless a wake-up is already waiting. It never
// blocks, so the breaker's observer may call it under the breaker's lock.
func (p *prober) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// startProbers starts the prober of every target that has a probe payload
// and none running, and wakes those running, so that they see a new
// configuration.
func (s *Server) startProbers(routes []*target) {
	for _, rt := range routes {
		rt.prober.mu.Lock()
		if !rt.prober.on && len(rt.conf.Load().probePayload) > 0 {
			rt.prober.on = true
			s.serving.clientWork.Go(func() { s.runProber(rt) })
		}
		rt.prober.mu.Unlock()
		rt.prober.poke()
	}
}

// runProber runs rt's prober until it ends, catching its panics where they
// happen (logged and counted like any of the hub's) and starting it again
// after a pause.
func (s *Server) runProber(rt *target) {
	for s.catchPanic(taskProber, func() { s.probeLoop(rt) }) {
		t := time.NewTimer(probeRestartPause)
		select {
		case <-s.serving.stopping:
			t.Stop()
			rt.prober.end()
			return
		case <-t.C:
		}
	}
}

// probeLoop sends rt's synthetic probes when its breaker says one is due,
// sleeping on the breaker's retry-after in between, until the Server stops
// or rt no longer has a probe payload (a reload took it away, or removed
// the target).
func (s *Server) probeLoop(rt *target) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-s.serving.stopping:
			rt.prober.end()
			return
		case <-rt.prober.wake:
		case <-timer.C:
		}
		if s.endProber(rt) {
			return
		}
		timer.Reset(s.probeOnce(rt, rt.conf.Load()))
	}
}

// end marks the prober's goroutine ended, so that the next start runs one
// again.
func (p *prober) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.on = false
}

// endProber reports whether rt's prober must end, because rt has no probe
// payload or is no longer served, and if so marks it ended.
func (s *Server) endProber(rt *target) bool {
	rt.prober.mu.Lock()
	defer rt.prober.mu.Unlock()
	if len(rt.conf.Load().probePayload) > 0 && slices.Contains(s.table.all(), rt) {
		return false
	}
	rt.prober.on = false
	return true
}

// probeOnce sends rt's probe if its breaker admits one now, and returns how
// long to sleep before asking again.
func (s *Server) probeOnce(rt *target, conf *targetConf) time.Duration {
	// Read for the access log just before the breaker decides, as for a
	// client's request: a replay of the log puts the decision here.
	asked := s.obs.access.now()
	ticket, wait, err := rt.breaker.AllowProbe()
	switch {
	case errors.Is(err, breaker.ErrClosed):
		return probeIdle
	case errors.Is(err, breaker.ErrHeld):
		return probeMaxSleep
	case err != nil && wait == 0:
		return probePoll
	case err != nil:
		return min(wait, probeMaxSleep)
	}
	rt.logTransitions()
	if !rt.bulkhead.TryAcquire() {
		// Calls admitted before the breaker opened fill the bulkhead: the
		// probe is handed back and tried again shortly.
		rt.breaker.Cancel(ticket)
		return probePoll
	}
	if !s.sendProbe(rt, conf, ticket, asked) {
		return probePoll
	}
	return 0
}

// sendProbe sends one probe admitted with ticket at asked (the breakers'
// clock, for the access log) and holding a bulkhead slot, records its
// result with the breaker and releases the slot. A probe the hub could not
// send for want of its own resources hands the ticket back, like a full
// bulkhead, and sendProbe reports false: it tells nothing of the target.
// A panic hands the ticket back and releases the slot before it goes on
// up.
func (s *Server) sendProbe(rt *target, conf *targetConf, ticket breaker.Ticket, asked time.Time) (sent bool) {
	reported, released := false, false
	defer func() {
		if !reported {
			rt.breaker.Cancel(ticket)
		}
		if !released {
			rt.bulkhead.Release()
		}
	}()
	txid := s.probeTxID()
	start := time.Now()
	res := conf.client.Call(txid, conf.probePayload)
	took := time.Since(start)
	if res.Fault != targethttp.NoHubFault {
		rt.metrics.countHubRefusal(res.Fault)
		s.logHubFault(rt, txid, res)
		return false
	}
	healthy := slices.Contains(conf.probeExpect, res.Code)
	slow := conf.settings.SlowCall > 0 && took > conf.settings.SlowCall
	end := s.obs.access.now()
	// Recorded before the breaker hears of it, so that whoever sees the
	// breaker change finds the probe that changed it.
	r := &ProbeResult{TxID: string(txid), At: start.Add(took), Healthy: healthy && !slow, Code: res.Code, Duration: took}
	rt.prober.last.Store(r)
	rt.metrics.observeProbe(r)
	reported = true
	rt.breaker.Done(ticket, !healthy, took)
	rt.logTransitions()
	released = true
	rt.bulkhead.Release()

	s.obs.access.record(accessNote{txid: txid, target: rt.nameBytes, code: res.Code, took: took, size: len(conf.probePayload),
		breaker: breakerNote{use: breakerAdmitted, probe: true, synthetic: true, start: asked, end: end}})
	ev := rt.log.Info()
	if !r.Healthy {
		ev = rt.log.Warn().Bytes("detail", res.Msg)
	}
	ev.Bytes("txid", txid).Str("code", res.Code).Bool("healthy", r.Healthy).
		Float64("duration_ms", float64(took.Microseconds())/1000).Msg("synthetic probe done")
	return true
}

// probeTxID returns the TXID of the next synthetic probe:
// PROBE-<hub id>-<hub start>-<n>, at most 64 characters, the hub id cut
// from the left when too long. The hub's start, in base-36 milliseconds,
// keeps a restarted hub from reusing a TXID that an idempotent target
// remembers.
func (s *Server) probeTxID() []byte {
	hub := "hub"
	if id := s.inDoubt.hubID.Load(); id != nil {
		hub = *id
	}
	tail := "-" + strconv.FormatInt(s.started.UnixMilli(), 36) + "-" + strconv.FormatUint(s.probeSeq.Add(1), 10)
	if room := protocol.MaxTxIDLen - len(ProbeTxIDPrefix) - len(tail); len(hub) > room {
		hub = hub[len(hub)-room:]
	}
	return []byte(ProbeTxIDPrefix + hub + tail)
}
