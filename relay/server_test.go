package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/relay/protocol"
)

func TestRelayAnswers(t *testing.T) {
	tests := []struct {
		name   string
		answer func(http.ResponseWriter, *http.Request, []byte)
		line   string
		want   string
	}{
		{name: "success", answer: hubtest.Echo, line: "TX1|CORE|BAL 1", want: "TX1|0000|got BAL 1"},
		{name: "target matched case-insensitively", answer: hubtest.Echo, line: "TX1|cOrE|BAL 1", want: "TX1|0000|got BAL 1"},
		{name: "payload with pipes", answer: hubtest.Echo, line: "TX1|CORE|a|b", want: "TX1|0000|got a|b"},
		{name: "business rejection", answer: hubtest.AnswerCode("B201", "insufficient funds"), line: "TX1|CORE|WD 1 5", want: "TX1|B201|insufficient funds"},
		{name: "http 500", answer: hubtest.AnswerStatus(500), line: "TX1|CORE|x", want: "TX1|E500|target failed: HTTP 500: injected"},
		{name: "http 400", answer: hubtest.AnswerStatus(400), line: "TX1|CORE|x", want: "TX1|E400|target refused the request: HTTP 400: injected"},
		{name: "message with newline cleaned", answer: hubtest.AnswerCode("0000", `a\r\nT2|0000|forged`), line: "TX1|CORE|x", want: "TX1|0000|a  T2|0000|forged"},
		{name: "unknown target", answer: hubtest.Echo, line: "TX1|NOPE|x", want: "TX1|E903|" + protocol.MsgUnknownTarget},
		{name: "malformed with txid", answer: hubtest.Echo, line: "TX1|CORE", want: "TX1|E900|" + protocol.MsgMissingFields},
		{name: "malformed without txid", answer: hubtest.Echo, line: "bad txid|CORE|x", want: "-|E900|" + protocol.MsgBadTxID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			core := hubtest.NewTarget(t, tt.answer)
			cfg, _ := testConfig(t, Target{Name: "core", URL: core.URL})
			_, addr := startServer(t, cfg)
			c := hubtest.Dial(t, addr)
			assert.Equal(t, tt.want, c.Exchange(tt.line).String())
		})
	}
}

// A filter in front of the hub that compares bytes must not be bypassed:
// only ASCII letters match in either case, never Unicode's folds of them.
func TestTargetNamesMatchInASCIICaseOnly(t *testing.T) {
	sk := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "SK", URL: sk.URL})
	_, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	for line, want := range map[string]string{
		"T1|SK|x":      "T1|0000|got x",
		"T2|sK|x":      "T2|0000|got x",
		"T3|\u017fK|x": "T3|E903|" + protocol.MsgUnknownTarget, // LATIN SMALL LETTER LONG S
		"T4|S\u212a|x": "T4|E903|" + protocol.MsgUnknownTarget, // KELVIN SIGN
	} {
		assert.Equal(t, want, c.Exchange(line).String(), line)
	}
}

