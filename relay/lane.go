package relay

import (
	"sync/atomic"
	"time"
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
// is refusal-heavy, and serves the lines it reads in turn with the other
// refusal-heavy connections: it waits for a turn in the lane, which has
// room for laneTurns connections at a time; in its turn it answers every
// complete line it has read (one read's worth), writes the answers, and
// pauses for lanePause before it gives the turn on, so that the calls'
// goroutines and the network poller get the CPU between two turns. Lines
// are read before the wait and answered as soon as the turn comes; lines
// not yet read wait in the socket. A connection leaves the lane with its
// first admitted line. Connections that are not refusal-heavy never wait
// for the lane, and with no call to make room for, neither do
// refusal-heavy ones: a hub that only refuses answers as fast as it can.
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
	// ends before it serves its lines without one: a connection blocked
	// in its turn writing to a client that does not read (for up to
	// WriteTimeout) must not hold every other refusal-heavy connection
	// back with it.
	laneStuck = 100 * time.Millisecond
)

// refusalLane is the turn taking of refusal-heavy connections. It is safe
// for concurrent use.
type refusalLane struct {
	turn    chan struct{} // a token per connection in its turn; capacity laneTurns
	ended   atomic.Uint64 // turns ended, so that a waiter tells a stuck lane from a busy one
	waiting atomic.Int64  // connections waiting for a turn now
	callsAt atomic.Int64  // when a refusal-heavy connection last found calls in flight, in Unix nanoseconds
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
	asked    bool        // turnDue has asked the lane since the loop last waited: it asks again once the loop has waited
	toLane   bool        // serveInput left serveReadable for laneStep: to wait for a turn (holding), else to end one
	holding  bool        // held is a line read and not yet served, waiting for a turn
	held     heldLine    // see holding
	turnWait *time.Timer // times a wait for a turn (awaitTurn); nil until the first wait
}

// leftFor reports whether serveInput left serveReadable for a step in the
// lane (laneStep).
func (s *laneSeat) leftFor() bool { return s != nil && s.toLane }

// hasTurn reports whether the connection has its turn in the lane.
func (s *laneSeat) hasTurn() bool { return s != nil && s.inTurn }

// holdsLine reports whether a line read waits for a turn.
func (s *laneSeat) holdsLine() bool { return s != nil && s.holding }

// batchDone notes that the read loop has served every complete line it
// read, and reports whether that ends the connection's turn.
func (s *laneSeat) batchDone() bool {
	if s == nil {
		return false
	}
	s.asked = false
	return s.inTurn
}

// takeSeat returns the connection's place in the lane, taking one the first
// time.
func (c *conn) takeSeat() *laneSeat {
	if c.seat == nil {
		c.seat = new(laneSeat)
	}
	return c.seat
}

// heldLine is a line the read loop has read and not yet served (readLine's
// results): it waits for the connection's turn in the lane, outside
// serveReadable. Its bytes stay where readLine left them, in the read
// buffer or in txid, since nothing reads between the hold and the serve.
type heldLine struct {
	line    []byte
	tooLong bool
	err     error
}

// turnDue reports whether the connection is to wait for a turn in the lane
// before it serves the line it has read: it is refusal-heavy, not in its
// turn, and the lane is in force. It asks the lane once per batch of lines
// (those served between two waits of the read loop), so that a hub that
// only refuses pays for the question once per read at most.
func (c *conn) turnDue() bool {
	if c.refusals < laneAfter {
		return false
	}
	s := c.takeSeat()
	if s.inTurn || s.asked {
		return false
	}
	s.asked = true
	return c.srv.laneInForce()
}

// holdLine keeps a line read inside serveReadable while the read loop
// leaves the callback to wait for a turn (see laneStep); nextLine returns
// it first.
func (c *conn) holdLine(line []byte, tooLong bool, err error) {
	s := c.takeSeat()
	s.held = heldLine{line: line, tooLong: tooLong, err: err}
	s.holding, s.toLane = true, true
}

// nextLine returns the line held for a turn, if there is one, else the
// next line readLine reads.
func (c *conn) nextLine() (line []byte, tooLong bool, err error) {
	if !c.seat.holdsLine() {
		return c.readLine()
	}
	h := c.seat.held
	c.seat.held, c.seat.holding = heldLine{}, false
	return h.line, h.tooLong, h.err
}

// laneStep takes, between two RawConn.Reads of the read loop, the step in
// the lane that serveInput left serveReadable for: the wait for a turn,
// before the held line is served, or else the end of the turn. The next
// RawConn.Read starts with a read, since readiness raised before it began
// is forgotten (see fillSession), and after a wait for a turn, with the
// idle deadline moved on: the wait is not idle time, and a read deadline
// that passed during it would end the next RawConn.Read at once.
func (c *conn) laneStep() {
	c.seat.toLane, c.waitNext = false, false
	if !c.seat.holding {
		c.endTurn()
		return
	}
	c.awaitTurn()
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

// leaveLane gives the connection's turn back, if it has one.
func (c *conn) leaveLane() {
	if !c.seat.hasTurn() {
		return
	}
	c.seat.inTurn = false
	c.srv.lane.ended.Add(1)
	<-c.srv.lane.turn
}

// laneInForce reports whether refusal-heavy connections take turns now:
// the hub has calls in flight, or had within laneCallsRecent. A
// refusal-heavy connection asks before each batch of lines; the time of
// the calls it finds is shared at most once a millisecond, so that the
// connections asking do not all write one word.
func (s *Server) laneInForce() bool {
	now := time.Now().UnixNano()
	last := s.lane.callsAt.Load()
	if s.callsInFlight() {
		if now-last > int64(time.Millisecond) {
			s.lane.callsAt.Store(now)
		}
		return true
	}
	return now-last < int64(laneCallsRecent)
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
