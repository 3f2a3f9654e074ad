package main_test

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
	"github.com/relayhub/relayhub/internal/testutil/toxitest"
	"github.com/relayhub/relayhub/relay/indoubt"
)

// These tests put Shopify's toxiproxy, a real TCP proxy, between the real
// binaries: between the relay and a target, where it delays, stalls,
// resets, slices and cuts the target's answers, and between clients and
// the relay, where it slices the requests and resets connections in the
// middle of a line. Whatever the network does, they hold the relay to
// docs/PROTOCOL.md: every line answered exactly once ("One answer per
// line"), every answer of unknown outcome in the in-doubt journal ("Sent or
// in doubt", "In-doubt journal"), no transaction reaching its target twice
// ("Never sent twice"), and the breaker log's chains unbroken ("Breaker
// log").

// toxiTargetTimeout is the relay's --target-timeout in the tests of the
// target's link: the latency toxic holds answers well beyond it, and a
// healthy call, even on a loaded machine, ends well within it.
const toxiTargetTimeout = time.Second

// toxiLine is one line a client of these tests sends.
type toxiLine struct {
	txid   string // "" for a blank line, which gets no answer
	target string
	text   string // the line without its '\n'
}

// newToxiLine returns the line TXID|TARGET|PAYLOAD.
func newToxiLine(txid, target, payload string) toxiLine {
	return toxiLine{txid: txid, target: target, text: txid + "|" + target + "|" + payload}
}

// toxiBatch returns n lines with TXIDs prefix-0000, ...: mostly CORE
// (deposits, balances, withdrawals refused B201), every fourth CLAIM.
func toxiBatch(prefix string, n int) []toxiLine {
	lines := make([]toxiLine, 0, n)
	for i := range n {
		txid := fmt.Sprintf("%s-%04d", prefix, i)
		switch i % 4 {
		case 0:
			lines = append(lines, newToxiLine(txid, "CORE", fmt.Sprintf("DEP A%04d 10", i)))
		case 1:
			lines = append(lines, newToxiLine(txid, "CORE", fmt.Sprintf("BAL A%04d", i)))
		case 2:
			lines = append(lines, newToxiLine(txid, "CORE", fmt.Sprintf("WD A%04d 99999999", i)))
		default:
			lines = append(lines, newToxiLine(txid, "CLAIM", fmt.Sprintf("SUBMIT POL%04d 100", i)))
		}
	}
	return lines
}

// sendToxiBatch sends lines on c, keeping at most window of them
// unanswered, and reads their answers. It returns every answer read and,
// if reading ended early, why: the connection's end (a reset), a line that
// is not a response (protocol.ParseResponse), or an answer for no line
// outstanding (an unknown or repeated TXID). A partial line before the
// connection's end is not an answer. It uses no method of c that fails the
// test, so it may run on a goroutine of its own.
func sendToxiBatch(c *hubtest.Client, lines []toxiLine, window int) ([]hubtest.Response, error) {
	var (
		mu       sync.Mutex
		pending  = map[string]bool{} // guarded by mu
		slots    = make(chan struct{}, window)
		stop     = make(chan struct{})
		wrote    = make(chan struct{})
		expected = 0
	)
	for _, l := range lines {
		if l.txid != "" {
			expected++
		}
	}
	go func() {
		defer close(wrote)
		for _, l := range lines {
			if l.txid != "" {
				select {
				case slots <- struct{}{}:
				case <-stop:
					return
				}
				mu.Lock()
				pending[l.txid] = true
				mu.Unlock()
			}
			if _, err := c.Write([]byte(l.text + "\n")); err != nil {
				return // the reader sees the connection's end too
			}
		}
	}()
	defer func() {
		close(stop)
		c.Close()
		<-wrote
	}()

	answers := make([]hubtest.Response, 0, expected)
	for len(answers) < expected {
		line, err := c.ReadLine(hubtest.ClientTimeout)
		if err != nil {
			return answers, fmt.Errorf("after %d answers: %w", len(answers), err)
		}
		a, err := hubtest.ParseResponse(line)
		if err != nil {
			return answers, err
		}
		mu.Lock()
		ok := pending[a.TxID]
		delete(pending, a.TxID)
		mu.Unlock()
		if !ok {
			return answers, fmt.Errorf("answer %q is for no line outstanding: unknown or repeated TXID", a)
		}
		answers = append(answers, a)
		<-slots
	}
	return answers, nil
}