func TestBreakerTripsAndRecovers(t *testing.T) {
	// Given a target that fails, with threshold 3 and reset timeout 7 s.
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(503))
	var tr hubtest.Transitions
	cfg, clk := testConfig(t, Target{Name: "CORE", URL: core.URL})
	cfg.FailThreshold, cfg.ResetTimeout, cfg.OnTransition = 3, 7*time.Second, tr.Observe
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	// When three calls fail, the breaker opens.
	for i := range 3 {
		assert.Equal(t, fmt.Sprintf("F%d|E500|target failed: HTTP 503: injected", i), c.Exchange(fmt.Sprintf("F%d|CORE|x", i)).String())
	}
	assert.Equal(t, breaker.Open, status(t, srv, "CORE").State)

	// Then requests are refused at once with the retry hint, and the target
	// is not called.
	assert.Equal(t, "R1|E904|circuit open; retry after 7s", c.Exchange("R1|CORE|x").String())
	clk.Advance(2500 * time.Millisecond)
	assert.Equal(t, "R2|E904|circuit open; retry after 5s", c.Exchange("R2|core|x").String())
	clk.Advance(4499 * time.Millisecond)
	assert.Equal(t, "R3|E904|circuit open; retry after 1s", c.Exchange("R3|CORE|x").String())
	assert.Equal(t, 3, core.Calls())
	assert.Equal(t, time.Millisecond, status(t, srv, "CORE").RetryAfter)

	// When the reset timeout has passed and the target has recovered, the
	// probe closes the breaker.
	clk.Advance(time.Millisecond)
	core.Set(hubtest.Echo)
	assert.Equal(t, "P1|0000|got x", c.Exchange("P1|CORE|x").String())
	assert.Equal(t, "N1|0000|got y", c.Exchange("N1|CORE|y").String())
	assert.Equal(t, []string{"CORE:CLOSED->OPEN", "CORE:OPEN->HALF_OPEN", "CORE:HALF_OPEN->CLOSED"}, tr.List())
	st := status(t, srv, "CORE")
	assert.Equal(t, breaker.Closed, st.State)
	assert.Zero(t, st.ConsecutiveFailures)
}

func TestHealthyAnswersNeverTrip(t *testing.T) {
	// Given threshold 1 and a target that only rejects.
	core := hubtest.NewTarget(t, hubtest.AnswerCode("B201", "insufficient funds"))
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	cfg.FailThreshold = 1
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	for i := range 4 {
		assert.Equal(t, fmt.Sprintf("B%d|B201|insufficient funds", i), c.Exchange(fmt.Sprintf("B%d|CORE|x", i)).String())
	}
	core.Set(hubtest.AnswerStatus(404))
	for i := range 4 {
		assert.Contains(t, c.Exchange(fmt.Sprintf("R%d|CORE|x", i)).String(), "|E400|")
	}
	assert.Equal(t, breaker.Closed, status(t, srv, "CORE").State)
	assert.Equal(t, 8, core.Calls())
}

func TestFailureCodes(t *testing.T) {
	tests := []struct {
		name     string
		codes    []string
		answer   string // the code the target answers with HTTP 200
		wantTrip bool
	}{
		{name: "default counts the target's own E500", codes: nil, answer: "E500", wantTrip: true},
		{name: "default counts a relayed E901", codes: nil, answer: "E901", wantTrip: true},
		{name: "default ignores other E codes", codes: nil, answer: "E123", wantTrip: false},
		{name: "narrowed set ignores E901", codes: []string{"E500"}, answer: "E901", wantTrip: false},
		{name: "widened set counts E400", codes: []string{"e400", " E500 "}, answer: "E400", wantTrip: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			core := hubtest.NewTarget(t, hubtest.AnswerCode(tt.answer, "x"))
			cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
			cfg.FailThreshold, cfg.FailureCodes = 1, tt.codes
			srv, addr := startServer(t, cfg)
			c := hubtest.Dial(t, addr)

			assert.Equal(t, "T1|"+tt.answer+"|x", c.Exchange("T1|CORE|x").String())
			want := breaker.Closed
			if tt.wantTrip {
				want = breaker.Open
			}
			assert.Equal(t, want, status(t, srv, "CORE").State)
		})
	}
}

