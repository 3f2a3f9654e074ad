package main_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/fixtures"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// These tests play hostile clients against the real relay binary (docs/PROTOCOL.md,
// "Client protocol" and "Configuration"): over-long lines, garbage, half-open and slow connections, floods and
// clients that never read. Throughout, the relay must keep serving a
// well-behaved client, and once the hostile clients are gone it must hold
// no more file descriptors or goroutines than when it was idle.

// adminHub is a relay with its admin server on an ephemeral loopback
// port. Its methods may be called from any goroutine, except those taking a
// *testing.T, which belong on that test's goroutine.
type adminHub struct {
	*hub
	adminURL string // empty when the relay logged no admin address
}

// startRelayWithAdmin starts the relay as startRelay does, with its admin
// server on port 0, and finds the admin address in the "admin_addr" field
// of the relay's start-up log line. The later --admin-listen overrides the
// empty one startRelay passes.
func startRelayWithAdmin(t *testing.T, args ...string) *adminHub {
	t.Helper()
	h := &adminHub{hub: startRelay(t, nil, append([]string{"--admin-listen", "127.0.0.1:0"}, args...)...)}
	// Start returns once the line with "addr" is logged; the admin address
	// is on that line.
	for _, l := range h.LogLines() {
		if a, ok := l["admin_addr"].(string); ok && a != "" {
			h.adminURL = "http://" + a
			break
		}
	}
	return h
}

// statusClient reads the admin server's /status. It keeps no connection
// alive, so a reading leaves no connection (and no goroutine serving it)
// behind in the relay.
var statusClient = &http.Client{
	Timeout:   5 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

// goroutinesField finds the goroutine count anywhere in the /status JSON.
var goroutinesField = regexp.MustCompile(`"goroutines"\s*:\s*(\d+)`)

// goroutines returns the relay's goroutine count from GET /status
// (docs/PROTOCOL.md, "Admin HTTP"). It returns an error when the relay
// logged no admin address, or /status does not answer 200 with a
// "goroutines" count.
func (h *adminHub) goroutines() (int, error) {
	if h.adminURL == "" {
		return 0, errors.New("the relay logged no admin_addr")
	}
	resp, err := statusClient.Get(h.adminURL + "/status")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /status: HTTP %d: %s", resp.StatusCode, body)
	}
	m := goroutinesField.FindSubmatch(body)
	if m == nil {
		return 0, fmt.Errorf("GET /status: no goroutines field in %s", body)
	}
	return strconv.Atoi(string(m[1]))
}

// goroutineBaseline returns the idle relay's goroutine count. A relay that
// does not report it on /status fails the test: the leak check needs it,
// and a check that cannot run must not pass.
func (h *adminHub) goroutineBaseline(t *testing.T) int {
	t.Helper()
	n, err := h.goroutines()
	require.NoError(t, err, "the relay's goroutine count (docs/PROTOCOL.md, Admin HTTP, /status; the leak check needs it)")
	return n
}

// goroutineSlack allows for the admin server's own connection handling
// around a /status reading.
const goroutineSlack = 3

// checkGoroutinesBack is a subtest: the relay's goroutine count returns to
// within goroutineSlack of the idle baseline.
func (h *adminHub) checkGoroutinesBack(t *testing.T, baseline int) {
	t.Helper()
	t.Run("goroutines back to the idle baseline", func(t *testing.T) {
		var last int
		proctest.Eventually(t, 5*time.Second, fmt.Sprintf("goroutines at most %d+%d", baseline, goroutineSlack), func() bool {
			n, err := h.goroutines()
			require.NoError(t, err, "the relay's goroutine count")
			last = n
			return n <= baseline+goroutineSlack
		})
		t.Logf("goroutines: idle %d, after %d", baseline, last)
	})
}

// healthyClient is a well-behaved connection that must be served
// throughout, whatever other clients do. It belongs to one test goroutine.
type healthyClient struct {
	c *hubtest.Client
	n int
}

