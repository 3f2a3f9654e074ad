package replay

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/relay"
)

// readerSource is a Source that reads r, once.
func readerSource(name string, r io.Reader) Source {
	return Source{Name: name, Open: func() (io.ReadCloser, error) { return io.NopCloser(r), nil }}
}

// textSource is a Source of the lines given, each ended by a newline.
func textSource(name string, lines ...string) Source {
	text := strings.Join(lines, "\n") + "\n"
	return Source{Name: name, Open: func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(text)), nil }}
}

// settings returns a set named name whose every target runs with p.
func settings(name string, p breaker.Policy) Settings {
	return Settings{Name: name, Defaults: relay.TargetSettings{Policy: p}}
}

// run replays sources with sets and fails the test on error.
func run(t *testing.T, sources []Source, sets ...Settings) *Report {
	t.Helper()
	rep, err := Run(context.Background(), Config{Sets: sets}, sources)
	require.NoError(t, err)
	return rep
}

// lines returns transitions as breaker log lines.
func lines(ts []breaker.Transition) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		l := breakerlog.AppendLine(nil, t)
		out[i] = string(l[:len(l)-1])
	}
	return out
}

func TestReplayWithTheWritersSettingsGivesItsTransitions(t *testing.T) {
	// The property a replay is trusted for: a log written by a breaker
	// with some settings, replayed with the same settings, gives that
	// breaker's transitions, line for line and to the nanosecond. Each
	// case runs a generated hub through three incidents.
	cases := []struct {
		name   string
		policy breaker.Policy
	}{
		{"consecutive failures", breaker.Policy{FailThreshold: 5, ResetTimeout: 2 * time.Second}},
		{"slow calls", breaker.Policy{FailThreshold: 3, ResetTimeout: time.Second, SlowCall: 250 * time.Millisecond}},
		{"backoff", breaker.Policy{FailThreshold: 4, ResetTimeout: 500 * time.Millisecond, MaxResetTimeout: 4 * time.Second}},
		{"failure rate", breaker.Policy{FailThreshold: 1000, ResetTimeout: time.Second, FailureRate: 0.5, Window: 2 * time.Second, MinSamples: 10}},
		{"everything", breaker.Policy{FailThreshold: 3, ResetTimeout: 300 * time.Millisecond, FailureRate: 0.3, Window: time.Second, MinSamples: 5, SlowCall: 300 * time.Millisecond, MaxResetTimeout: 3 * time.Second}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(2) {
				g := &genLog{Policy: relay.TargetSettings{Policy: tc.policy}, Every: 5 * time.Millisecond,
					Phases: steadyIncident, Lines: 20000, Seed: seed}
				rep := run(t, []Source{readerSource("gen", g)}, settings("same", tc.policy))
				require.NotEmpty(t, g.Transitions)
				require.Equal(t, lines(g.Transitions), lines(rep.Sets[0].Transitions), "seed %d", seed)
				for i := range g.Transitions {
					require.True(t, g.Transitions[i].At.Equal(rep.Sets[0].Transitions[i].At), "seed %d transition %d", seed, i)
				}
				assert.Zero(t, rep.Malformed+rep.Late+rep.Approximate)
				got, logged := rep.Sets[0].Targets[0], rep.Logged[0]
				assert.Zero(t, got.Inferred, "every call the replay made, the hub made")
				for _, n := range []struct {
					what        string
					got, logged int64
				}{
					{"requests", got.Requests, logged.Requests},
					{"calls", got.Calls, logged.Calls},
					{"failed", got.Failed, logged.Failed},
					{"refused", got.Refused, logged.Refused},
					{"probes", got.Probes, logged.Probes},
				} {
					assert.Equal(t, n.logged, n.got, "%s, seed %d", n.what, seed)
				}
			}
		})
	}
}

// at is a time of the hand-written logs: genStart plus ms milliseconds.
func at(ms float64) time.Time {
	return genStart.Add(time.Duration(ms * float64(time.Millisecond)))
}

// callLine is the line of a call to target that the breaker admitted at
// start (ms) and that ended took ms later with code.
func callLine(target string, start, took float64, code string, probe bool) string {
	p := ""
	if probe {
		p = `"probe":true,`
	}
	return fmt.Sprintf(`{"time":%q,"txid":"T","target":%q,"code":%q,"duration_ms":%v,"bytes":1,"breaker":"admitted",%s"start":%q,"end":%q}`,
		at(start+took).Format(relay.TimeFormat), target, code, took, p,
		at(start).Format(relay.StampFormat), at(start+took).Format(relay.StampFormat))
}