// toxiLedger is what the clients of one test sent and got, and where the
// relay and the targets keep their own account of it.
type toxiLedger struct {
	sent     map[string]toxiLine         // by TXID
	answers  map[string]hubtest.Response // by TXID
	journal  string                      // the relay's --in-doubt-log
	fixtures map[string]*proctest.Fixture
}

func newToxiLedger(journal string, fixtures map[string]*proctest.Fixture) *toxiLedger {
	return &toxiLedger{sent: map[string]toxiLine{}, answers: map[string]hubtest.Response{}, journal: journal, fixtures: fixtures}
}

// add records lines sent and the answers got for them, failing the test on
// a TXID answered twice across batches.
func (l *toxiLedger) add(t *testing.T, lines []toxiLine, answers []hubtest.Response) {
	t.Helper()
	for _, ln := range lines {
		if ln.txid != "" {
			l.sent[ln.txid] = ln
		}
	}
	for _, a := range answers {
		_, dup := l.answers[a.TxID]
		require.False(t, dup, "TXID %s answered twice", a.TxID)
		l.answers[a.TxID] = a
	}
}

// run sends lines on a new connection to addr and records them, failing
// the test unless every line is answered.
func (l *toxiLedger) run(t *testing.T, addr string, lines []toxiLine, window int) []hubtest.Response {
	t.Helper()
	answers, err := sendToxiBatch(hubtest.Dial(t, addr), lines, window)
	require.NoError(t, err)
	l.add(t, lines, answers)
	return answers
}

// inDoubt reports whether an answer says its transaction may have been
// processed.
func inDoubt(a hubtest.Response) bool { return strings.HasSuffix(a.Message, "; outcome unknown") }

// check holds the ledger to the relay's promises. allAnswered: every line
// sent got its answer (false when some clients were reset). reachedInDoubt:
// whether the calls in doubt did reach their target, as the toxic decides
// (one that swallows requests lets none through).
func (l *toxiLedger) check(t *testing.T, allAnswered, reachedInDoubt bool) {
	t.Helper()
	if allAnswered {
		var missing []string
		for txid := range l.sent {
			if _, ok := l.answers[txid]; !ok {
				missing = append(missing, txid)
			}
		}
		assert.Empty(t, missing, "lines without an answer")
	}

	// Every answer of unknown outcome is in the journal, with its code,
	// and the journal holds nothing else but the settlements of answers
	// that came late and were read on.
	journalled := map[string]string{}
	for _, e := range logtest.FileLines(t, l.journal) {
		txid, _ := e["txid"].(string)
		if indoubt.IsResolution(e["stage"].(string)) {
			require.Equal(t, indoubt.ViaLateAnswer, e["via"], "no resend nor look-up in these tests: %v", e)
			continue
		}
		_, dup := journalled[txid]
		assert.False(t, dup, "%s journalled twice", txid)
		journalled[txid], _ = e["code"].(string)
	}
	doubtful := map[string]string{}
	for txid, a := range l.answers {
		if inDoubt(a) {
			doubtful[txid] = a.Code
		}
	}
	assert.Equal(t, doubtful, journalled, "the journal holds exactly the answers of unknown outcome")

	// No transaction reached its target twice; those answered by their
	// target reached it, those refused or not sent did not.
	for name, f := range l.fixtures {
		f.SettledStats(t)
		seen := map[string]int{}
		for _, txid := range f.Received(t) {
			seen[txid]++
		}
		for txid, n := range seen {
			assert.Equal(t, 1, n, "%s reached %s %d times", txid, name, n)
		}
		for txid, a := range l.answers {
			if l.sent[txid].target != name {
				continue
			}
			switch {
			case healthyCodes.MatchString(a.Code):
				assert.Contains(t, seen, txid, "%s was answered by %s", a, name)
			case a.Code == "E904" || a.Code == "E905" || a.Code == "E900" || strings.HasSuffix(a.Message, "; not sent"):
				assert.NotContains(t, seen, txid, "%s never left the relay", a)
			case inDoubt(a) && reachedInDoubt:
				assert.Contains(t, seen, txid, "%s: the toxic let the request through", a)
			case inDoubt(a):
				assert.NotContains(t, seen, txid, "%s: the toxic swallowed the request", a)
			}
		}
	}
}