// check sends one CLAIM transaction and requires its answer, 0000, as the
// next line.
func (hc *healthyClient) check(t *testing.T) {
	t.Helper()
	hc.n++
	txid := fmt.Sprintf("healthy-%d", hc.n)
	a := hc.c.Exchange(txid + "|CLAIM|SUBMIT POL7 100")
	require.Equal(t, txid, a.TxID, "the healthy client got an answer that is not its own: %s", a)
	require.Equal(t, "0000", a.Code, a.String())
}

// recorder is an httptest target that answers every call 0000 and keeps
// each body by X-Tx-Id, to check what the hub forwarded. It is safe for
// concurrent use.
type recorder struct {
	*httptest.Server
	mu     sync.Mutex
	bodies map[string][]byte // guarded by mu
}

// newRecorder starts a recorder, closed when the test ends.
func newRecorder(t *testing.T) *recorder {
	rec := &recorder{bodies: map[string][]byte{}}
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.bodies[r.Header.Get("X-Tx-Id")] = body
		rec.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"code": "0000", "message": fmt.Sprintf("got %d bytes", len(body))})
	}))
	t.Cleanup(rec.Close)
	return rec
}

// body returns what the target got for txid.
func (rec *recorder) body(txid string) ([]byte, bool) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	b, ok := rec.bodies[txid]
	return b, ok
}

// validTxID is the TXID alphabet of docs/PROTOCOL.md, "Client protocol".
var validTxID = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

// nonBlankLines returns the lines of b the relay must answer: those left
// non-empty once the "\n" and a "\r" before it are dropped.
func nonBlankLines(b []byte) [][]byte {
	var lines [][]byte
	for _, l := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
		if l = bytes.TrimSuffix(l, []byte("\r")); len(l) > 0 {
			lines = append(lines, l)
		}
	}
	return lines
}

// readableTxID is the TXID the answer to a line refused without a call
// must carry (docs/PROTOCOL.md, "Client protocol"): the bytes before the
// line's first '|' when they are a valid TXID, else "-".
func readableTxID(line []byte) string {
	before, _, found := bytes.Cut(line, []byte("|"))
	if !found || !validTxID.Match(before) {
		return "-"
	}
	return string(before)
}