// refusedLine is the line of a request to target that the breaker refused
// at ms.
func refusedLine(target string, ms float64) string {
	return fmt.Sprintf(`{"time":%q,"txid":"T","target":%q,"code":"E904","duration_ms":0,"bytes":1,"breaker":"refused","start":%q}`,
		at(ms).Format(relay.TimeFormat), target, at(ms).Format(relay.StampFormat))
}

// chain returns the breaker log lines of target's changes, given as
// "MS:STATE MS:STATE ...": at MS milliseconds it went to STATE from the
// state before (CLOSED at first).
func chain(target, changes string) []string {
	var out []string
	from := "CLOSED"
	for c := range strings.FieldsSeq(changes) {
		ms, to, _ := strings.Cut(c, ":")
		n, err := strconv.ParseFloat(ms, 64)
		if err != nil {
			panic(err)
		}
		out = append(out, at(n).Format(breakerlog.TimeLayout)+"|"+target+"|"+from+"->"+to)
		from = to
	}
	return out
}

// wantIncident is the incident's breaker log.
var wantIncident = chain("CORE", "30:OPEN 1040:HALF_OPEN 1042:OPEN 2050:HALF_OPEN 2053:CLOSED")

// incident is a hand-written log of CORE under a breaker of threshold 3 and
// reset timeout 1 s: three failures open it at 30 ms, requests are refused,
// the first after the reset timeout is the probe, which fails; the next
// probe succeeds.
var incident = []string{
	callLine("CORE", 0, 5, "0000", false),
	callLine("CORE", 10, 1, "E500", false),
	callLine("CORE", 20, 1, "E500", false),
	callLine("CORE", 29, 1, "E500", false), // opens at 30
	refusedLine("CORE", 100),
	refusedLine("CORE", 600),
	callLine("CORE", 1040, 2, "E500", true), // probe at 1040, fails at 1042
	refusedLine("CORE", 1500),
	refusedLine("CORE", 2000),
	callLine("CORE", 2050, 3, "0000", true), // probe at 2050, closes at 2053
	callLine("CORE", 2100, 3, "0000", false),
}