func TestBulkheadFullAnswersAtOnce(t *testing.T) {
	// Given CORE with two slots, both held by slow calls.
	core := hubtest.NewTarget(t, nil)
	core.Set(core.BlockThen(hubtest.Echo))
	claim := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL}, Target{Name: "CLAIM", URL: claim.URL})
	cfg.MaxInflight = 2
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	c.Send("S1|CORE|a", "S2|CORE|b")
	core.WaitEntered(t, 2)
	assert.Equal(t, 2, status(t, srv, "CORE").InFlight)

	// When more requests arrive on the same connection, they are answered
	// at once, ahead of the slow calls; CLAIM is untouched.
	assert.Equal(t, "S3|E905|"+protocol.MsgBulkheadFull, c.Exchange("S3|CORE|c").String())
	assert.Equal(t, "C1|0000|got d", c.Exchange("C1|CLAIM|d").String())
	assert.Equal(t, "U1|E903|"+protocol.MsgUnknownTarget, c.Exchange("U1|NOPE|e").String())
	assert.Equal(t, 2, core.Calls())

	// Then the slow calls answer when the target does, and the slots free.
	core.UnblockAll()
	got := hubtest.Lines(c.ReadByTxID(2))
	assert.Equal(t, "S1|0000|got a", got["S1"])
	assert.Equal(t, "S2|0000|got b", got["S2"])
	hubtest.Eventually(t, func() bool { return status(t, srv, "CORE").InFlight == 0 }, "slots not released")
	assert.Equal(t, "S4|0000|got f", c.Exchange("S4|CORE|f").String())
	assert.Equal(t, breaker.Closed, status(t, srv, "CORE").State, "E905 is not a failure")
}

func TestFastAnswerNeverWaitsBehindSlowCall(t *testing.T) {
	tests := []struct {
		name  string
		write string
		eof   bool
	}{
		{name: "fast then slow", write: "U1|NONE|x\nS1|CORE|slow\n"},
		{name: "fast, slow, blank", write: "U1|NONE|x\nS1|CORE|slow\n\n"},
		{name: "fast then slow then end of input", write: "U1|NONE|x\nS1|CORE|slow", eof: true},
		{name: "slow then fast", write: "S1|CORE|slow\nU1|NONE|x\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			core := hubtest.NewTarget(t, nil)
			core.Set(core.BlockThen(hubtest.Echo))
			cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
			_, addr := startServer(t, cfg)
			c := hubtest.Dial(t, addr)
			_, err := c.Conn().Write([]byte(tt.write))
			require.NoError(t, err)
			if tt.eof {
				require.NoError(t, c.Conn().(*net.TCPConn).CloseWrite())
			}
			core.WaitEntered(t, 1)

			// The fast answer arrives while the slow call is still out.
			assert.Equal(t, "U1|E903|"+protocol.MsgUnknownTarget, c.ReadResponse().String())
			core.UnblockAll()
			assert.Equal(t, "S1|0000|got slow", c.ReadResponse().String())
		})
	}
}

func TestProbeHandedBackWhenBulkheadFull(t *testing.T) {
	// Given an open breaker whose reset timeout has passed, and a bulkhead
	// whose every slot is taken.
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(500))
	var tr hubtest.Transitions
	cfg, clk := testConfig(t, Target{Name: "CORE", URL: core.URL})
	cfg.FailThreshold, cfg.ResetTimeout, cfg.MaxInflight, cfg.OnTransition = 1, time.Second, 2, tr.Observe
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	require.Equal(t, "F1|E500|target failed: HTTP 500: injected", c.Exchange("F1|CORE|x").String())
	rt := srv.table.lookup([]byte("CORE"))
	require.True(t, rt.bulkhead.TryAcquire())
	require.True(t, rt.bulkhead.TryAcquire())
	clk.Advance(time.Second)

	// When requests arrive, each is admitted as the probe, finds the bulkhead
	// full, and hands the probe back: E905, never E904.
	assert.Equal(t, "P1|E905|"+protocol.MsgBulkheadFull, c.Exchange("P1|CORE|x").String())
	assert.Equal(t, "P2|E905|"+protocol.MsgBulkheadFull, c.Exchange("P2|CORE|x").String())

	// Then once a slot frees, the next request is the probe and decides.
	rt.bulkhead.Release()
	rt.bulkhead.Release()
	core.Set(hubtest.Echo)
	assert.Equal(t, "P3|0000|got x", c.Exchange("P3|CORE|x").String())
	assert.Equal(t, breaker.Closed, status(t, srv, "CORE").State)
	assert.Equal(t, 2, core.Calls())
	assert.Equal(t, "CORE:HALF_OPEN->CLOSED", tr.List()[len(tr.List())-1])
}

