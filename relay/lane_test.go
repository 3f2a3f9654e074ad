package relay

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
)

// laneServer serves a CORE whose breaker is open for an hour and a healthy
// CLAIM that echoes its payload, with cfg's other settings. Its lane is in
// force for the hour, as if it had just had calls in flight, and a
// connection waits for its turn as long as the test holds the lane: no
// wait gives up on a stuck lane.
func laneServer(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	return laneServerStuck(t, cfg, time.Hour)
}

// laneServerStuck is laneServer with waits for a turn that give up after
// stuck without a turn ending. It is set before the Server serves: the
// connections read it without synchronization.
func laneServerStuck(t *testing.T, cfg Config, stuck time.Duration) (*Server, string) {
	t.Helper()
	return laneServerFor(t, cfg, hubtest.NewTarget(t, hubtest.Echo).URL, time.Now().Add(time.Hour), stuck)
}

// laneServerFor is laneServerStuck with CLAIM at claimURL and the calls
// last seen in flight at callsAt.
func laneServerFor(t *testing.T, cfg Config, claimURL string, callsAt time.Time, stuck time.Duration) (*Server, string) {
	t.Helper()
	base, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"}, Target{Name: "CLAIM", URL: claimURL})
	cfg.Targets, cfg.Clock, cfg.Logger = base.Targets, base.Clock, base.Logger
	srv := openCoreServer(t, cfg)
	srv.lane.stuck = stuck
	srv.lane.callsAt.Store(callsAt.UnixNano())
	return srv, hubtest.Serve(t, srv, ErrServerClosed)
}

// holdLane takes every turn of srv's lane, as connections in their turns
// would, and returns the function that gives one of them back. The turns
// still held are given back when the test ends.
func holdLane(t *testing.T, srv *Server) (giveBack func()) {
	t.Helper()
	held := cap(srv.lane.turn)
	for range held {
		srv.lane.turn <- struct{}{}
	}
	giveBack = func() {
		require.Positive(t, held, "no turn held")
		held--
		<-srv.lane.turn
	}
	t.Cleanup(func() {
		for held > 0 {
			giveBack()
		}
	})
	return giveBack
}

// makeRefusalHeavy sends laneAfter CORE lines on c, one at a time, each
// answered E904 at once, which makes c's connection refusal-heavy.
func makeRefusalHeavy(t *testing.T, c *hubtest.Client, prefix string) {
	t.Helper()
	for i := range laneAfter {
		txid := fmt.Sprintf("%s%d", prefix, i)
		require.Equal(t, txid+"|E904|circuit open; retry after 3600s", c.Exchange(txid+"|CORE|BAL 1").String())
	}
}

// waitersBecome waits until n connections wait for a turn in srv's lane.
func waitersBecome(t *testing.T, srv *Server, n int64) {
	t.Helper()
	hubtest.Eventually(t, func() bool { return srv.lane.waiting.Load() == n },
		fmt.Sprintf("want %d connections waiting for a turn, have %d", n, srv.lane.waiting.Load()))
}

