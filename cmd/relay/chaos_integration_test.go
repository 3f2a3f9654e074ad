package main_test

import (
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// These tests hold the real relay binary to its promises while its targets
// misbehave at random and while it dies without warning: every transaction
// answered exactly once with a code the spec allows (docs/PROTOCOL.md, "Client protocol", "Response codes"), the
// bulkhead never exceeded ("Bulkhead"), one target's trouble never reaching
// another, and every breaker change on disk as it happened ("Breaker log").

// chaosCodes are the codes a transaction can get while its target is
// failing, stalling, dropping connections and recovering.
var chaosCodes = regexp.MustCompile(`^(0000|B\d{3}|E400|E500|E901|E902|E904|E905)$`)

// healthyCodes are the codes of a target that works: it answered.
var healthyCodes = regexp.MustCompile(`^(0000|B\d{3})$`)

// chaosAnswer is one answer a chaos client got, with the target its
// request named. It is a plain value.
type chaosAnswer struct {
	target string
	hubtest.Response
}

// chaosClient drives one connection: it keeps up to window transactions
// outstanding and matches every answer to a request it sent and has not
// seen answered yet. Its run method is called once, from one goroutine.
type chaosClient struct {
	c      *hubtest.Client
	id     int
	n      int           // transactions to send
	window int           // transactions outstanding at most
	claim  chan struct{} // shared by all clients: CLAIM calls outstanding
	abort  <-chan struct{}
	// pace[k] is closed when the chaos driver enters its k-th step. The
	// client's transactions are spread over the steps, so the load lasts
	// the driver's whole cycle however fast the machine is.
	pace []chan struct{}
}

// chaosTx returns the target and payload of transaction i of client id: a
// third CLAIM, the rest every CORE operation.
func chaosTx(id, i int) (target, payload string) {
	acct := fmt.Sprintf("A%d", (id*7+i)%40)
	switch i % 6 {
	case 0:
		return "CLAIM", fmt.Sprintf("SUBMIT POL%d %d", id, 100+i)
	case 3:
		return "CLAIM", fmt.Sprintf("STATUS C-%d", i)
	case 1:
		return "CORE", "BAL " + acct
	case 2:
		return "CORE", "DEP " + acct + " 10"
	case 4:
		return "CORE", "WD " + acct + " 7"
	default:
		return "CORE", fmt.Sprintf("XFER %s A%d 1", acct, (id+i)%40)
	}
}

// run sends the client's transactions and returns every answer, or the
// first thing that broke the protocol: an unknown or repeated TXID, a line
// that is not a response, a missing answer.
func (cc *chaosClient) run() ([]chaosAnswer, error) {
	var (
		mu      sync.Mutex
		pending = map[string]string{} // guarded by mu: TXID -> target
		slots   = make(chan struct{}, cc.window)
		stop    = make(chan struct{})
		written = make(chan error, 1)
	)
	acquire := func(ch chan struct{}) bool {
		select {
		case ch <- struct{}{}:
			return true
		case <-stop:
			return false
		case <-cc.abort:
			return false
		}
	}
	wait := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		case <-stop:
			return false
		case <-cc.abort:
			return false
		}
	}
	go func() {
		for i := range cc.n {
			txid := fmt.Sprintf("c%02d-%04d", cc.id, i)
			target, payload := chaosTx(cc.id, i)
			if !wait(cc.pace[i*len(cc.pace)/cc.n]) || !acquire(slots) || (target == "CLAIM" && !acquire(cc.claim)) {
				written <- nil
				return
			}
			mu.Lock()
			pending[txid] = target
			mu.Unlock()
			if _, err := cc.c.Write([]byte(txid + "|" + target + "|" + payload + "\n")); err != nil {
				written <- fmt.Errorf("write %s: %w", txid, err)
				return
			}
		}
		written <- nil
	}()

	answers := make([]chaosAnswer, 0, cc.n)
	err := func() error {
		for len(answers) < cc.n {
			line, err := cc.c.ReadLine(hubtest.ClientTimeout)
			if err != nil {
				return fmt.Errorf("read after %d answers: %w (partial %q)", len(answers), err, line)
			}
			a, err := hubtest.ParseResponse(line)
			if err != nil {
				return err
			}
			mu.Lock()
			target, ok := pending[a.TxID]
			delete(pending, a.TxID)
			mu.Unlock()
			if !ok {
				return fmt.Errorf("answer %q is for no request outstanding: unknown or repeated TXID", a)
			}
			answers = append(answers, chaosAnswer{target: target, Response: a})
			if target == "CLAIM" {
				<-cc.claim
			}
			<-slots
		}
		// An answer past the last is caught here: the next line must be
		// the answer to this one.
		fin := fmt.Sprintf("fin-%02d", cc.id)
		if _, err := cc.c.Write([]byte(fin + "|NOPE|x\n")); err != nil {
			return err
		}
		line, err := cc.c.ReadLine(hubtest.ClientTimeout)
		if err != nil {
			return fmt.Errorf("read the last answer: %w", err)
		}
		if a, err := hubtest.ParseResponse(line); err != nil || a.TxID != fin || a.Code != "E903" {
			return fmt.Errorf("want %s|E903 after the last answer, got %q", fin, line)
		}
		return nil
	}()
	close(stop)
	if werr := <-written; err == nil {
		err = werr
	}
	if err != nil {
		return answers, fmt.Errorf("client %d: %w", cc.id, err)
	}
	return answers, nil
}

