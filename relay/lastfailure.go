package relay

import (
	"sync/atomic"
	"time"

	"github.com/relayhub/relayhub/relay/protocol"
)

// Failure is a target's most recent failed call, for status pages: the
// call that ended with one of the target's failure codes last. It is a
// plain value.
type Failure struct {
	// At is when the call ended; zero when the target has had no failed
	// call since the hub started.
	At time.Time
	// Code is the call's response code, one of the target's failure codes.
	Code string
	// Message is the answer's message as a client got it (control
	// characters made spaces, cut to protocol.MaxMessageBytes), without the
	// "via NAME: " of an answer given as a fallback.
	Message string
}

// lastFailure holds a target's most recent failed call. A failure with the
// same code and message as the one held only moves its time, one atomic
// store and no allocation, so a target that fails the same way again and
// again costs its calls nothing more. It is safe for concurrent use: of two
// failures noted at once, either may be the one kept.
type lastFailure struct {
	p atomic.Pointer[failureRecord]
}

// failureRecord is one failure as lastFailure keeps it; only at changes
// once it is published.
type failureRecord struct {
	code string
	raw  string       // the message as the target call returned it
	at   atomic.Int64 // Unix nanoseconds of the latest failure with this code and message
}

// record keeps a failed call that ended at at with code and the message
// msg, as the target call returned it.
func (lf *lastFailure) record(code string, msg []byte, at time.Time) {
	if r := lf.p.Load(); r != nil && r.code == code && r.raw == string(msg) {
		r.at.Store(at.UnixNano())
		return
	}
	r := &failureRecord{code: code, raw: string(msg)}
	r.at.Store(at.UnixNano())
	lf.p.Store(r)
}

// load returns the failure held, cleaned as a client sees it; the zero
// Failure when there is none.
func (lf *lastFailure) load() Failure {
	r := lf.p.Load()
	if r == nil {
		return Failure{}
	}
	return Failure{
		At:      time.Unix(0, r.at.Load()),
		Code:    r.code,
		Message: string(protocol.AppendMessage(nil, r.raw)),
	}
}