func TestPipelinedLinesAnsweredOnce(t *testing.T) {
	core := hubtest.NewTarget(t, hubtest.Echo)
	claim := hubtest.NewTarget(t, hubtest.AnswerCode("B211", "amount over limit"))
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL}, Target{Name: "CLAIM", URL: claim.URL})
	cfg.MaxInflight = 1000
	_, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	// Given hundreds of lines of every kind in a single write.
	want := map[string]string{}
	var lines []string
	for i := range 600 {
		id := fmt.Sprintf("P%03d", i)
		switch i % 6 {
		case 0, 1:
			lines = append(lines, id+"|CORE|n"+id)
			want[id] = id + "|0000|got n" + id
		case 2:
			lines = append(lines, id+"|claim|SUBMIT 1 99999999")
			want[id] = id + "|B211|amount over limit"
		case 3:
			lines = append(lines, id+"|OTHER|x")
			want[id] = id + "|E903|" + protocol.MsgUnknownTarget
		case 4:
			lines = append(lines, id+"|CORE")
			want[id] = id + "|E900|" + protocol.MsgMissingFields
		case 5:
			lines = append(lines, "", "\r", id+"|CLAIM|SUBMIT 2 3\r")
			want[id] = id + "|B211|amount over limit"
		}
	}
	sent := make(chan error, 1)
	go func() {
		_, err := c.Conn().Write([]byte(strings.Join(lines, "\n") + "\n"))
		sent <- err
	}()

	// Then every TXID is answered exactly once, and nothing else.
	got := hubtest.Lines(c.ReadByTxID(len(want)))
	require.NoError(t, <-sent)
	assert.Equal(t, want, got)
	assert.Equal(t, "Z1|E903|"+protocol.MsgUnknownTarget, c.Exchange("Z1|NONE|x").String(), "no stray answer may follow")
}

func TestOverlongLines(t *testing.T) {
	core := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	cfg.MaxLineBytes = 32
	_, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	exactly := "EX|CORE|" + strings.Repeat("p", 32-len("EX|CORE|"))
	require.Len(t, exactly, 32)
	tests := []struct {
		name string
		line string
		want string
	}{
		{name: "exactly the limit", line: exactly, want: "EX|0000|got " + exactly[8:]},
		{name: "exactly the limit with CR", line: exactly + "\r", want: "EX|0000|got " + exactly[8:]},
		{name: "one over", line: exactly + "q", want: "EX|E900|line too long"},
		{name: "one over with CR", line: exactly + "q\r", want: "EX|E900|line too long"},
		{name: "far over", line: "L1|CORE|" + strings.Repeat("x", 10000), want: "L1|E900|line too long"},
		{name: "far over without txid", line: strings.Repeat("x", 10000), want: "-|E900|line too long"},
		{name: "far over with bad txid", line: "L 1|CORE|" + strings.Repeat("x", 10000), want: "-|E900|line too long"},
		{name: "good line after", line: "G1|CORE|ok", want: "G1|0000|got ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, c.Exchange(tt.line).String())
		})
	}
}

func TestBlankLinesAndLineEndings(t *testing.T) {
	core := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	_, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	c.Send("", "\r", "", "T1|CORE|abc\r", "  ", "T2|CORE|x")
	got := hubtest.Lines(c.ReadByTxID(3))
	assert.Equal(t, map[string]string{
		"T1": "T1|0000|got abc",
		"-":  "-|E900|" + protocol.MsgMissingFields,
		"T2": "T2|0000|got x",
	}, got)
	assert.Equal(t, "Z|E903|"+protocol.MsgUnknownTarget, c.Exchange("Z|NONE|").String())
}

func TestLastLineWithoutNewline(t *testing.T) {
	core := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	_, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	_, err := c.Conn().Write([]byte("T1|CORE|a\nT2|CORE|b"))
	require.NoError(t, err)
	require.NoError(t, c.Conn().(*net.TCPConn).CloseWrite())

	got := hubtest.Lines(c.ReadByTxID(2))
	assert.Equal(t, "T1|0000|got a", got["T1"])
	assert.Equal(t, "T2|0000|got b", got["T2"])
	c.ExpectEOF()
}