// chaosTargetTimeout is the relay's --target-timeout in the chaos test. It
// applies to CLAIM too, which must never time out: on a loaded two-core
// machine running race-enabled binaries, a healthy call can take well over
// 100 ms, so it leaves a wide margin.
const chaosTargetTimeout = 300 * time.Millisecond

// chaosStep is one state of the chaos driver: a fixture control body and
// how long CORE stays in it. It is a plain value.
type chaosStep struct {
	ctl   string
	dwell time.Duration
}

// chaosSteps are the states the chaos driver cycles CORE through: failing,
// healthy, slow under and over chaosTargetTimeout, dropping every
// connection, and failing half the time. Each bad spell follows a healthy
// one long enough for the breaker (--reset-timeout 100ms) to probe and
// close, so every kind of failure reaches the target; the spell slower
// than the target timeout comes last, as its calls hold every bulkhead slot
// until they time out.
var chaosSteps = []chaosStep{
	{`{"mode":"normal"}`, 150 * time.Millisecond},
	{`{"mode":"fail"}`, 40 * time.Millisecond},
	{`{"mode":"normal"}`, 150 * time.Millisecond},
	{`{"mode":"drop"}`, 40 * time.Millisecond},
	{`{"mode":"normal"}`, 150 * time.Millisecond},
	{`{"mode":"flaky","fail_ratio":0.5}`, 60 * time.Millisecond},
	{`{"mode":"slow","delay_ms":20}`, 40 * time.Millisecond},
	{`{"mode":"slow","delay_ms":150}`, 60 * time.Millisecond},
	{`{"mode":"normal"}`, 150 * time.Millisecond},
	{`{"mode":"slow","delay_ms":400}`, 40 * time.Millisecond},
}

// flipModes walks f through chaosSteps, round and round, until stop is
// closed, closing pace[i] as it enters step i of the first round. It returns
// how many changes it made.
func flipModes(f *proctest.Fixture, pace []chan struct{}, stop <-chan struct{}) (int, error) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i := 0; ; i++ {
		step := chaosSteps[i%len(chaosSteps)]
		if err := f.CtlErr(step.ctl); err != nil {
			return i, err
		}
		if i < len(pace) {
			close(pace[i])
		}
		timer.Reset(step.dwell)
		select {
		case <-stop:
			return i + 1, nil
		case <-timer.C:
		}
	}
}

