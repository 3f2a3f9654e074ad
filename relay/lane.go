package relay

import (
	"sync/atomic"
	"time"

	"github.com/relayhub/relayhub/internal/sockio"
)

// Fair reading: the refusal lane.
//
// A line the hub refuses (E900, E903, E904, E905, E908) is answered at
// once, by the read loop, without a call. A client that sends such lines
// flat out in a closed loop, say hundreds of connections hammering a target
// whose breaker is open, therefore keeps its connections' goroutines
// runnable for every line, and on a busy hub they take the CPU, and the
// turns of Go's scheduler, that the other connections' calls need: their
// lines are read late and their calls, slowed, fill their bulkheads.
//
// So, while the hub has calls in flight, or has had within
// laneCallsRecent, a connection whose last laneAfter lines were all refused
// is refusal-heavy, and reads its socket only in its turn, taken with the
// other refusal-heavy connections: the lane has room for laneTurns
// connections at a time. Such a connection waits until its socket is
// readable, without reading, then waits for a turn; in its turn it reads
// once, answers every complete line of that read, writes the answers, and
// pauses for lanePause before it gives the turn on, so that the calls'
// goroutines and the network poller get the CPU between two turns. Every
// line read is answered at once, in the turn that read it; lines not yet
// read wait in the socket. A connection leaves the lane with its first
// admitted line. Connections that are not refusal-heavy never wait for the
// lane, and with no call to make room for, neither do refusal-heavy ones:
// a hub that only refuses answers as fast as it can.
//
// Only a connection whose socket the read loop reads itself
// (syscall.RawConn) takes turns: one read through TLS may bring lines that
// the socket no longer shows, and a turn must not be held through a read
// that waits for the client.
const (
	// laneAfter is how many refused lines in a row make a connection
	// refusal-heavy.
	laneAfter = 16
	// laneTurns is how many refusal-heavy connections serve their lines
	// at a time. One: with two or more, a storm keeps every P of the
	// runtime busy and the network poller runs only when sysmon forces it
	// (docs/BENCHMARKS.md, "Isolation under an open-CORE storm").
	laneTurns = 1
	// lanePause is the pause at the end of a turn: short, it yields the
	// CPU to whatever else is runnable and lets the network poller run,
	// which then finds the calls' answers and their clients' next lines.
	lanePause = 10 * time.Microsecond
	// laneCallsRecent is how long after the hub last had calls in flight
	// the lane stays in force.
	laneCallsRecent = time.Second
	// laneStuck is how long a connection waits for a turn while no turn
	// ends before it reads without one: a connection blocked in its turn
	// writing to a client that does not read (for up to WriteTimeout)
	// must not hold every other refusal-heavy connection back with it.
	laneStuck = 100 * time.Millisecond
)

// refusalLane is the turn taking of refusal-heavy connections. It is safe
// for concurrent use.
type refusalLane struct {
	turn    chan struct{} // a token per connection in its turn; capacity laneTurns
	ended   atomic.Uint64 // turns ended, so that a waiter tells a stuck lane from a busy one
	waiting atomic.Int64  // connections waiting for a turn now
	owed    atomic.Int64  // connections that found input and have not read it yet: Shutdown lets them read it before reading stops
	callsAt atomic.Int64  // when a refusal-heavy connection last found calls in flight, in Unix nanoseconds; 0 once laneCallsRecent has passed since (laneInForce)
	stuck   time.Duration // laneStuck; tests lengthen it
}

// init readies l for use.
func (l *refusalLane) init() {
	l.turn = make(chan struct{}, laneTurns)
	l.stuck = laneStuck
}

// noteRefused counts a refused line towards making the connection
// refusal-heavy.
func (c *conn) noteRefused() {
	c.refusals = min(c.refusals+1, laneAfter)
}

// laneSeat is a connection's place in the refusal lane: allocated when the
// connection first turns refusal-heavy, since most never do and an idle
// connection costs its conn (docs/BENCHMARKS.md, "Idle memory"). Owned by
// the read loop. Its methods take a nil seat as one that holds nothing.
type laneSeat struct {
	inTurn   bool        // the connection has its turn in the refusal lane
	turnRead bool        // it has read in its turn: the turn ends before another read
	toLane   bool        // the read loop left serveReadable for laneStep: to wait for a turn, or to end one
	owes     bool        // counted in the lane's owed: the socket was readable, the read waits for a turn
	passed   bool        // the wait for a turn gave up (a stuck lane, or shutdown): the next read goes ahead without one
	turnWait *time.Timer // times a wait for a turn (awaitTurn); nil until the first wait
}

// leftFor reports whether the read loop left serveReadable for a step in
// the lane (laneStep).
func (s *laneSeat) leftFor() bool { return s != nil && s.toLane }

// hasTurn reports whether the connection has its turn in the lane.
func (s *laneSeat) hasTurn() bool { return s != nil && s.inTurn }

// takeSeat returns the connection's place in the lane, taking one the first
// time.
func (c *conn) takeSeat() *laneSeat {
	if c.seat == nil {
		c.seat = new(laneSeat)
	}
	return c.seat
}

// laneDue reports whether the read loop is to wait for a turn before it
// reads: the connection is refusal-heavy, not in its turn, the hub is not
// shutting down (then nothing is held back: every line gets E906 at once)
// and the lane is in force.
func (c *conn) laneDue() bool {
	return c.refusals >= laneAfter && !c.seat.hasTurn() && !c.srv.inShutdown.Load() && c.srv.laneInForce()
}