func TestMaxConns(t *testing.T) {
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.MaxConns = 1
	_, addr := startServer(t, cfg)

	// Given one connection being served.
	first := hubtest.Dial(t, addr)
	require.Equal(t, "A|E903|"+protocol.MsgUnknownTarget, first.Exchange("A|NONE|x").String())

	// When more arrive, each gets one line and is closed, whether or not it
	// has sent anything.
	silent := hubtest.Dial(t, addr)
	assert.Equal(t, "-|E906|too many connections", silent.ReadResponse().String())
	silent.ExpectEOF()
	talker := hubtest.Dial(t, addr)
	talker.Send("B|CORE|x", "C|CORE|x")
	assert.Equal(t, "-|E906|too many connections", talker.ReadResponse().String())
	talker.ExpectEOF()

	// Then once the first leaves, a new connection is served.
	first.Conn().Close()
	hubtest.Eventually(t, func() bool {
		c := hubtest.Dial(t, addr)
		c.Send("D|NONE|x")
		return c.ReadResponse().String() == "D|E903|"+protocol.MsgUnknownTarget
	}, "a connection slot never freed")
}

func TestShutdownDrainsCallsInFlight(t *testing.T) {
	// Given a call in flight.
	core := hubtest.NewTarget(t, nil)
	core.Set(core.BlockThen(hubtest.Echo))
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	srv, err := New(cfg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	c := hubtest.Dial(t, ln.Addr().String())
	c.Send("S1|CORE|slow")
	core.WaitEntered(t, 1)

	// When Shutdown starts, new lines get E906 and nothing new is accepted.
	done := hubtest.ShutdownAsync(srv, hubtest.IOTimeout)
	for i := 0; ; i++ {
		line := c.Exchange(fmt.Sprintf("U%d|NONE|x", i)).String()
		if strings.HasSuffix(line, "|E906|shutting down") {
			break
		}
		require.Equal(t, fmt.Sprintf("U%d|E903|%s", i, protocol.MsgUnknownTarget), line)
		require.Less(t, i, 100000, "shutdown never began")
	}
	assert.Equal(t, "M1|E906|shutting down", c.Exchange("M1|CORE|x").String())
	assert.Equal(t, "M2|E906|shutting down", c.Exchange("M2|CORE").String(), "even malformed lines")
	_, err = net.DialTimeout("tcp", ln.Addr().String(), hubtest.IOTimeout)
	assert.Error(t, err, "the listener must be closed")

	// Then the call in flight is answered, and the connection closed.
	core.UnblockAll()
	assert.Equal(t, "S1|0000|got slow", c.ReadResponse().String())
	c.ExpectEOF()
	require.NoError(t, <-done)
	assert.ErrorIs(t, <-served, ErrServerClosed)
	assert.Equal(t, 1, core.Calls())
	assert.ErrorIs(t, srv.Serve(ln), ErrServerClosed)
}

func TestShutdownDeadlineAbortsCalls(t *testing.T) {
	// Given a call that would never end.
	core := hubtest.NewTarget(t, nil)
	core.Set(core.BlockThen(hubtest.Echo))
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	cfg.TargetTimeout = time.Minute
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	c.Send("S1|CORE|slow")
	core.WaitEntered(t, 1)

	// When the drain time runs out, the call is cancelled and answered.
	err := <-hubtest.ShutdownAsync(srv, 30*time.Millisecond)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, "S1|E901|no answer before shutdown; outcome unknown", c.ReadResponse().String())
	c.ExpectEOF()
	assert.Zero(t, status(t, srv, "CORE").InFlight)
}

func TestShutdownWithNothingInFlightClosesIdleConnections(t *testing.T) {
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	require.Equal(t, "A|E903|"+protocol.MsgUnknownTarget, c.Exchange("A|NONE|x").String())

	require.NoError(t, <-hubtest.ShutdownAsync(srv, hubtest.IOTimeout))
	c.ExpectEOF()
}

