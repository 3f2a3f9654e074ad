package relay

import (
	"sync/atomic"
	"time"
)

// Fair reading: the refusal lane.
//
// A refused line (E900, E903, E904, E905, E908) is answered at once by the
// read loop. Hundreds of connections sending such lines flat out keep
// their goroutines runnable for every line and take the CPU that other
// connections' calls need. So, while the hub has calls in flight (or had
// within laneCallsRecent), a connection whose last laneAfter lines were
// all refused answers each batch of lines it has read only in its turn,
// one connection at a time, with a short pause after each turn. Lines not
// yet read wait in the socket; a turn is never held through a read. The
// connection leaves the lane with its first admitted line
// (docs/DESIGN.md, "Fair reading").
const (
	// laneAfter is how many refused lines in a row make a connection
	// refusal-heavy.
	laneAfter = 16
	// lanePause, at the end of a turn, lets the calls' goroutines and the
	// network poller run before the next refusal-heavy batch.
	lanePause = 10 * time.Microsecond
	// laneCallsRecent is how long after the hub last had calls in flight
	// the lane stays in force.
	laneCallsRecent = time.Second
	// laneStuck is how long a connection waits while no turn ends before
	// it goes on without one: a turn blocked writing to a client that does
	// not read must not hold every other connection back.
	laneStuck = 100 * time.Millisecond
)

// refusalLane is the turn taking of refusal-heavy connections. It is safe
// for concurrent use.
type refusalLane struct {
	turn    chan struct{} // holds a token while a connection has its turn
	ended   atomic.Uint64 // turns ended, so a waiter tells a stuck lane from a busy one
	waiting atomic.Int64  // connections waiting for a turn now
	callsAt atomic.Int64  // when calls were last seen in flight, Unix nanoseconds
	stuck   time.Duration // laneStuck; tests shorten it
}

// init readies l for use.
func (l *refusalLane) init() {
	l.turn = make(chan struct{}, 1)
	l.stuck = laneStuck
}

// tally counts a line towards making the connection refusal-heavy: a
// refused one adds to the run of refusals, an admitted one ends it.
func (a *admitter) tally(admitted bool) {
	if admitted {
		a.refusals = 0
		return
	}
	a.refusals = min(a.refusals+1, laneAfter)
}

// awaitTurn waits for the connection's turn when it is refusal-heavy, not
// in its turn, the hub is not shutting down (then every line gets E906 at
// once) and the lane is in force. It gives up once the Server stops, or
// when no turn has ended for the lane's stuck time. It reports whether it
// waited.
func (a *admitter) awaitTurn() (waited bool) {
	if a.refusals < laneAfter || a.inTurn || a.srv.serving.inShutdown.Load() || !a.srv.laneInForce() {
		return false
	}
	l := &a.srv.lane
	select {
	case l.turn <- struct{}{}:
		a.inTurn = true
		return false
	default:
	}
	l.waiting.Add(1)
	defer l.waiting.Add(-1)
	timer := time.NewTimer(l.stuck)
	defer timer.Stop()
	seen := l.ended.Load()
	for {
		select {
		case l.turn <- struct{}{}:
			a.inTurn = true
			return true
		case <-a.srv.serving.stopping:
			return true
		case <-timer.C:
			ended := l.ended.Load()
			if ended == seen {
				return true
			}
			seen = ended
			timer.Reset(l.stuck)
		}
	}
}

// endTurn ends the connection's turn, if it has one, after lanePause.
func (a *admitter) endTurn() {
	if a.inTurn {
		time.Sleep(lanePause)
		a.leaveLane()
	}
}

// leaveLane gives the connection's turn back, if it has one.
func (a *admitter) leaveLane() {
	if a.inTurn {
		a.inTurn = false
		a.srv.lane.ended.Add(1)
		<-a.srv.lane.turn
	}
}

// laneInForce reports whether refusal-heavy connections take turns now:
// the hub has calls in flight, or had within laneCallsRecent. The time of
// the calls seen is written at most once a millisecond, so the
// connections asking do not all write one word.
func (s *Server) laneInForce() bool {
	now := time.Now().UnixNano()
	last := s.lane.callsAt.Load()
	if s.table.callsInFlight() {
		if now-last > int64(time.Millisecond) {
			s.lane.callsAt.Store(now)
		}
		return true
	}
	return now-last < int64(laneCallsRecent)
}