// isTimeout reports whether err is a deadline that passed.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestHostileClientsDoNotHurtTheHub(t *testing.T) {
	const (
		maxInflight  = 10
		writeTimeout = 500 * time.Millisecond
	)
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	echo := newRecorder(t)
	h := startRelay(t, nil,
		"--target", "CORE="+core.URL, "--target", "CLAIM="+claim.URL, "--target", "ECHO="+echo.URL,
		"--max-inflight", strconv.Itoa(maxInflight), "--write-timeout", writeTimeout.String(),
		"--target-timeout", "5s")
	healthy := &healthyClient{c: hubtest.Dial(t, h.Addr())}
	healthy.check(t)

	// A line of 100 KB, far over the default --max-line-bytes of 16384.
	bigLine := func(txid string) []byte {
		return []byte(txid + "|ECHO|" + strings.Repeat("z", 100<<10))
	}

	t.Run("100 KB line without newline, then close", func(t *testing.T) {
		c := hubtest.Dial(t, h.Addr())
		_, err := c.Write(bigLine("big-1"))
		require.NoError(t, err)
		c.Close()
		healthy.check(t)
	})

	t.Run("100 KB line without newline, then end of input", func(t *testing.T) {
		// The unterminated last line is still a line: it is answered E900,
		// then the hub closes.
		c := hubtest.Dial(t, h.Addr())
		_, err := c.Write(bigLine("big-2"))
		require.NoError(t, err)
		c.CloseWrite()
		a := c.ReadResponse()
		assert.Equal(t, "big-2", a.TxID, "the TXID is in the part of the line the hub reads: %s", a)
		assert.Equal(t, "E900", a.Code, a.String())
		assert.Equal(t, "line too long", a.Message)
		assert.Equal(t, "", c.ExpectClosed(), "one answer for one line")
		healthy.check(t)
	})

	t.Run("100 KB line, then a newline and a good line", func(t *testing.T) {
		c := hubtest.Dial(t, h.Addr())
		_, err := c.Write(append(bigLine("big-3"), "\nafter-big|CLAIM|STATUS C-1\n"...))
		require.NoError(t, err)
		first := c.ReadResponse()
		assert.Equal(t, "big-3", first.TxID, "the TXID is in the part of the line the hub reads: %s", first)
		assert.Equal(t, "E900", first.Code, first.String())
		assert.Equal(t, "line too long", first.Message)
		second := c.ReadResponse()
		assert.Equal(t, "after-big", second.TxID, "the rest of the long line was read as a line: %s", second)
		assert.Equal(t, "B212", second.Code, second.String())
		for _, txid := range []string{"big-1", "big-2", "big-3"} {
			_, called := echo.body(txid)
			assert.False(t, called, "the over-long line %s reached the target", txid)
		}
		healthy.check(t)
	})

	t.Run("100 KB lines whose TXID cannot be read are answered with -", func(t *testing.T) {
		c := hubtest.Dial(t, h.Addr())
		for _, line := range [][]byte{
			bigLine("big 4"),                     // a space is outside the TXID alphabet
			bigLine(strings.Repeat("t", 65)),     // one character too long
			[]byte(strings.Repeat("z", 100<<10)), // no '|' at all
		} {
			_, err := c.Write(append(line, '\n'))
			require.NoError(t, err)
			a := c.ReadResponse()
			assert.Equal(t, "-", a.TxID, "line starting %q: %s", line[:8], a)
			assert.Equal(t, "E900", a.Code, a.String())
			assert.Equal(t, "line too long", a.Message)
		}
		a := c.Exchange("after-big-bad|CLAIM|STATUS C-1")
		assert.Equal(t, "after-big-bad", a.TxID, "the rest of a long line was read as a line: %s", a)
		healthy.check(t)
	})

	t.Run("binary garbage with NUL bytes", func(t *testing.T) {
		// Given 32 KiB of seeded random bytes, every seventh a NUL, cut
		// into lines at their newlines, every third line after a valid
		// TXID and a '|',
		rng := rand.New(rand.NewPCG(7, 11))
		random := make([]byte, 32<<10)
		for i := range random {
			random[i] = byte(rng.UintN(256))
			if i%7 == 0 {
				random[i] = 0
			}
		}
		var garbage []byte
		for i, l := range bytes.Split(random, []byte("\n")) {
			if i%3 == 0 {
				garbage = fmt.Appendf(garbage, "g-%d|", i)
			}
			garbage = append(append(garbage, l...), '\n')
		}
		var wantTxIDs []string
		readable := 0
		for _, l := range nonBlankLines(garbage) {
			txid := readableTxID(l)
			wantTxIDs = append(wantTxIDs, txid)
			if txid != "-" {
				readable++
			}
		}
		require.NotEmpty(t, wantTxIDs)
		require.Positive(t, readable, "the garbage has lines with a readable TXID")

		// when they arrive as lines, followed by a good line,
		c := hubtest.Dial(t, h.Addr())
		_, err := c.Write(garbage)
		require.NoError(t, err)

		// then each non-blank line gets exactly one well-formed answer
		// refusing it, with the line's TXID where one can be read and "-"
		// only where none can, and the good line is answered next.
		var gotTxIDs []string
		for _, a := range c.ReadResponses(len(wantTxIDs)) {
			assert.Contains(t, []string{"E900", "E903"}, a.Code, a.String())
			gotTxIDs = append(gotTxIDs, a.TxID)
		}
		assert.ElementsMatch(t, wantTxIDs, gotTxIDs, "the answers' TXIDs, one per line")
		t.Logf("%d garbage lines, %d with a readable TXID", len(wantTxIDs), readable)
		a := c.Exchange("after-garbage|CLAIM|STATUS C-1")
		assert.Equal(t, "after-garbage", a.TxID, "a garbage line got more than one answer: %s", a)
		assert.Equal(t, "B212", a.Code, a.String())
		healthy.check(t)
	})

	t.Run("invalid UTF-8 in TXID, target and payload", func(t *testing.T) {
		c := hubtest.Dial(t, h.Addr())
		for _, tt := range []struct {
			line, txid, code string
		}{
			{line: "\xff\xfe|CORE|BAL 1", txid: "-", code: "E900"},
			{line: "tx\xc3\x28|CORE|BAL 1", txid: "-", code: "E900"},
			{line: "tx\x00nul|CORE|BAL 1", txid: "-", code: "E900"},
			{line: "utf8-target|C\xc3\x28RE|BAL 1", txid: "utf8-target", code: "E903"},
			{line: "utf8-payload|ECHO|caf\xc3\x28 \xff\xfe\x00 end", txid: "utf8-payload", code: "0000"},
		} {
			a := c.Exchange(tt.line)
			assert.Equal(t, tt.txid, a.TxID, "line %q: %s", tt.line, a)
			assert.Equal(t, tt.code, a.Code, "line %q: %s", tt.line, a)
		}
		body, ok := echo.body("utf8-payload")
		if assert.True(t, ok, "ECHO got no call") {
			assert.Equal(t, []byte("caf\xc3\x28 \xff\xfe\x00 end"), body, "the payload must be forwarded byte for byte")
		}
		healthy.check(t)
	})

	t.Run("10000 pipelined lines, then close without reading", func(t *testing.T) {
		// Given a slow CORE, so calls are in flight when the client goes,
		core.Ctl(t, `{"mode":"slow","delay_ms":500,"reset":true}`)
		var b bytes.Buffer
		for i := range 10000 {
			fmt.Fprintf(&b, "flood-%05d|CORE|BAL f%d\n", i, i%50)
		}

		// when a client writes 10000 lines and closes without reading a
		// single answer (the hub may give up on it first: then the write
		// fails with a reset, never a timeout),
		c := hubtest.Dial(t, h.Addr())
		_, err := c.Write(b.Bytes())
		assert.False(t, isTimeout(err), "writing the lines timed out: %v", err)
		proctest.Eventually(t, 5*time.Second, "the bulkhead's worth of calls is in flight at CORE", func() bool {
			st, err := core.StatsErr()
			return err == nil && st.InFlight == maxInflight
		})
		c.Close()

		// then the calls it started still run to their end at CORE: none
		// is cancelled because its client left, none is sent twice, the
		// bulkhead still holds,
		st := core.SettledStats(t)
		assert.GreaterOrEqual(t, st.Calls, int64(maxInflight), "the first lines were admitted")
		assert.LessOrEqual(t, st.Calls, int64(10000))
		assert.Equal(t, st.Calls, st.Codes["0000"], "every call reached its answer at CORE: %v", st.Codes)
		assert.Zero(t, st.Codes[fixtures.StatCanceled], "a call was cancelled because its client went away")
		assert.LessOrEqual(t, st.MaxInFlight, int64(maxInflight))

		// and every bulkhead slot came back: CORE is served again at once.
		core.Ctl(t, `{"mode":"normal"}`)
		healthy.check(t)
		a := healthy.c.Exchange("after-flood|CORE|BAL f1")
		assert.Equal(t, "0000", a.Code, a.String())
	})

	t.Run("half-open: every answer arrives after the client stops writing", func(t *testing.T) {
		// Given a client that sends its lines and then shuts down its
		// writing side,
		want := map[string]string{}
		var lines []string
		for i := range 40 {
			txid := fmt.Sprintf("ho-%02d", i)
			switch i % 5 {
			case 0:
				lines, want[txid] = append(lines, txid+"|CORE|BAL h"+strconv.Itoa(i)), "0000"
			case 1:
				lines, want[txid] = append(lines, txid+"|claim|SUBMIT POL"+strconv.Itoa(i)+" 100"), "0000"
			case 2:
				lines, want[txid] = append(lines, txid+"|ECHO|half open"), "0000"
			case 3:
				lines, want[txid] = append(lines, txid+"|NOPE|x"), "E903"
			case 4:
				lines, want[txid] = append(lines, txid+"|CORE"), "E900"
			}
		}
		c := hubtest.Dial(t, h.Addr())
		c.Send(lines...)
		c.CloseWrite()

		// then all its answers still arrive, each once, and only then does
		// the hub close the connection.
		got := c.ReadByTxID(len(lines))
		for txid, code := range want {
			if assert.Contains(t, got, txid) {
				assert.Equal(t, code, got[txid].Code, got[txid].String())
			}
		}
		assert.Equal(t, "", c.ExpectClosed(), "nothing after the last answer")
		healthy.check(t)
	})

	t.Run("a client that never reads is disconnected after --write-timeout", func(t *testing.T) {
		// Given a client that sends line after line and never reads: each
		// two-byte line "!" earns a long E900 answer, so the answers fill
		// the socket buffers quickly,
		c := hubtest.Dial(t, h.Addr())
		chunk := bytes.Repeat([]byte("!\n"), 16<<10)
		start := time.Now()
		var err error
		for sent := 0; err == nil && time.Since(start) < 15*time.Second; sent += len(chunk) {
			_, err = c.Write(chunk)
		}

		// then the hub disconnects it: the client's write fails with a
		// reset, not with its own timeout.
		require.Error(t, err, "the hub never disconnected a client that does not read")
		assert.False(t, isTimeout(err),
			"the client's write timed out: the hub neither read its lines nor disconnected it: %v", err)
		t.Logf("disconnected after %v: %v", time.Since(start).Round(time.Millisecond), err)
		healthy.check(t)
	})
}