func TestClientGoneMidCall(t *testing.T) {
	// Given a failing call in flight, with threshold 1.
	core := hubtest.NewTarget(t, nil)
	ctxErr := make(chan error, 1)
	core.Set(core.BlockThen(func(w http.ResponseWriter, r *http.Request, _ []byte) {
		ctxErr <- r.Context().Err()
		w.WriteHeader(500)
	}))
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	cfg.FailThreshold = 1
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	c.Send("S1|CORE|debit")
	core.WaitEntered(t, 1)

	// When the client disconnects before the answer.
	require.NoError(t, c.Conn().Close())
	hubtest.Eventually(t, waitsForCalls, "the hub did not notice the client leaving")
	core.UnblockAll()

	// Then the call was not cancelled, and its failure still counts.
	assert.NoError(t, <-ctxErr, "the target call must not be cancelled by the client leaving")
	hubtest.Eventually(t, func() bool { return status(t, srv, "CORE").State == breaker.Open }, "the failure was not recorded")
	hubtest.Eventually(t, func() bool { return status(t, srv, "CORE").InFlight == 0 }, "the slot was not released")
}

func TestIdleTimeout(t *testing.T) {
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.IdleTimeout = 30 * time.Millisecond
	_, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	require.Equal(t, "A|E903|"+protocol.MsgUnknownTarget, c.Exchange("A|NONE|x").String())
	c.ExpectEOF()
}

func TestWriteTimeoutDisconnectsClientThatDoesNotRead(t *testing.T) {
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.WriteTimeout = 30 * time.Millisecond
	_, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	// Given a client that only writes: the hub's answers fill the socket
	// buffers, the hub stops reading, then gives up on the client.
	line := []byte(strings.Repeat("U|NONE|x\n", 4096))
	var err error
	for sent := 0; err == nil && sent < 512<<20; sent += len(line) {
		_ = c.Conn().SetWriteDeadline(time.Now().Add(hubtest.IOTimeout))
		_, err = c.Conn().Write(line)
	}
	require.Error(t, err)
	assert.False(t, errors.Is(err, context.DeadlineExceeded) || errors.Is(err, net.ErrClosed), "want the hub to close, got %v", err)
	var ne net.Error
	assert.False(t, errors.As(err, &ne) && ne.Timeout(), "want the hub to close, got %v", err)
}

// panicDial fails every call with a panic, standing in for a hub bug.
func panicDial(context.Context, string, string) (net.Conn, error) { panic("boom") }

func TestPanicInCallAnswersE907(t *testing.T) {
	cfg, clk := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.DialTarget = panicDial
	cfg.FailThreshold, cfg.ResetTimeout, cfg.MaxInflight = 1, time.Second, 1
	srv, addr := startServer(t, cfg)
	rt := srv.table.lookup([]byte("CORE"))
	c := hubtest.Dial(t, addr)

	assert.Equal(t, "P1|E907|"+protocol.MsgInternal, c.Exchange("P1|CORE|x").String())
	assert.Equal(t, "P2|E907|"+protocol.MsgInternal, c.Exchange("P2|CORE|x").String(), "the slot must have been released")
	st := status(t, srv, "CORE")
	assert.Equal(t, breaker.Closed, st.State, "E907 is not a failure")
	assert.Zero(t, st.InFlight)

	// A panicking probe hands its ticket back too: the next request is the
	// probe again rather than E904.
	ticket, _, err := rt.breaker.Allow()
	require.NoError(t, err)
	rt.breaker.Done(ticket, true, 0)
	clk.Advance(time.Second)
	assert.Equal(t, "P3|E907|"+protocol.MsgInternal, c.Exchange("P3|CORE|x").String())
	assert.Equal(t, "P4|E907|"+protocol.MsgInternal, c.Exchange("P4|CORE|x").String())
}