func TestChaosEveryTransactionAnsweredOnce(t *testing.T) {
	const (
		clients     = 32
		perClient   = 150
		window      = 4 // transactions outstanding per connection
		maxInflight = 4
	)
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	h := startRelayWithAdmin(t,
		"--target", "CORE="+core.URL, "--target", "CLAIM="+claim.URL,
		"--fail-threshold", "3", "--reset-timeout", "100ms",
		"--max-inflight", strconv.Itoa(maxInflight), "--target-timeout", chaosTargetTimeout.String())
	gBaseline := h.goroutineBaseline(t)
	core.Ctl(t, `{"mode":"normal","reset":true}`)
	claim.Ctl(t, `{"mode":"normal","reset":true}`)
	conns := make([]*hubtest.Client, clients)
	for i := range conns {
		conns[i] = hubtest.Dial(t, h.Addr())
	}

	// Given CORE flipping between failing, healthy, slow, dropping and
	// flaky every few dozen milliseconds,
	stopFlips := make(chan struct{})
	type flipResult struct {
		n   int
		err error
	}
	flipped := make(chan flipResult, 1)
	pace := make([]chan struct{}, len(chaosSteps))
	for i := range pace {
		pace[i] = make(chan struct{})
	}
	go func() {
		n, err := flipModes(core, pace, stopFlips)
		flipped <- flipResult{n, err}
	}()

	// when 32 clients pipeline 4800 mixed CORE and CLAIM transactions,
	// never more CLAIM calls outstanding than CLAIM's bulkhead holds (so a
	// CLAIM E905 could only come from CORE's trouble),
	start := time.Now()
	claimSlots := make(chan struct{}, maxInflight)
	abort := make(chan struct{})
	var abortOnce sync.Once
	answers := make([][]chaosAnswer, clients)
	errs := make([]error, clients)
	var wg sync.WaitGroup
	for i, c := range conns {
		cc := &chaosClient{c: c, id: i, n: perClient, window: window, claim: claimSlots, abort: abort, pace: pace}
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i], errs[i] = cc.run()
			if errs[i] != nil {
				abortOnce.Do(func() { close(abort) })
			}
		}()
	}
	wg.Wait()
	close(stopFlips)
	flips := <-flipped
	require.NoError(t, flips.err)
	core.Ctl(t, `{"mode":"normal"}`)

	// then every transaction got exactly one answer, to a TXID it sent,
	for _, err := range errs {
		require.NoError(t, err)
	}
	codes := map[string]map[string]int{"CORE": {}, "CLAIM": {}}
	total := 0
	for _, as := range answers {
		total += len(as)
		for _, a := range as {
			codes[a.target][a.Code]++
			// with a code the spec allows (never E907),
			assert.Regexp(t, chaosCodes, a.Code, a.String())
			if a.Code == "E904" {
				assert.Regexp(t, openMessage, a.Message)
			}
			// and CORE's chaos never reached CLAIM.
			if a.target == "CLAIM" {
				assert.Regexp(t, healthyCodes, a.Code, "CLAIM hurt by CORE: %s", a)
			}
		}
	}
	require.Equal(t, clients*perClient, total)
	t.Logf("%d transactions in %v with %d mode changes; CORE %v; CLAIM %v",
		total, time.Since(start).Round(time.Millisecond), flips.n, codes["CORE"], codes["CLAIM"])

	// The chaos was real: CORE failed, timed out, was unreachable, and its
	// breaker and bulkhead both refused.
	for _, code := range []string{"E500", "E901", "E902", "E904", "E905"} {
		assert.Positive(t, codes["CORE"][code], "no CORE transaction got %s: the chaos did not happen", code)
	}

	// Neither target ever saw more calls at once than --max-inflight, and
	// no transaction reached a target twice. A call the hub gave up on at
	// --target-timeout (E901) frees its slot at once, while the target may
	// take a moment to notice the closed connection and stop counting it:
	// each such call may overlap one new call, never more.
	coreStats, claimStats := core.SettledStats(t), claim.SettledStats(t)
	abandoned := min(codes["CORE"]["E901"], maxInflight)
	assert.LessOrEqual(t, coreStats.MaxInFlight, int64(maxInflight+abandoned), "CORE bulkhead exceeded")
	assert.LessOrEqual(t, claimStats.MaxInFlight, int64(maxInflight), "CLAIM bulkhead exceeded")
	called := 0
	for code, n := range codes["CORE"] {
		if code != "E904" && code != "E905" {
			called += n
		}
	}
	assert.LessOrEqual(t, coreStats.Calls, int64(called), "CORE got more calls than transactions sent to it")
	assert.Equal(t, int64(codes["CLAIM"]["0000"]+countB(codes["CLAIM"])), claimStats.Calls,
		"every CLAIM transaction reaches CLAIM exactly once")

	// The breaker log parses, each target's lines chain, CORE's breaker
	// moved and CLAIM's never did.
	entries, _, err := breakerlog.ReadFile(h.logPath)
	require.NoError(t, err)
	require.NoError(t, breakerlog.CheckChains(entries))
	perTarget := map[string]int{}
	for _, e := range entries {
		perTarget[e.Name]++
	}
	assert.Positive(t, perTarget["CORE"], "CORE's breaker never changed state")
	assert.Zero(t, perTarget["CLAIM"], "CLAIM's breaker moved")
	t.Logf("breaker log: %d CORE transitions", perTarget["CORE"])

	// Once the clients and the targets' pooled connections are gone, the
	// relay is back to its idle goroutines.
	for _, c := range conns {
		c.Close()
	}
	// Stopping the fixtures closes the relay's keep-alive connections to
	// them, which are not a leak.
	core.Signal(syscall.SIGTERM)
	claim.Signal(syscall.SIGTERM)
	assert.Equal(t, 0, core.Wait())
	assert.Equal(t, 0, claim.Wait())
	h.checkGoroutinesBack(t, gBaseline)
}