func TestSlowClientsAreCutOffByIdleTimeout(t *testing.T) {
	const (
		idleTimeout = time.Second
		drip        = 200 * time.Millisecond
	)
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	core := proctest.StartFixture(t, "CORE", "core")
	h := startRelay(t, nil, "--target", "CLAIM="+claim.URL, "--target", "CORE="+core.URL,
		"--idle-timeout", idleTimeout.String(), "--target-timeout", "5s")

	// Given a slowloris client that sends one byte every 200 ms and never a
	// whole line, a client that sends nothing at all, a client that sends
	// one transaction to a target slower than the idle timeout and then
	// waits, and a healthy client that sends a transaction at the same pace
	// as the slowloris,
	core.Ctl(t, `{"mode":"slow","delay_ms":1500}`)
	dialled := time.Now()
	slow := hubtest.Dial(t, h.Addr())
	silent := hubtest.Dial(t, h.Addr())
	waiting := hubtest.Dial(t, h.Addr())
	waiting.Send("wait-1|CORE|BAL w")
	healthy := &healthyClient{c: hubtest.Dial(t, h.Addr())}
	type closed struct {
		read string
		err  error
		at   time.Time
	}
	watch := func(c *hubtest.Client) <-chan closed {
		ch := make(chan closed, 1)
		go func() {
			line, err := c.ReadLine(idleTimeout + 5*time.Second)
			ch <- closed{read: line, err: err, at: time.Now()}
		}()
		return ch
	}
	slowClosed, silentClosed := watch(slow), watch(silent)

	// when the idle timeout passes,
	var slowEnd, silentEnd *closed
	tick := time.NewTicker(drip)
	defer tick.Stop()
	attack := []byte("slowloris|CLAIM|STATUS C-1 ")
	for i := 0; slowEnd == nil || silentEnd == nil; i++ {
		require.Less(t, time.Since(dialled), idleTimeout+5*time.Second, "a slow client is still connected")
		select {
		case c := <-slowClosed:
			slowEnd = &c
		case c := <-silentClosed:
			silentEnd = &c
		case <-tick.C:
			if slowEnd == nil {
				// The write may fail once the hub has closed; the read
				// above reports that.
				_, _ = slow.Write(attack[i%len(attack) : i%len(attack)+1])
			}
			healthy.check(t)
		}
	}

	// then the hub closes both slow connections without an answer, about
	// one idle timeout after they connected, while the healthy client,
	// connected all along, is still served.
	for name, end := range map[string]*closed{"slowloris": slowEnd, "silent": silentEnd} {
		took := end.at.Sub(dialled)
		assert.Equal(t, "", end.read, "%s: a partial line was answered", name)
		assert.False(t, isTimeout(end.err), "%s: still open: %v", name, end.err)
		assert.GreaterOrEqual(t, took, idleTimeout-50*time.Millisecond, "%s: closed before the idle timeout", name)
		assert.Less(t, took, idleTimeout+time.Second, "%s: closed too long after the idle timeout", name)
		t.Logf("%s closed after %v (%v)", name, took.Round(time.Millisecond), end.err)
	}
	assert.GreaterOrEqual(t, healthy.n, int(idleTimeout/drip)-2, "the healthy client was served all along")
	healthy.check(t)

	// The idle timeout does not cut off an answer in flight: the waiting
	// client gets its answer, and only then is it closed.
	a := waiting.ReadResponse()
	assert.Equal(t, "wait-1", a.TxID, a.String())
	assert.Equal(t, "0000", a.Code, a.String())
	assert.Equal(t, "", waiting.ExpectClosed())
}