// checkBreakerLog checks that the breaker log's chains are unbroken and
// that every target's last change, if any, left its breaker closed.
func checkBreakerLog(t *testing.T, path string) {
	t.Helper()
	entries, _, err := breakerlog.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, breakerlog.CheckChains(entries))
	last := map[string]string{}
	for _, e := range entries {
		last[e.Name] = e.To.String()
	}
	for name, state := range last {
		assert.Equal(t, "CLOSED", state, "%s's breaker after recovery", name)
	}
}

// countAnswers returns how many answers read CODE|MESSAGE as want matches.
func countAnswers(answers []hubtest.Response, want *regexp.Regexp) int {
	n := 0
	for _, a := range answers {
		if want.MatchString(a.Code + "|" + a.Message) {
			n++
		}
	}
	return n
}

// healthyCOREAnswer is what a CORE line of the batches gets, as
// CODE|MESSAGE, from a CORE that works.
const healthyCOREAnswer = `0000\|balance=\d+|B201\|insufficient funds`

// healthyCORE and healthyCLAIM match the answers of targets that work.
var (
	healthyCORE  = regexp.MustCompile(`^(` + healthyCOREAnswer + `)$`)
	healthyCLAIM = regexp.MustCompile(`^0000\|`)
)

// openAnswer is an E904 of these tests' breakers.
const openAnswer = `E904\|circuit open; retry after \d+s`

// toxiRelayArgs are the relay's settings in these tests: a target timeout,
// a breaker that trips after five failures and probes again after 100 ms,
// a bulkhead of maxInflight, and a journal.
func toxiRelayArgs(journal string, timeout time.Duration, maxInflight int, targets ...string) []string {
	args := []string{"--target-timeout", timeout.String(), "--fail-threshold", "5",
		"--reset-timeout", "100ms", "--max-inflight", fmt.Sprint(maxInflight), "--in-doubt-log", journal}
	for _, tg := range targets {
		args = append(args, "--target", tg)
	}
	return args
}

// hostPort returns a fixture's address, its URL without the scheme.
func hostPort(f *proctest.Fixture) string { return strings.TrimPrefix(f.URL, "http://") }

// awaitRecovery sends balances to CORE on a new connection to addr until
// one is answered 0000, within a few seconds, and records them: the relay
// serves again once the toxic is gone and the breaker has let a probe
// through.
func (l *toxiLedger) awaitRecovery(t *testing.T, addr, prefix string) {
	t.Helper()
	c := hubtest.Dial(t, addr)
	i := 0
	proctest.Eventually(t, 5*time.Second, "CORE served again after the toxic was removed", func() bool {
		ln := newToxiLine(fmt.Sprintf("%s-%04d", prefix, i), "CORE", "BAL A0000")
		i++
		a := c.Exchange(ln.text)
		l.add(t, []toxiLine{ln}, []hubtest.Response{a})
		return a.Code == "0000"
	})
}

func TestToxiTargetResetBeforeTheFirstAnswerByteIsAConnectionReset(t *testing.T) {
	// Given toxiproxy between the relay and CORE that resets each
	// connection at the first byte of CORE's answer, set before the relay
	// opens one,
	srv := toxitest.Start(t)
	core := proctest.StartFixture(t, "CORE", "core")
	p := srv.Proxy(t, "core", hostPort(core))
	p.AddToxic("rst", "reset_peer", toxitest.Downstream, toxitest.Attributes{"timeout": 0})
	journal := filepath.Join(t.TempDir(), "in-doubt.log")
	h := startRelay(t, nil, toxiRelayArgs(journal, toxiTargetTimeout, 10, "CORE=http://"+p.Listen)...)
	c := hubtest.Dial(t, h.Addr())

	// when a withdrawal is sent,
	a := c.Exchange("RST-1|CORE|WD 1001 500")

	// then CORE booked it, the client is told the connection was reset
	// with the outcome unknown, as docs/PROTOCOL.md words it, and the call
	// is journalled as sent without an answer.
	assert.Equal(t, "RST-1|E902|target unreachable: connection reset; outcome unknown", a.String())
	applied, err := proctest.Tx(core.URL, "RST-1", "WD 1001 500")
	require.NoError(t, err)
	assert.Equal(t, "balance=99500", applied.Message, "CORE had booked it: the repeat gets the first answer")
	lines := logtest.FileLines(t, journal)
	require.Len(t, lines, 1)
	assert.Equal(t, "RST-1", lines[0]["txid"])
	assert.Equal(t, "E902", lines[0]["code"])
	assert.Equal(t, "request_sent", lines[0]["stage"])
}