// countB returns how many answers in codes are business rejections.
func countB(codes map[string]int) int {
	n := 0
	for code, k := range codes {
		if code[0] == 'B' {
			n += k
		}
	}
	return n
}

func TestBreakerLogSurvivesKill9(t *testing.T) {
	const resetTimeout = 150 * time.Millisecond
	core := proctest.StartFixture(t, "CORE", "core")
	h := startPolicyRelay(t, nil, "--target", "CORE="+core.URL,
		"--fail-threshold", "1", "--reset-timeout", resetTimeout.String())
	c := hubtest.Dial(t, h.Addr())

	// The transitions the test causes, in order.
	var want []string
	n := 0
	exchange := func() hubtest.Response {
		n++
		return c.Exchange(fmt.Sprintf("k9-%d|CORE|BAL k9", n))
	}
	trip := func() {
		t.Helper()
		core.Ctl(t, `{"mode":"fail"}`)
		a := exchange()
		require.Equal(t, "E500", a.Code, a.String())
		want = append(want, "CLOSED->OPEN")
		a = exchange()
		require.Equal(t, "E904", a.Code, a.String())
	}
	probe := func(ctl, code, to string) {
		t.Helper()
		core.Ctl(t, ctl)
		var a hubtest.Response
		proctest.Eventually(t, 5*time.Second, "a probe is admitted after the reset timeout", func() bool {
			a = exchange()
			return a.Code != "E904"
		})
		require.Equal(t, code, a.Code, a.String())
		want = append(want, "OPEN->HALF_OPEN", "HALF_OPEN->"+to)
	}

	// Given a breaker that trips and recovers, trips, fails its probe and
	// then recovers,
	trip()
	probe(`{"mode":"normal"}`, "0000", "CLOSED")
	trip()
	probe(`{"mode":"fail"}`, "E500", "OPEN")
	probe(`{"mode":"normal"}`, "0000", "CLOSED")

	// when the relay is killed with SIGKILL as soon as its breaker log's
	// writer has written the changes (it writes them off the answer's
	// path, within microseconds), with no chance to flush or close
	// anything,
	h.waitBreakerLog(t)
	h.Kill()
	code, exited := h.WaitFor(0)
	require.True(t, exited)
	require.Equal(t, -1, code, "the relay was not killed by the signal")

	// then every transition it made is on disk, in order, and the file
	// parses and chains.
	entries, _, err := breakerlog.ReadFile(h.logPath)
	require.NoError(t, err)
	require.NoError(t, breakerlog.CheckChains(entries))
	var got []string
	for _, e := range entries {
		assert.Equal(t, "CORE", e.Name)
		got = append(got, e.From.String()+"->"+e.To.String())
	}
	assert.Equal(t, want, got)
	require.Len(t, want, 8)
}