// expectNoAnswerYet checks that nothing is waiting to be read on c. The
// caller has made sure that the hub cannot answer c now (its connection
// waits for a turn the test holds), so the short wait cannot miss a late
// answer; without the lane the answer would be there.
func expectNoAnswerYet(t *testing.T, c *hubtest.Client) {
	t.Helper()
	require.NoError(t, c.Conn().SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	var b [1]byte
	n, err := c.Conn().Read(b[:])
	assert.Zero(t, n, "an answer arrived while its connection waited for a turn")
	assert.True(t, errors.Is(err, os.ErrDeadlineExceeded), "want no answer yet, got %v", err)
}

func TestRefusalHeavyConnectionWaitsForItsTurn(t *testing.T) {
	// Given a connection made refusal-heavy by laneAfter E904s in a row,
	// and every turn of the lane held.
	var cfg Config
	reg := withMetrics(t, &cfg)
	srv, addr := laneServer(t, cfg)
	heavy := hubtest.Dial(t, addr)
	makeRefusalHeavy(t, heavy, "R")
	giveBack := holdLane(t, srv)

	// When it sends two more lines, they wait, unread, for its turn:
	// unanswered, and the connection counted as waiting.
	heavy.Send("H1|CORE|BAL 1", "H2|CORE|BAL 2")
	waitersBecome(t, srv, 1)
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, metricLaneWaiting))

	// Then the other connections are served meanwhile: admitted lines,
	// and the refusals of a connection that is not refusal-heavy.
	claim := hubtest.Dial(t, addr)
	assert.Equal(t, "C1|0000|got SUBMIT P1 100", claim.Exchange("C1|CLAIM|SUBMIT P1 100").String())
	fresh := hubtest.Dial(t, addr)
	assert.Equal(t, "F1|E904|circuit open; retry after 3600s", fresh.Exchange("F1|CORE|BAL 1").String())
	expectNoAnswerYet(t, heavy)

	// When a turn is given back, both lines are read and answered in it.
	giveBack()
	assert.Equal(t, map[string]string{
		"H1": "H1|E904|circuit open; retry after 3600s",
		"H2": "H2|E904|circuit open; retry after 3600s",
	}, hubtest.Lines(heavy.ReadByTxID(2)))
	waitersBecome(t, srv, 0)
	assert.Zero(t, hubtest.MetricValue(t, reg, metricLaneWaiting))
}

func TestLaneHoldsNoOneBackWithoutCalls(t *testing.T) {
	// Given a hub that has had no call in flight for longer than
	// laneCallsRecent, every turn held, and a refusal-heavy connection.
	srv, addr := laneServerFor(t, Config{}, hubtest.NewTarget(t, hubtest.Echo).URL, time.Now().Add(-2*laneCallsRecent), time.Hour)
	heavy := hubtest.Dial(t, addr)
	makeRefusalHeavy(t, heavy, "R")
	holdLane(t, srv)

	// Then its lines are answered at once: there is no call to make room
	// for.
	assert.Equal(t, "H1|E904|circuit open; retry after 3600s", heavy.Exchange("H1|CORE|BAL 1").String())
	assert.Zero(t, srv.lane.waiting.Load())
}

func TestCallInFlightPutsTheLaneInForce(t *testing.T) {
	// Given a hub that has had no call in flight for longer than
	// laneCallsRecent, every turn held, and a refusal-heavy connection.
	claim := hubtest.NewTarget(t, hubtest.Echo)
	claim.Set(claim.BlockThen(hubtest.Echo))
	srv, addr := laneServerFor(t, Config{}, claim.URL, time.Now().Add(-2*laneCallsRecent), time.Hour)
	heavy := hubtest.Dial(t, addr)
	makeRefusalHeavy(t, heavy, "R")
	giveBack := holdLane(t, srv)

	// When a CLAIM call is in flight, the refusal-heavy connection's next
	// line waits for its turn.
	caller := hubtest.Dial(t, addr)
	caller.Send("C1|CLAIM|SUBMIT P1 100")
	claim.WaitEntered(t, 1)
	heavy.Send("H1|CORE|BAL 1")
	waitersBecome(t, srv, 1)
	expectNoAnswerYet(t, heavy)

	// Then, the call answered and a turn given back, both are answered.
	claim.UnblockAll()
	assert.Equal(t, "C1|0000|got SUBMIT P1 100", caller.ReadResponse().String())
	giveBack()
	assert.Equal(t, "H1|E904|circuit open; retry after 3600s", heavy.ReadResponse().String())
}

func TestAdmittedLineTakesTheConnectionOutOfTheLane(t *testing.T) {
	// Given a refusal-heavy connection whose next line is admitted (in its
	// turn: the lane is free).
	srv, addr := laneServer(t, Config{})
	c := hubtest.Dial(t, addr)
	makeRefusalHeavy(t, c, "R")
	assert.Equal(t, "C1|0000|got SUBMIT P1 100", c.Exchange("C1|CLAIM|SUBMIT P1 100").String())

	// When every turn is held, its refusals are answered at once again,
	// until laneAfter of them in a row make it refusal-heavy anew.
	giveBack := holdLane(t, srv)
	makeRefusalHeavy(t, c, "A")
	c.Send("H1|CORE|BAL 1")
	waitersBecome(t, srv, 1)
	expectNoAnswerYet(t, c)
	giveBack()
	assert.Equal(t, "H1|E904|circuit open; retry after 3600s", c.ReadResponse().String())
}