func TestServeAfterCloseAndShutdownTwice(t *testing.T) {
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	srv, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, srv.Shutdown(context.Background()))
	require.NoError(t, srv.Shutdown(context.Background()))
	require.NoError(t, srv.Close())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	assert.ErrorIs(t, srv.Serve(ln), ErrServerClosed)
	_, err = ln.Accept()
	assert.ErrorIs(t, err, net.ErrClosed, "Serve closes the listener it is given")
}

func TestTargets(t *testing.T) {
	cfg, _ := testConfig(t,
		Target{Name: "core", URL: "http://127.0.0.1:9201"},
		Target{Name: "Claim", URL: "https://claims.example:8443/api/"},
	)
	cfg.MaxInflight = 7
	srv, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })

	settings := TargetSettings{
		TargetTimeout:     DefaultTargetTimeout,
		TargetIdleTimeout: DefaultTargetIdleTimeout,
		FailureCodes:      []string{"E500", "E901", "E902"},
		Policy:            breaker.Policy{FailThreshold: DefaultFailThreshold, ResetTimeout: DefaultResetTimeout},
	}
	probeTimeout := DefaultTargetTimeout + time.Second
	closed := breaker.Snapshot{State: breaker.Closed}
	assert.Equal(t, []TargetSnapshot{
		{Name: "CORE", URL: "http://127.0.0.1:9201", Snapshot: closed, MaxInFlight: 7, Limit: 7, ProbeTimeout: probeTimeout, Settings: settings, Resolve: "manual"},
		{Name: "CLAIM", URL: "https://claims.example:8443/api/", Snapshot: closed, MaxInFlight: 7, Limit: 7, ProbeTimeout: probeTimeout, Settings: settings, Resolve: "manual"},
	}, srv.Targets())
	claim, ok := srv.Target("claim")
	require.True(t, ok)
	assert.Equal(t, "CLAIM", claim.Name)
	_, ok = srv.Target("nope")
	assert.False(t, ok)
	_, txURL, err := Target{Name: "Claim", URL: "https://claims.example:8443/api/"}.canonical()
	require.NoError(t, err)
	assert.Equal(t, "https://claims.example:8443/api/tx", txURL, "transactions go to the base URL's /tx")
}

func TestNewRejectsBadConfig(t *testing.T) {
	good := Target{Name: "CORE", URL: "http://127.0.0.1:9201"}
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{name: "no targets", cfg: Config{}, want: "no targets"},
		{name: "duplicate", cfg: Config{Targets: []Target{good, {Name: "core", URL: "http://127.0.0.1:1"}}}, want: "CORE configured twice"},
		{name: "empty name", cfg: Config{Targets: []Target{{Name: "", URL: good.URL}}}, want: "target name"},
		{name: "name with pipe", cfg: Config{Targets: []Target{{Name: "A|B", URL: good.URL}}}, want: "target name"},
		{name: "url scheme", cfg: Config{Targets: []Target{{Name: "A", URL: "ftp://h"}}}, want: "want http:// or https://"},
		{name: "url without host", cfg: Config{Targets: []Target{{Name: "A", URL: "http://"}}}, want: "want http:// or https://"},
		{name: "url relative", cfg: Config{Targets: []Target{{Name: "A", URL: "127.0.0.1:9201"}}}, want: "URL"},
		{name: "url unparsable", cfg: Config{Targets: []Target{{Name: "A", URL: "http://[::1"}}}, want: "does not parse"},
		{name: "url with query", cfg: Config{Targets: []Target{{Name: "A", URL: "http://h/?a=1"}}}, want: "no query"},
		{name: "negative threshold", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{Policy: breaker.Policy{FailThreshold: -1}}}, want: "FailThreshold"},
		{name: "negative reset", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{Policy: breaker.Policy{ResetTimeout: -time.Second}}}, want: "ResetTimeout"},
		{name: "negative inflight", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{MaxInflight: -1}}, want: "MaxInflight"},
		{name: "negative timeout", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{TargetTimeout: -1}}, want: "TargetTimeout"},
		{name: "negative target idle", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{TargetIdleTimeout: -time.Second}}, want: "TargetIdleTimeout must not be negative"},
		{name: "negative line", cfg: Config{Targets: []Target{good}, MaxLineBytes: -1}, want: "MaxLineBytes"},
		{name: "negative conns", cfg: Config{Targets: []Target{good}, MaxConns: -1}, want: "MaxConns"},
		{name: "negative idle", cfg: Config{Targets: []Target{good}, IdleTimeout: -1}, want: "IdleTimeout"},
		{name: "negative write", cfg: Config{Targets: []Target{good}, WriteTimeout: -1}, want: "WriteTimeout"},
		{name: "failure code of a success", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{FailureCodes: []string{"0000"}}}, want: `failure code "0000": want E400, E500, E901, E902`},
		{name: "failure code business", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{FailureCodes: []string{"B201"}}}, want: `failure code "B201": want E400`},
		{name: "failure code garbage", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{FailureCodes: []string{"E5OO"}}}, want: `failure code "E5OO": want E400`},
		{name: "failure code not a call", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{FailureCodes: []string{"E904"}}}, want: `failure code "E904": E900 to E999 are the hub's own codes`},
		{name: "failure code reserved for the hub", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{FailureCodes: []string{"E999"}}}, want: `failure code "E999": E900 to E999 are the hub's own codes`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, err := New(tt.cfg)
			require.Error(t, err)
			assert.Nil(t, srv)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

