package breaker_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
)

// policyModel is a deliberately plain reference breaker with every policy of
// Settings, for TestAgainstPolicyModel. It keeps every recent result in a
// list and decides from the documented rules, not from the real breaker's
// packed word and bucket ring.
type policyModel struct {
	threshold    int
	reset        time.Duration
	maxReset     time.Duration
	jitter       float64
	rnd          func() float64
	slow         time.Duration
	rate         float64
	width        time.Duration // a tenth of the window
	minSamples   int
	probeTimeout time.Duration

	state     breaker.State
	fails     int
	gen       int
	period    time.Duration
	openedAt  time.Time
	openFor   time.Duration
	nextShare float64
	probeOut  bool
	probeAt   time.Time
	held      bool
	disabled  bool
	results   []modelResult
	base      time.Time // the first result's time: slices of the window count from it
	baseSet   bool
	// transitions are the state changes the breaker must report, as the
	// test's breaker names itself.
	transitions []breaker.Transition
}

type modelResult struct {
	at     time.Time
	failed bool
}

func newPolicyModel(s breaker.Settings) *policyModel {
	m := &policyModel{
		threshold: s.FailThreshold, reset: s.ResetTimeout, jitter: s.ResetJitter, rnd: s.Rand,
		slow: s.SlowCall, rate: s.FailureRate, width: s.Window / 10, minSamples: s.MinSamples,
		probeTimeout: s.ProbeTimeout, period: s.ResetTimeout,
	}
	if s.MaxResetTimeout > s.ResetTimeout {
		m.maxReset = s.MaxResetTimeout
	}
	if m.jitter > 0 {
		m.nextShare = m.rnd()
	}
	return m
}

// slice is the tenth of the window that t falls in.
func (m *policyModel) slice(t time.Time) int64 { return int64(t.Sub(m.base) / m.width) }

// recent counts the results no more than nine slices older than now's.
func (m *policyModel) recent(now time.Time) (total, failed int) {
	for _, r := range m.results {
		if m.slice(r.at) > m.slice(now)-10 {
			total++
			if r.failed {
				failed++
			}
		}
	}
	return total, failed
}

func (m *policyModel) startPeriod(now time.Time) {
	m.openedAt = now
	m.openFor = m.period
	if m.jitter > 0 {
		m.openFor += time.Duration(float64(m.period) * (m.nextShare * m.jitter))
		m.nextShare = m.rnd()
	}
}

func (m *policyModel) moveTo(to breaker.State, now time.Time, cause breaker.Cause) {
	from := m.state
	defer func() {
		t := breaker.Transition{Name: "CORE", From: from, To: to, At: now, Cause: cause, Period: m.period}
		if to == breaker.Open && !m.held {
			t.OpenFor = m.openFor
		}
		m.transitions = append(m.transitions, t)
	}()
	m.state = to
	m.gen++
	m.probeOut = false
	m.results = nil
	switch to {
	case breaker.Closed:
		m.fails = 0
		m.period = m.reset
	case breaker.Open:
		if !m.held {
			m.startPeriod(now)
		}
	}
}

func (m *policyModel) allow(now time.Time) (modelTicket, bool) {
	switch m.state {
	case breaker.Closed:
		return modelTicket{gen: m.gen}, true
	case breaker.Open:
		if m.held || now.Sub(m.openedAt) < m.openFor {
			return modelTicket{}, false
		}
		m.moveTo(breaker.HalfOpen, now, breaker.CauseProbe)
	default:
		if m.probeOut && (m.probeTimeout == 0 || now.Sub(m.probeAt) < m.probeTimeout) {
			return modelTicket{}, false
		}
		m.gen++
	}
	m.probeOut, m.probeAt = true, now
	return modelTicket{gen: m.gen, probe: true}, true
}

func (m *policyModel) done(t modelTicket, failed bool, took time.Duration, now time.Time) {
	if m.slow > 0 && took > m.slow {
		failed = true
	}
	if t.gen != m.gen {
		return
	}
	if t.probe {
		if !failed {
			m.moveTo(breaker.Closed, now, breaker.CauseResults)
			return
		}
		m.fails++
		if m.maxReset > 0 {
			m.period = min(2*m.period, m.maxReset)
		}
		m.moveTo(breaker.Open, now, breaker.CauseResults)
		return
	}
	if failed {
		m.fails++
	} else {
		m.fails = 0
	}
	tripped := m.fails >= m.threshold
	if m.rate > 0 {
		if !m.baseSet {
			m.base, m.baseSet = now, true
		}
		m.results = append(m.results, modelResult{at: now, failed: failed})
		total, failures := m.recent(now)
		tripped = tripped || total >= m.minSamples && float64(failures)/float64(total) >= m.rate
	}
	if tripped && !m.disabled {
		m.moveTo(breaker.Open, now, breaker.CauseResults)
	}
}