func TestEveryKindOfRefusalCounts(t *testing.T) {
	tests := []struct {
		name, line, answer string
	}{
		{name: "breaker open", line: "T1|CORE|x", answer: "T1|E904|circuit open; retry after 3600s"},
		{name: "unknown target", line: "T1|PAYROLL|x", answer: "T1|E903|unknown target"},
		{name: "malformed", line: "T1|CORE", answer: "T1|E900|malformed line: want TXID|TARGET|PAYLOAD"},
		{name: "too long", line: "T1|CORE|" + strings.Repeat("x", 100), answer: "T1|E900|line too long"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, addr := laneServer(t, Config{MaxLineBytes: 64})
			c := hubtest.Dial(t, addr)
			for range laneAfter {
				require.Equal(t, tt.answer, c.Exchange(tt.line).String())
			}
			giveBack := holdLane(t, srv)
			c.Send(tt.line)
			waitersBecome(t, srv, 1)
			giveBack()
			assert.Equal(t, tt.answer, c.ReadResponse().String())
		})
	}
}

func TestShutdownDoesNotWaitForTheLane(t *testing.T) {
	// Given a refusal-heavy connection waiting for a turn that never
	// comes.
	srv, addr := laneServer(t, Config{})
	heavy := hubtest.Dial(t, addr)
	makeRefusalHeavy(t, heavy, "R")
	holdLane(t, srv)
	heavy.Send("H1|CORE|BAL 1")
	waitersBecome(t, srv, 1)

	// When the hub shuts down, the line is answered E906 and the drain
	// ends.
	done := hubtest.ShutdownAsync(srv, hubtest.IOTimeout)
	assert.Equal(t, "H1|E906|shutting down", heavy.ReadResponse().String())
	heavy.ExpectEOF()
	assert.NoError(t, <-done)
}

func TestWaitForATurnIsNotIdleTime(t *testing.T) {
	// Given a short idle timeout and a refusal-heavy connection waiting
	// for a turn, and an idle connection opened as the wait begins.
	srv, addr := laneServer(t, Config{IdleTimeout: 200 * time.Millisecond})
	heavy := hubtest.Dial(t, addr)
	makeRefusalHeavy(t, heavy, "R")
	giveBack := holdLane(t, srv)
	heavy.Send("H1|CORE|BAL 1")
	waitersBecome(t, srv, 1)
	idle := hubtest.Dial(t, addr)

	// When the idle connection has been closed for its idle time, the
	// waiting one has waited longer than its idle timeout.
	idle.ExpectEOF()

	// Then, its turn come, it is answered and still serves.
	giveBack()
	assert.Equal(t, "H1|E904|circuit open; retry after 3600s", heavy.ReadResponse().String())
	assert.Equal(t, "H2|E904|circuit open; retry after 3600s", heavy.Exchange("H2|CORE|BAL 1").String())
}

func TestStuckTurnDoesNotHoldTheLaneBack(t *testing.T) {
	// Given every turn held and never given back, as by connections blocked
	// writing to clients that do not read, and a lane that gives up on a
	// turn after 20 ms without one ending.
	srv, addr := laneServerStuck(t, Config{}, 20*time.Millisecond)
	heavy := hubtest.Dial(t, addr)
	makeRefusalHeavy(t, heavy, "R")
	holdLane(t, srv)

	// When the refusal-heavy connection sends a line, it is answered
	// without a turn.
	assert.Equal(t, "H1|E904|circuit open; retry after 3600s", heavy.Exchange("H1|CORE|BAL 1").String())
	assert.Equal(t, "H2|E904|circuit open; retry after 3600s", heavy.Exchange("H2|CORE|BAL 1").String())
}