// flakyCoreConfig returns a Config of two targets on the real clock: CORE
// fails every third call with HTTP 500, CLAIM always answers.
func flakyCoreConfig(t *testing.T) Config {
	t.Helper()
	var n atomic.Int64
	core := hubtest.NewTarget(t, func(w http.ResponseWriter, r *http.Request, p []byte) {
		if n.Add(1)%3 == 0 {
			w.WriteHeader(500)
			return
		}
		hubtest.Echo(w, r, p)
	})
	claim := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL}, Target{Name: "CLAIM", URL: claim.URL})
	cfg.Clock = nil
	return cfg
}

// TestHammer runs many connections of pipelined traffic against a flaky
// target whose breaker trips and recovers on the real clock, under -race.
func TestHammer(t *testing.T) {
	cfg := flakyCoreConfig(t)
	cfg.FailThreshold, cfg.ResetTimeout, cfg.MaxInflight = 2, time.Millisecond, 4
	srv, addr := startServer(t, cfg)

	const clients, perClient = 8, 150
	allowed := map[string]bool{"0000": true, "E500": true, "E904": true, "E905": true}
	var wg sync.WaitGroup
	for ci := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := hubtest.Dial(t, addr)
			var b strings.Builder
			for i := range perClient {
				target := "CORE"
				if i%4 == 0 {
					target = "claim"
				}
				fmt.Fprintf(&b, "H%d-%d|%s|x\n", ci, i, target)
			}
			go func() { _, _ = c.Conn().Write([]byte(b.String())) }()
			got := make(map[string]bool, perClient)
			for range perClient {
				line, err := c.ReadLine(hubtest.ClientTimeout)
				if !assert.NoError(t, err) {
					return
				}
				parts := strings.SplitN(line, "|", 3)
				if !assert.Len(t, parts, 3) {
					return
				}
				assert.False(t, got[parts[0]], "TXID %s answered twice", parts[0])
				got[parts[0]] = true
				assert.True(t, allowed[parts[1]], "unexpected answer %q", line)
			}
		}()
	}
	wg.Wait()
	for _, st := range srv.Targets() {
		assert.Zero(t, st.InFlight, "%s slots leaked", st.Name)
	}
}

// waitsForCalls reports whether a connection's read loop has ended and
// its goroutine waits for the connection's calls in flight.
func waitsForCalls() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("sync.(*WaitGroup).Wait")) && bytes.Contains(g, []byte("relay.(*conn).serve(")) {
			return true
		}
	}
	return false
}