func TestConnectionFloodBeyondMaxConns(t *testing.T) {
	const maxConns = 10
	core := proctest.StartFixture(t, "CORE", "core")
	h := startRelay(t, nil, "--target", "CORE="+core.URL, "--max-conns", strconv.Itoa(maxConns))

	// Given maxConns connections the hub serves,
	served := make([]*hubtest.Client, maxConns)
	for i := range served {
		served[i] = hubtest.Dial(t, h.Addr())
		a := served[i].Exchange(fmt.Sprintf("served-%d|CORE|BAL s%d", i, i))
		require.Equal(t, "0000", a.Code, a.String())
	}

	// when as many again arrive at once,
	extra := make([]*hubtest.Client, maxConns)
	for i := range extra {
		extra[i] = hubtest.Dial(t, h.Addr())
	}

	// then each extra gets exactly one E906 line and is closed,
	for i, c := range extra {
		assert.Equal(t, "-|E906|too many connections\n", c.ExpectClosed(), "extra connection %d", i)
	}

	// and every connection served before is still served.
	for i, c := range served {
		a := c.Exchange(fmt.Sprintf("again-%d|CORE|BAL s%d", i, i))
		assert.Equal(t, "0000", a.Code, a.String())
	}
}

func TestNoLeaksAfterHostileClients(t *testing.T) {
	// CORE runs in this process so that its connections from the relay can
	// be closed at the end; a pooled keep-alive connection is not a leak.
	coreSrv, err := fixtures.New(fixtures.Config{Name: "CORE", Kind: fixtures.KindCore})
	require.NoError(t, err)
	core := httptest.NewServer(coreSrv)
	t.Cleanup(core.Close)
	hang := newRawTarget(t, neverAnswer)
	// HANG's timed-out connections are read on for a late answer for a
	// second, then released like the others.
	conf := filepath.Join(t.TempDir(), "relay.toml")
	require.NoError(t, os.WriteFile(conf, []byte("[HANG]\nlate_answer_grace = \"1s\"\n"), 0o600))
	h := startRelayWithAdmin(t, "--config", conf,
		"--target", "CORE="+core.URL, "--target", "HANG="+hang.URL(),
		"--target-timeout", "300ms", "--fail-threshold", "1000", "--write-timeout", "500ms")

	// Given the idle relay's open file descriptors and goroutines,
	fdBaseline, err := h.OpenFDs()
	require.NoError(t, err)
	gBaseline := h.goroutineBaseline(t)
	t.Logf("idle: %d file descriptors, %d goroutines", fdBaseline, gBaseline)

	// when 40 clients come and go, well-behaved and hostile, with calls
	// that succeed and calls that time out,
	const perKind = 5
	var (
		clients []*hubtest.Client
		readers []func() // run once every client has sent, so the timeouts overlap
	)
	dial := func() *hubtest.Client {
		c := hubtest.Dial(t, h.Addr())
		clients = append(clients, c)
		return c
	}
	for i := range perKind {
		// Well-behaved, pipelined, one call timing out.
		ok := dial()
		ok.Send(fmt.Sprintf("ok-%d-a|CORE|BAL a", i), fmt.Sprintf("ok-%d-b|CORE|DEP a 5", i),
			fmt.Sprintf("ok-%d-c|HANG|x", i), fmt.Sprintf("ok-%d-d|NOPE|x", i))
		readers = append(readers, func() {
			for _, a := range ok.ReadResponses(4) {
				assert.Regexp(t, `^(0000|E901|E903|E904|E905)$`, a.Code, a.String())
			}
		})
		// Over-long line, then gone.
		c := dial()
		_, _ = c.Write([]byte(fmt.Sprintf("long-%d|CORE|%s", i, strings.Repeat("q", 40<<10))))
		c.Close()
		// Garbage, then gone.
		c = dial()
		_, _ = c.Write([]byte("\x00\xff\x00|\x01\n\x00\x00\n|||\n"))
		c.Close()
		// Half-open, reading every answer to the end.
		half := dial()
		half.Send(fmt.Sprintf("ho-%d|CORE|BAL b", i), fmt.Sprintf("ho-%d-hang|HANG|y", i))
		half.CloseWrite()
		readers = append(readers, func() {
			half.ReadResponses(2)
			assert.Equal(t, "", half.ExpectClosed())
		})
		// Reset in the middle of a line.
		c = dial()
		_, _ = c.Write([]byte(fmt.Sprintf("rst-%d|CORE|BAL", i)))
		require.NoError(t, c.Conn().(*net.TCPConn).SetLinger(0))
		c.Close()
		// Calls in flight, then gone without reading.
		c = dial()
		c.Send(fmt.Sprintf("gone-%d-a|HANG|z", i), fmt.Sprintf("gone-%d-b|CORE|BAL c", i))
		c.Close()
		// Idle, kept open until the end, and idle, closed at once.
		dial()
		dial().Close()
	}
	for _, read := range readers {
		read()
	}
	for _, c := range clients {
		c.Close()
	}
	// The targets drop their side of the relay's pooled connections.
	core.CloseClientConnections()

	// then, once they are all gone, the relay holds no more descriptors
	// than it did idle (a pooled connection closed by its target is
	// released at the latest when its 4 s idle timeout runs out),
	var last int
	proctest.Eventually(t, 15*time.Second, fmt.Sprintf("open file descriptors back to %d", fdBaseline), func() bool {
		n, err := h.OpenFDs()
		last = n
		return err == nil && n <= fdBaseline
	})
	t.Logf("file descriptors: idle %d, after %d; HANG got %d requests", fdBaseline, last, hang.Requests())

	// and no more goroutines.
	h.checkGoroutinesBack(t, gBaseline)

	// It still serves.
	c := hubtest.Dial(t, h.Addr())
	a := c.Exchange("after-leaks|CORE|BAL a")
	assert.Equal(t, "0000", a.Code, a.String())
}