// TestLaneHammer runs refusal-heavy connections, pipelining, beside
// connections whose lines are admitted, under the race detector: every
// line is answered exactly once, and no connection is left waiting.
func TestLaneHammer(t *testing.T) {
	srv, addr := laneServerStuck(t, Config{}, laneStuck)
	const (
		heavyConns = 16
		claimConns = 4
		rounds     = 20
		depth      = 8
	)
	var wg sync.WaitGroup
	errs := make(chan error, heavyConns+claimConns)
	run := func(target string, id int) {
		defer wg.Done()
		nc, err := net.DialTimeout("tcp", addr, hubtest.IOTimeout)
		if err != nil {
			errs <- err
			return
		}
		defer nc.Close()
		if err := nc.SetDeadline(time.Now().Add(4 * hubtest.IOTimeout)); err != nil {
			errs <- err
			return
		}
		var in strings.Builder
		buf := make([]byte, 0, 64<<10)
		for r := range rounds {
			in.Reset()
			for d := range depth {
				fmt.Fprintf(&in, "%s-%d-%d-%d|%s|SUBMIT P 1\n", target, id, r, d, target)
			}
			if _, err := io.WriteString(nc, in.String()); err != nil {
				errs <- err
				return
			}
			seen := map[string]bool{}
			for len(seen) < depth {
				n, err := nc.Read(buf[len(buf):cap(buf)])
				if err != nil {
					errs <- fmt.Errorf("%s %d round %d after %d answers: %w", target, id, r, len(seen), err)
					return
				}
				buf = buf[:len(buf)+n]
				for {
					i := strings.IndexByte(string(buf), '\n')
					if i < 0 {
						break
					}
					txid, _, _ := strings.Cut(string(buf[:i]), "|")
					if seen[txid] {
						errs <- fmt.Errorf("%s answered twice", txid)
						return
					}
					seen[txid] = true
					buf = buf[:copy(buf, buf[i+1:])]
				}
			}
		}
		errs <- nil
	}
	wg.Add(heavyConns + claimConns)
	for i := range heavyConns {
		go run("CORE", i)
	}
	for i := range claimConns {
		go run("CLAIM", i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	// A turn ends after its answers are written: the last one may still
	// be ending.
	hubtest.Eventually(t, func() bool { return srv.lane.waiting.Load() == 0 && len(srv.lane.turn) == 0 },
		"a connection still waits for a turn, or a turn was not given back")
}

// serverConn returns the socket of the one connection srv serves.
func serverConn(t *testing.T, srv *Server) net.Conn {
	t.Helper()
	srv.serving.mu.Lock()
	defer srv.serving.mu.Unlock()
	var found []net.Conn
	for nc, c := range srv.serving.conns {
		if c != nil {
			found = append(found, nc)
		}
	}
	require.Len(t, found, 1, "want one connection served")
	return found[0]
}

// heavyBehindHeldLane returns a laneServer, a refusal-heavy connection to
// it, and holdLane's giveBack of the lane's turns, all held.
func heavyBehindHeldLane(t *testing.T) (*Server, *hubtest.Client, func()) {
	t.Helper()
	srv, addr := laneServer(t, Config{})
	heavy := hubtest.Dial(t, addr)
	makeRefusalHeavy(t, heavy, "R")
	return srv, heavy, holdLane(t, srv)
}

func TestCloseDoesNotWaitForATurn(t *testing.T) {
	// Given a refusal-heavy connection whose line waits for a turn that
	// does not come.
	srv, heavy, giveBack := heavyBehindHeldLane(t)
	heavy.Send("H1|CORE|BAL 1")
	waitersBecome(t, srv, 1)

	// When another goroutine closes its socket, as a call whose answer
	// cannot be written or Close does, the close does not wait for the
	// turn: the wait holds no lock of the socket's.
	nc := serverConn(t, srv)
	closed := make(chan error, 1)
	go func() { closed <- nc.Close() }()
	select {
	case err := <-closed:
		assert.NoError(t, err)
	case <-time.After(hubtest.IOTimeout):
		giveBack()
		t.Fatal("closing the socket waited for the connection's turn")
	}

	// Then, its turn come, the connection ends and gives the turn back.
	giveBack()
	heavy.ExpectEOF()
	hubtest.Eventually(t, func() bool { return srv.lane.waiting.Load() == 0 && len(srv.lane.turn) == 0 },
		"the closed connection still waits for a turn, or holds one")
}

func TestLastLineWithTheEndOfInputWaitsForItsTurn(t *testing.T) {
	// Given a refusal-heavy connection and every turn held.
	srv, heavy, giveBack := heavyBehindHeldLane(t)

	// When its client sends a last line and closes its side at once, the
	// line waits for a turn.
	heavy.Send("H1|CORE|BAL 1")
	require.NoError(t, heavy.Conn().(*net.TCPConn).CloseWrite())
	waitersBecome(t, srv, 1)
	expectNoAnswerYet(t, heavy)

	// Then, its turn come, it is answered and the hub closes its side.
	giveBack()
	assert.Equal(t, "H1|E904|circuit open; retry after 3600s", heavy.ReadResponse().String())
	heavy.ExpectEOF()
}

// TestRefusalHeavyLineDoesNotAllocate checks that a refusal-heavy
// connection's E904 costs no allocation with its turn: the lane found in
// force, the turn taken, and given back after its pause.
func TestRefusalHeavyLineDoesNotAllocate(t *testing.T) {
	srv, c, client := openCoreConn(t)
	assert.Zero(t, laneAllocsPerLine(t, srv, c, client, func() (inTurn bool, err error) {
		line, _, err := c.readLine()
		if err != nil {
			return false, err
		}
		c.adm.awaitTurn()
		inTurn = c.adm.inTurn
		c.adm.tally(c.serveLine(line))
		c.out.flush(time.Now())
		c.adm.endTurn()
		return inTurn, nil
	}))
}

// laneAllocsPerLine returns the allocations per E904 of c, refusal-heavy,
// the lane in force as if calls were in flight: each run writes a CORE
// line, serve serves it, reporting whether it did so in the connection's
// turn, and the answer is read back. It checks the answers, that every
// line was served in a turn and that every turn was given back.
func laneAllocsPerLine(t *testing.T, srv *Server, c *conn, client net.Conn, serve func() (inTurn bool, err error)) float64 {
	t.Helper()
	c.adm.refusals = laneAfter
	srv.lane.callsAt.Store(time.Now().Add(time.Hour).UnixNano()) // as if calls were in flight
	request := []byte("TX-000123|core|XFER 1001 1002 2500\n")
	want := "TX-000123|E904|circuit open; retry after 3600s\n"
	got := make([]byte, len(want))
	require.NoError(t, client.SetDeadline(time.Now().Add(hubtest.IOTimeout)))
	var failed error
	turns := 0
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := client.Write(request); err != nil {
			failed = err
			return
		}
		inTurn, err := serve()
		if err != nil {
			failed = err
			return
		}
		if inTurn {
			turns++
		}
		if _, err := io.ReadFull(client, got); err != nil {
			failed = err
		}
	})
	require.NoError(t, failed)
	assert.Equal(t, want, string(got))
	assert.Equal(t, 201, turns, "every line served in a turn")
	assert.Empty(t, srv.lane.turn, "every turn given back")
	return allocs
}

func TestRefusalHeavyTLSConnectionWaitsForItsTurnLikeAnyOther(t *testing.T) {
	// Given a hub serving TLS, every turn of its lane held, and a
	// connection made refusal-heavy.
	h := newTLSHub(t, false)
	srv, addr := laneServer(t, Config{TLS: h.config(0)})
	heavy := hubtest.DialTLS(t, addr, h.ca.ClientConfig(nil))
	makeRefusalHeavy(t, heavy, "R")
	giveBack := holdLane(t, srv)

	// When it sends a line, the line is read and waits for a turn, as on
	// a plain socket: a turn is taken after the read, so TLS needs no
	// exception.
	heavy.Send("H1|CORE|BAL 1")
	waitersBecome(t, srv, 1)
	expectNoAnswerYet(t, heavy)

	// Then its turn come, it is answered.
	giveBack()
	assert.Equal(t, map[string]string{"H1": "H1|E904|circuit open; retry after 3600s"}, hubtest.Lines(heavy.ReadByTxID(1)))
}