func TestToxiTargetLink(t *testing.T) {
	srv := toxitest.Start(t)
	tests := []struct {
		name   string
		toxic  string
		stream toxitest.Stream
		attrs  toxitest.Attributes
		// resetOnClose: toxiproxy's closes are resets (Proxy.ResetOnClose).
		resetOnClose bool
		// allowed is every CODE|MESSAGE a CORE line may get while the
		// toxic is on; seen is one that must be among them.
		allowed, seen string
		// reached: the calls in doubt reached CORE; stage: how far they
		// got, as the journal says.
		reached bool
		stage   string
	}{
		{
			name: "answers later than the target timeout", toxic: "latency", stream: toxitest.Downstream,
			attrs:   toxitest.Attributes{"latency": 3000},
			allowed: `E901\|no answer within target timeout; outcome unknown|` + openAnswer,
			seen:    `E901\|no answer within target timeout; outcome unknown`, reached: true, stage: "request_sent",
		},
		{
			name: "a peer that keeps the connection and sends nothing", toxic: "timeout", stream: toxitest.Upstream,
			attrs:   toxitest.Attributes{"timeout": 0},
			allowed: `E901\|no answer within target timeout; outcome unknown|` + openAnswer,
			seen:    `E901\|no answer within target timeout; outcome unknown`, reached: false, stage: "request_sent",
		},
		{
			name: "reset at the first byte of the answer", toxic: "reset_peer", stream: toxitest.Downstream,
			attrs:   toxitest.Attributes{"timeout": 0},
			allowed: `E902\|target unreachable: connection reset; outcome unknown|` + openAnswer,
			seen:    `E902\|target unreachable: connection reset; outcome unknown`, reached: true, stage: "request_sent",
		},
		{
			name: "answers in 1-byte slices", toxic: "slicer", stream: toxitest.Downstream,
			attrs:   toxitest.Attributes{"average_size": 1, "size_variation": 0, "delay": 20},
			allowed: healthyCOREAnswer, seen: healthyCOREAnswer, reached: true,
		},
		{
			// 280 bytes: a first answer of about 150 whole, the next cut
			// in its body, on each connection.
			name: "connection closed after 280 bytes", toxic: "limit_data", stream: toxitest.Downstream,
			attrs: toxitest.Attributes{"bytes": 280},
			allowed: healthyCOREAnswer + `|E902\|target unreachable: connection closed before a full answer; outcome unknown|` +
				openAnswer,
			seen: `E902\|target unreachable: connection closed before a full answer; outcome unknown`, reached: true, stage: "answer_partly_read",
		},
		{
			name: "reset mid answer after 280 bytes", toxic: "limit_data", stream: toxitest.Downstream,
			attrs: toxitest.Attributes{"bytes": 280}, resetOnClose: true,
			allowed: healthyCOREAnswer + `|E902\|target unreachable: connection reset; outcome unknown|` + openAnswer,
			seen:    `E902\|target unreachable: connection reset; outcome unknown`, reached: true, stage: "answer_partly_read",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Given toxiproxy between the relay and CORE with the toxic
			// on before the relay's first connection, and CLAIM reached
			// directly,
			core := proctest.StartFixture(t, "CORE", "core")
			claim := proctest.StartFixture(t, "CLAIM", "claim")
			p := srv.Proxy(t, "core", hostPort(core))
			if tt.resetOnClose {
				p.ResetOnClose()
			}
			p.AddToxic("fault", tt.toxic, tt.stream, tt.attrs)
			journal := filepath.Join(t.TempDir(), "in-doubt.log")
			h := startRelay(t, nil, toxiRelayArgs(journal, toxiTargetTimeout, 10, "CORE=http://"+p.Listen, "CLAIM="+claim.URL)...)
			ledger := newToxiLedger(journal, map[string]*proctest.Fixture{"CORE": core, "CLAIM": claim})

			// when a batch of lines goes through the fault,
			lines := toxiBatch("F", 40)
			answers := ledger.run(t, h.Addr(), lines, 6)

			// then every CORE line got one of the fault's answers, the
			// fault's own among them, and CLAIM answered every one of its
			// lines as if nothing happened;
			allowed := regexp.MustCompile(`^(` + tt.allowed + `)$`)
			for _, a := range answers {
				if ledger.sent[a.TxID].target == "CLAIM" {
					assert.Regexp(t, healthyCLAIM, a.Code+"|"+a.Message, a.TxID)
				} else {
					assert.Regexp(t, allowed, a.Code+"|"+a.Message, a.TxID)
				}
			}
			seen := countAnswers(answers, regexp.MustCompile(`^(`+tt.seen+`)$`))
			assert.Positive(t, seen, "no answer %s", tt.seen)
			t.Logf("%d of %d lines answered %s", seen, len(answers), tt.seen)

			// and once the toxic is removed CORE is served again;
			p.RemoveToxic("fault")
			if tt.resetOnClose {
				p.RemoveToxic("reset-on-close")
			}
			ledger.awaitRecovery(t, h.Addr(), "R")

			for _, e := range logtest.FileLines(t, journal) {
				if !indoubt.IsResolution(e["stage"].(string)) { // ledger.check reads the settlements
					assert.Equal(t, tt.stage, e["stage"], "%s", e["txid"])
				}
			}
			// every line was answered once, every answer of unknown
			// outcome is in the journal, nothing reached a target twice,
			// and the breaker log's chains end closed.
			ledger.check(t, true, tt.reached)
			checkBreakerLog(t, h.logPath)
		})
	}
}