func TestReplayOfAHandWrittenIncident(t *testing.T) {
	tests := []struct {
		name   string
		policy breaker.Policy
		want   []string
		stats  TargetStats
	}{
		{
			name:   "the hub's settings",
			policy: breaker.Policy{FailThreshold: 3, ResetTimeout: time.Second},
			want:   chain("CORE", "30:OPEN 1040:HALF_OPEN 1042:OPEN 2050:HALF_OPEN 2053:CLOSED"),
			stats:  TargetStats{Requests: 11, Calls: 7, Failed: 4, Refused: 4, Probes: 2, Opened: 2, NotClosed: 2023 * time.Millisecond},
		},
		{
			// A threshold of 2 opens at the second failure, so the third
			// call is refused. The hub's two probes still come after each
			// reset timeout, so they probe here too.
			name:   "a threshold of 2",
			policy: breaker.Policy{FailThreshold: 2, ResetTimeout: time.Second},
			want:   chain("CORE", "21:OPEN 1040:HALF_OPEN 1042:OPEN 2050:HALF_OPEN 2053:CLOSED"),
			stats:  TargetStats{Requests: 11, Calls: 6, Failed: 3, Refused: 5, Probes: 2, Opened: 2, NotClosed: 2032 * time.Millisecond},
		},
		{
			// A threshold of 5 does not open by 30: the requests the hub
			// refused at 100 and 600 are sent, and each gets the outcome of
			// the call before it (the failure at 29, 1 ms), so the fifth
			// failure is at 601. The hub's probe at 1040 is refused; the
			// request at 2000 probes, gets the outcome of the hub's failed
			// probe and reopens; the hub's successful probe at 2050 is
			// refused, and so is everything after.
			name:   "a threshold of 5",
			policy: breaker.Policy{FailThreshold: 5, ResetTimeout: time.Second},
			want:   chain("CORE", "601:OPEN 2000:HALF_OPEN 2002:OPEN"),
			stats:  TargetStats{Requests: 11, Calls: 7, Failed: 6, Inferred: 3, Refused: 4, Probes: 1, Opened: 2, NotClosed: 1502 * time.Millisecond},
		},
		{
			// A reset timeout of 400 ms probes with requests the hub
			// refused, at 600, 1500 and 2000; each gets the outcome of the
			// latest call the hub made, a failure, and reopens.
			name:   "a reset timeout of 400 ms",
			policy: breaker.Policy{FailThreshold: 3, ResetTimeout: 400 * time.Millisecond},
			want:   chain("CORE", "30:OPEN 600:HALF_OPEN 601:OPEN 1040:HALF_OPEN 1042:OPEN 1500:HALF_OPEN 1502:OPEN 2000:HALF_OPEN 2002:OPEN"),
			stats:  TargetStats{Requests: 11, Calls: 8, Failed: 7, Inferred: 3, Refused: 3, Probes: 4, Opened: 5, NotClosed: 2073 * time.Millisecond},
		},
		{
			// Backoff doubles the open period after each failed probe: the
			// probe at 1040 fails, so the next may go at 3042, after the
			// end of the log.
			name:   "backoff",
			policy: breaker.Policy{FailThreshold: 3, ResetTimeout: time.Second, MaxResetTimeout: 8 * time.Second},
			want:   chain("CORE", "30:OPEN 1040:HALF_OPEN 1042:OPEN"),
			stats:  TargetStats{Requests: 11, Calls: 5, Failed: 4, Refused: 6, Probes: 1, Opened: 2, NotClosed: 2073 * time.Millisecond},
		},
		{
			// Slow calls: the 5 ms success at 0 is slower than 4 ms, a
			// failure; with the three E500 the count reaches 4 at 30.
			name:   "slow calls",
			policy: breaker.Policy{FailThreshold: 4, ResetTimeout: time.Second, SlowCall: 4 * time.Millisecond},
			want:   chain("CORE", "30:OPEN 1040:HALF_OPEN 1042:OPEN 2050:HALF_OPEN 2053:CLOSED"),
			stats:  TargetStats{Requests: 11, Calls: 7, Failed: 5, Refused: 4, Probes: 2, Opened: 2, NotClosed: 2023 * time.Millisecond},
		},
		{
			// A failure rate of 0.5 over at least 4 results opens at the
			// fourth result, 3 failures of 4, at 30.
			name:   "failure rate",
			policy: breaker.Policy{FailThreshold: 100, ResetTimeout: time.Second, FailureRate: 0.5, MinSamples: 4, Window: time.Minute},
			want:   chain("CORE", "30:OPEN 1040:HALF_OPEN 1042:OPEN 2050:HALF_OPEN 2053:CLOSED"),
			stats:  TargetStats{Requests: 11, Calls: 7, Failed: 4, Refused: 4, Probes: 2, Opened: 2, NotClosed: 2023 * time.Millisecond},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := run(t, []Source{textSource("incident", incident...)}, settings("x", tc.policy))
			assert.Equal(t, tc.want, lines(rep.Sets[0].Transitions))
			tc.stats.Target = "CORE"
			assert.Equal(t, tc.stats, rep.Sets[0].Targets[0])
		})
	}
}

func TestFallbacks(t *testing.T) {
	// Given the incident, where CORE falls back to CORE_DR while its
	// breaker refuses: the log has CORE_DR's answers for CORE,
	refused := map[string]float64{}
	for _, ms := range []float64{100, 600, 1500, 2000} {
		refused[refusedLine("CORE", ms)] = ms
	}
	var in []string
	for _, l := range incident {
		if ms, ok := refused[l]; ok {
			l = strings.Replace(callLine("CORE_DR", ms, 0.5, "0000", false), `"target":"CORE_DR",`,
				`"target":"CORE_DR","fallback_for":"CORE",`, 1)
		}
		in = append(in, l)
	}
	fallback := func(p breaker.Policy) Settings {
		s := settings("x", p)
		s.Targets = []relay.Target{{Name: "CORE", Fallback: "CORE_DR"}}
		return s
	}

	// when it is replayed with the hub's settings, the fallback takes the
	// same requests;
	rep := run(t, []Source{textSource("fb", in...)}, fallback(hubPolicy))
	assert.Equal(t, wantIncident, lines(rep.Sets[0].Transitions))
	core, dr := rep.Sets[0].target("CORE"), rep.Sets[0].target("CORE_DR")
	assert.Equal(t, TargetStats{Target: "CORE", Requests: 11, Calls: 7, Failed: 4, ToFallback: 4, Probes: 2, Opened: 2, NotClosed: 2023 * time.Millisecond}, core)
	assert.Equal(t, TargetStats{Target: "CORE_DR", Calls: 4}, dr)
	assert.Equal(t, rep.logged("CORE").ToFallback, core.ToFallback)
	assert.Equal(t, rep.logged("CORE_DR").Calls, dr.Calls)

	// with a threshold of 2, the third failure goes to CORE_DR instead,
	// with the outcome CORE_DR gave before it (none yet: a success);
	rep = run(t, []Source{textSource("fb", in...)}, fallback(breaker.Policy{FailThreshold: 2, ResetTimeout: time.Second}))
	dr = rep.Sets[0].target("CORE_DR")
	assert.Equal(t, TargetStats{Target: "CORE_DR", Calls: 5, Inferred: 1}, dr)

	// and without the fallback, CORE's refusals are E904 again.
	rep = run(t, []Source{textSource("fb", in...)}, settings("x", hubPolicy))
	assert.Equal(t, int64(4), rep.Sets[0].target("CORE").Refused)
	assert.Zero(t, rep.Sets[0].target("CORE_DR").Calls)
}