// turnSpent reports, inside serveReadable, whether the connection has read
// once in its turn, and if so leaves the callback to end the turn
// (laneStep) instead of reading again: a turn is one read, and is never
// held through a wait for the client.
func (c *conn) turnSpent() bool {
	s := c.seat
	if !s.hasTurn() || !s.turnRead {
		return false
	}
	s.toLane = true
	return true
}

// laneRead decides, inside serveReadable, whether fillSession reads now,
// reporting true when it does not: a connection due for a turn waits in
// the callback until its socket is readable (awaitReadable), then leaves
// it to wait for the turn (laneStep). Neither the wait for a turn nor the
// pause that ends one happens inside serveReadable, which holds the
// socket's read lock: a Close from another goroutine, Server.Close's say,
// would wait for the turn.
func (c *conn) laneRead() (wait bool) {
	s := c.seat
	switch {
	case s.hasTurn():
		s.turnRead = true
	case s != nil && s.passed:
		s.passed = false
	case c.laneDue():
		return c.awaitReadable()
	}
	s.payOwed(&c.srv.lane)
	return false
}

// awaitReadable is laneRead's wait, inside serveReadable, until the socket
// is readable: it reports true, with nothing read, both to wait in the
// callback and, once there is input, to leave it for the wait for a turn.
// The input found is owed a read: Shutdown waits for it (see refusalLane's
// owed).
func (c *conn) awaitReadable() bool {
	c.parkReadBuf()
	if !sockio.Readable(c.fd) {
		c.armIdleDeadline()
		return true
	}
	s := c.takeSeat()
	s.toLane = true
	if !s.owes {
		s.owes = true
		c.srv.lane.owed.Add(1)
	}
	return true
}

// payOwed notes that the connection reads the input it waited for a turn
// to read, or will never read it.
func (s *laneSeat) payOwed(l *refusalLane) {
	if s != nil && s.owes {
		s.owes = false
		l.owed.Add(-1)
	}
}

// laneStep takes, between two RawConn.Reads of the read loop, the step in
// the lane that laneRead or serveInput left serveReadable for: the end of
// the connection's turn, or the wait for one. The next RawConn.Read starts
// with a read, or a look at the socket (awaitReadable), never a wait,
// since readiness raised before it began is forgotten (see fillSession);
// after a wait for a turn, it starts with the idle deadline moved on: the
// wait is not idle time, and a read deadline that passed during it would
// end the next RawConn.Read at once.
func (c *conn) laneStep() {
	c.seat.toLane, c.waitNext = false, false
	if c.seat.inTurn {
		c.endTurn()
		return
	}
	c.awaitTurn()
	c.seat.passed = !c.seat.inTurn
	c.armReadDeadline(time.Now())
}

// awaitTurn waits for the connection's turn in the lane. It returns without
// one once the Server is shutting down (every line then gets E906 at once),
// or when no turn has ended for the lane's stuck time.
func (c *conn) awaitTurn() {
	l, s := &c.srv.lane, c.takeSeat()
	select {
	case l.turn <- struct{}{}:
		s.inTurn = true
		return
	default:
	}
	l.waiting.Add(1)
	defer l.waiting.Add(-1)
	c.run = time.Time{} // the breakers' clock reading of the run is old once the turn comes
	if s.turnWait == nil {
		s.turnWait = time.NewTimer(l.stuck)
	} else {
		s.turnWait.Reset(l.stuck)
	}
	defer s.turnWait.Stop()
	seen := l.ended.Load()
	for {
		select {
		case l.turn <- struct{}{}:
			s.inTurn = true
			return
		case <-c.srv.stopping:
			return
		case <-s.turnWait.C:
			ended := l.ended.Load()
			if ended == seen {
				return
			}
			seen = ended
			s.turnWait.Reset(l.stuck)
		}
	}
}

// endTurn ends the connection's turn, if it has one, now that its answers
// are written: after lanePause.
func (c *conn) endTurn() {
	if !c.seat.hasTurn() {
		return
	}
	time.Sleep(lanePause)
	c.leaveLane()
}

// leaveLane gives the connection's turn back, if it has one, and what it
// owes the lane: the read loop ends with it.
func (c *conn) leaveLane() {
	s := c.seat
	if s == nil {
		return
	}
	s.payOwed(&c.srv.lane)
	if !s.inTurn {
		return
	}
	s.inTurn, s.turnRead = false, false
	c.srv.lane.ended.Add(1)
	<-c.srv.lane.turn
}

// laneInForce reports whether refusal-heavy connections take turns now:
// the hub has calls in flight, or had within laneCallsRecent. A
// refusal-heavy connection asks before each read; the time of
// the calls it finds is shared at most once a millisecond, so that the
// connections asking do not all write one word. The first to ask after
// laneCallsRecent without calls clears that time, so that, until calls
// come again, asking reads no clock: a hub that only refuses (a target's
// breaker held open, say) pays for no clock reading per read.
func (s *Server) laneInForce() bool {
	last := s.lane.callsAt.Load()
	if s.callsInFlight() {
		if now := time.Now().UnixNano(); now-last > int64(time.Millisecond) {
			s.lane.callsAt.Store(now)
		}
		return true
	}
	if last == 0 {
		return false
	}
	if time.Now().UnixNano()-last < int64(laneCallsRecent) {
		return true
	}
	s.lane.callsAt.CompareAndSwap(last, 0)
	return false
}

// callsInFlight reports whether any target has a call in flight.
func (s *Server) callsInFlight() bool {
	for _, rt := range s.routeList() {
		if rt.bulkhead.InFlight() > 0 {
			return true
		}
	}
	return false
}