func TestToxiClientLinkRequestsInSlices(t *testing.T) {
	const clients = 3
	// Given toxiproxy between clients and the relay that cuts what the
	// clients write into slices of 1 to 5 bytes,
	srv := toxitest.Start(t)
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	journal := filepath.Join(t.TempDir(), "in-doubt.log")
	h := startRelay(t, nil, toxiRelayArgs(journal, 5*time.Second, 32, "CORE="+core.URL, "CLAIM="+claim.URL)...)
	p := srv.Proxy(t, "hub", h.Addr())
	p.AddToxic("slices", "slicer", toxitest.Upstream, toxitest.Attributes{"average_size": 3, "size_variation": 2, "delay": 200})
	ledger := newToxiLedger(journal, map[string]*proctest.Fixture{"CORE": core, "CLAIM": claim})

	// when several clients send batches through it, each with a line
	// ended by "\r\n", a blank line and a malformed line among them,
	var (
		wg      sync.WaitGroup
		batches [clients][]toxiLine
		got     [clients][]hubtest.Response
		errs    [clients]error
	)
	for i := range clients {
		lines := toxiBatch(fmt.Sprintf("S%d", i), 30)
		crlf := newToxiLine(fmt.Sprintf("S%d-crlf", i), "CORE", "BAL A0001")
		crlf.text += "\r"
		lines = append(lines[:10], append([]toxiLine{crlf, {text: ""}, {txid: fmt.Sprintf("S%d-bad", i), text: fmt.Sprintf("S%d-bad|CORE", i)}}, lines[10:]...)...)
		batches[i] = lines
		c := hubtest.Dial(t, p.Listen)
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = sendToxiBatch(c, lines, 8)
		}()
	}
	wg.Wait()

	// then every line was answered once, as if it had come whole;
	for i := range clients {
		require.NoError(t, errs[i], "client %d", i)
		ledger.add(t, batches[i], got[i])
		for _, a := range got[i] {
			switch {
			case strings.HasSuffix(a.TxID, "-bad"):
				assert.Equal(t, "E900|malformed line: want TXID|TARGET|PAYLOAD", a.Code+"|"+a.Message)
			case ledger.sent[a.TxID].target == "CLAIM":
				assert.Regexp(t, healthyCLAIM, a.Code+"|"+a.Message, a.TxID)
			default:
				assert.Regexp(t, healthyCORE, a.Code+"|"+a.Message, a.TxID)
			}
		}
	}

	// nothing is in doubt, nothing reached a target twice, no breaker
	// moved.
	ledger.check(t, true, true)
	checkBreakerLog(t, h.logPath)
	entries, _, err := breakerlog.ReadFile(h.logPath)
	require.NoError(t, err)
	assert.Empty(t, entries)
}