func (m *policyModel) cancel(t modelTicket) {
	if t.probe && t.gen == m.gen {
		m.probeOut = false
	}
}

func (m *policyModel) holdOpen(now time.Time) {
	m.disabled, m.held = false, true
	if m.state != breaker.Open {
		m.moveTo(breaker.Open, now, breaker.CauseOperator)
	}
}

func (m *policyModel) forceClose(now time.Time) {
	m.disabled, m.held = false, false
	m.period = m.reset
	m.results = nil
	if m.state != breaker.Closed {
		m.moveTo(breaker.Closed, now, breaker.CauseOperator)
	}
	m.fails = 0
}

func (m *policyModel) disable(now time.Time) {
	m.disabled, m.held = true, false
	if m.state != breaker.Closed {
		m.moveTo(breaker.Closed, now, breaker.CauseOperator)
	}
}

func (m *policyModel) enable(now time.Time) {
	m.disabled = false
	if m.held {
		m.held = false
		m.period = m.reset
		m.startPeriod(now)
	}
}

func (m *policyModel) snapshot(now time.Time) breaker.Snapshot {
	s := breaker.Snapshot{State: m.state, ConsecutiveFailures: m.fails, Held: m.held, Disabled: m.disabled}
	if m.state == breaker.Open && !m.held {
		s.RetryAfter = max(m.openedAt.Add(m.openFor).Sub(now), 0)
	}
	if m.rate > 0 && m.baseSet {
		s.RecentCalls, s.RecentFailures = m.recent(now)
	}
	return s
}

// TestAgainstPolicyModel replays thousands of random events, manual control
// included, against a breaker with every policy on and against the
// reference model, and compares them after every step.
func TestAgainstPolicyModel(t *testing.T) {
	for seed := range uint64(30) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 43))
			reset := time.Duration(1+rng.IntN(5)) * time.Second
			s := breaker.Settings{
				Policy: breaker.Policy{
					FailThreshold:   1 + rng.IntN(6),
					ResetTimeout:    reset,
					FailureRate:     []float64{0, 0.3, 0.5, 0.75, 1}[rng.IntN(5)], // sometimes off: the lock-free closed path
					Window:          time.Duration(2+rng.IntN(8)) * time.Second,
					MinSamples:      1 + rng.IntN(8),
					SlowCall:        500 * time.Millisecond,
					MaxResetTimeout: reset * time.Duration(rng.IntN(5)), // sometimes not above the reset: no backoff
					ResetJitter:     []float64{0, 0.3, 1}[rng.IntN(3)],
				},
				ProbeTimeout: []time.Duration{0, 2 * time.Second}[rng.IntN(2)],
			}
			// The breaker and the model draw jitter from twin sources.
			s.Rand = rand.New(rand.NewPCG(seed, 44)).Float64
			b, clk, rec := newPolicyBreaker(t, s)
			s.Rand = rand.New(rand.NewPCG(seed, 44)).Float64
			m := newPolicyModel(s)

			type pair struct {
				real  breaker.Ticket
				model modelTicket
			}
			var out []pair
			take := func() pair {
				i := rng.IntN(len(out))
				p := out[i]
				out = append(out[:i], out[i+1:]...)
				return p
			}
			for step := range 5000 {
				now := clk.Now()
				switch ev := rng.IntN(100); {
				case ev < 38:
					tk, _, err := b.Allow()
					mt, ok := m.allow(now)
					require.Equal(t, ok, err == nil, "step %d: admission", step)
					if ok {
						require.Equal(t, mt.probe, tk.Probe(), "step %d: probe", step)
						out = append(out, pair{tk, mt})
					}
				case ev < 76 && len(out) > 0:
					p := take()
					failed := rng.IntN(3) == 0
					took := time.Duration(rng.IntN(700)) * time.Millisecond
					b.Done(p.real, failed, took)
					m.done(p.model, failed, took, now)
				case ev < 84 && len(out) > 0:
					p := take()
					b.Cancel(p.real)
					m.cancel(p.model)
				case ev == 96:
					b.HoldOpen()
					m.holdOpen(now)
				case ev == 97:
					b.ForceClose()
					m.forceClose(now)
				case ev == 98:
					b.Disable()
					m.disable(now)
				case ev == 99:
					b.Enable()
					m.enable(now)
				default:
					clk.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
				}
				require.Equal(t, m.snapshot(clk.Now()), b.Snapshot(), "step %d", step)
				require.Equal(t, len(m.transitions), rec.len(), "step %d: transitions", step)
			}
			require.Equal(t, m.transitions, rec.list(), "the transitions, in order, with their times")
		})
	}
}