// syntheticLine is the line of one of the hub's synthetic probes to
// target, admitted at start ms, ended took ms later with code.
func syntheticLine(target string, start, took float64, code string) string {
	return fmt.Sprintf(`{"time":%q,"txid":"PROBE-hub-1","target":%q,"code":%q,"duration_ms":%v,"bytes":10,"breaker":"admitted","probe":true,"synthetic":true,"start":%q,"end":%q}`,
		at(start+took).Format(relay.TimeFormat), target, code, took,
		at(start).Format(relay.StampFormat), at(start+took).Format(relay.StampFormat))
}

func TestReplayOfSyntheticProbes(t *testing.T) {
	// A hub with synthetic probes (probe_payload, probe_expect 0000 and
	// B204): CORE opens at 30, the hub's probe fails at 1042, customers
	// are refused at 1045 and 2045 though the open period has passed, and
	// its probe answered B204 closes it at 2053.
	log := []string{
		callLine("CORE", 0, 5, "0000", false),
		callLine("CORE", 10, 1, "E500", false),
		callLine("CORE", 20, 1, "E500", false),
		callLine("CORE", 29, 1, "E500", false),
		refusedLine("CORE", 100),
		refusedLine("CORE", 600),
		syntheticLine("CORE", 1040, 2, "E500"),
		refusedLine("CORE", 1045),
		refusedLine("CORE", 2045),
		syntheticLine("CORE", 2050, 3, "B204"),
		callLine("CORE", 2100, 3, "0000", false),
	}
	hub := relay.TargetSettings{ProbePayload: "BAL HEALTH", ProbeExpect: []string{"0000", "B204"},
		Policy: breaker.Policy{FailThreshold: 3, ResetTimeout: time.Second}}
	tests := []struct {
		name     string
		settings relay.TargetSettings
		want     []string
	}{
		{
			name:     "the hub's settings",
			settings: hub,
			want:     chain("CORE", "30:OPEN 1040:HALF_OPEN 1042:OPEN 2050:HALF_OPEN 2053:CLOSED"),
		},
		{
			// Without a probe payload the hub's probes are skipped and the
			// customers probe: the one at 1045 gets the outcome of the
			// latest call (E500 at 29, 1 ms) and reopens until 2046; the
			// one at 2100 closes it.
			name:     "customers probing",
			settings: relay.TargetSettings{Policy: hub.Policy},
			want:     chain("CORE", "30:OPEN 1045:HALF_OPEN 1046:OPEN 2100:HALF_OPEN 2103:CLOSED"),
		},
		{
			// Expecting only 0000, the B204 probe fails too.
			name:     "only 0000 healthy",
			settings: relay.TargetSettings{ProbePayload: "BAL HEALTH", Policy: hub.Policy},
			want:     chain("CORE", "30:OPEN 1040:HALF_OPEN 1042:OPEN 2050:HALF_OPEN 2053:OPEN"),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := run(t, []Source{textSource("incident", log...)}, Settings{Name: "x", Defaults: tc.settings})
			assert.Equal(t, tc.want, lines(rep.Sets[0].Transitions))
			assert.Equal(t, int64(2), rep.Synthetic)
			assert.Equal(t, int64(9), rep.Requests, "the probes are no customer's requests")
			assert.Zero(t, rep.Malformed)
			assert.Equal(t, int64(2), rep.Logged[0].Probes)
		})
	}
}