func TestToxiClientLinkResetMidStream(t *testing.T) {
	const (
		resetClients, directClients = 4, 2
		lines, window, whole        = 40, 4, 15
	)
	// Given toxiproxy between some clients and the relay that resets each
	// connection in its 16th line, inside the amount ("DEP A0015 1" of
	// "DEP A0015 10": a cut after limit_data's bytes, made a reset by
	// ResetOnClose), and other clients reaching the relay directly,
	srv := toxitest.Start(t)
	core := proctest.StartFixture(t, "CORE", "core")
	journal := filepath.Join(t.TempDir(), "in-doubt.log")
	h := startRelay(t, nil, toxiRelayArgs(journal, 5*time.Second, (resetClients+directClients)*window, "CORE="+core.URL)...)
	p := srv.Proxy(t, "hub", h.Addr())
	// Lines of one length, so that the cut falls at the same place on
	// every connection.
	batch := func(prefix string) []toxiLine {
		out := make([]toxiLine, lines)
		for i := range out {
			out[i] = newToxiLine(fmt.Sprintf("%s-%04d", prefix, i), "CORE", fmt.Sprintf("DEP A%04d 10", i))
		}
		return out
	}
	lineLen := len(batch("X0")[0].text) + 1
	p.ResetOnClose()
	p.AddToxic("cut", "limit_data", toxitest.Upstream, toxitest.Attributes{"bytes": whole*lineLen + lineLen - 2})
	ledger := newToxiLedger(journal, map[string]*proctest.Fixture{"CORE": core})

	// when they all send their lines at once,
	type result struct {
		lines   []toxiLine
		answers []hubtest.Response
		err     error
	}
	var (
		wg      sync.WaitGroup
		results [resetClients + directClients]result
	)
	for i := range results {
		addr, prefix := p.Listen, fmt.Sprintf("X%d", i)
		if i >= resetClients {
			addr, prefix = h.Addr(), fmt.Sprintf("D%d", i)
		}
		results[i].lines = batch(prefix)
		c := hubtest.Dial(t, addr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i].answers, results[i].err = sendToxiBatch(c, results[i].lines, window)
		}()
	}
	wg.Wait()

	// then each reset client lost its connection, having read only
	// answers to its own whole lines, no more than once each, and at
	// least those of the lines it had to wait for before it could write
	// the cut one;
	for i := range resetClients {
		r := results[i]
		require.Error(t, r.err, "client %d read every answer through a reset connection", i)
		// A plain end when the client's own write took the reset first.
		assert.True(t, errors.Is(r.err, syscall.ECONNRESET) || errors.Is(r.err, io.EOF), "client %d: %v", i, r.err)
		ledger.add(t, r.lines, r.answers)
		for _, a := range r.answers {
			assert.Equal(t, "0000", a.Code, "%s", a)
			assert.Less(t, lineIndex(r.lines, a.TxID), whole, "%s answers a line the relay never got whole", a)
		}
		assert.GreaterOrEqual(t, len(r.answers), whole+1-window, "client %d", i)
		assert.LessOrEqual(t, len(r.answers), whole, "client %d", i)
		t.Logf("client %d read %d answers before the reset", i, len(r.answers))
	}
	// the relay kept serving the others, every line answered once;
	for i := resetClients; i < len(results); i++ {
		require.NoError(t, results[i].err, "direct client %d", i)
		ledger.add(t, results[i].lines, results[i].answers)
		for _, a := range results[i].answers {
			assert.Equal(t, "0000", a.Code, "%s", a)
		}
	}
	// no line a reset client did not send whole reached CORE: the cut one
	// is dropped, not served as a last line (what a client gets for a line
	// that reaches CORE, ledger.check holds);
	received := map[string]bool{}
	core.SettledStats(t)
	for _, txid := range core.Received(t) {
		received[txid] = true
	}
	for i := range resetClients {
		for _, ln := range results[i].lines[whole:] {
			assert.False(t, received[ln.txid], "%s reached CORE, though the relay never got it whole", ln.txid)
		}
	}
	// and once the cut is gone, a new client through the proxy is served.
	p.RemoveToxic("cut")
	p.RemoveToxic("reset-on-close")
	ledger.run(t, p.Listen, batch("A"), window)

	ledger.check(t, false, true)
	checkBreakerLog(t, h.logPath)
	_, exited := h.WaitFor(0)
	assert.False(t, exited, "the relay is still running")
}

// lineIndex returns the index of the line with txid in lines, or -1.
func lineIndex(lines []toxiLine, txid string) int {
	for i, l := range lines {
		if l.txid == txid {
			return i
		}
	}
	return -1
}
