package fleet

import (
	"errors"
	"strconv"
	"strings"

	"github.com/relayhub/relayhub/relay/protocol"
)

// maxMessageBytes bounds a change message. The fleet's own are well under
// 200 bytes; anything longer is not one of them and is dropped unread.
const maxMessageBytes = 512

// messageVersion opens every change message, so that a later format can be
// told apart.
const messageVersion = "v1"

// message is one change announced on Channel:
//
//	v1|TARGET|EPOCH|KIND|HUB|STAMP_US
//
// A message is only a hint that a target's state changed: the receiver
// reads the state from the store before it acts, so a forged, stale or
// garbled message can make a hub read, never change its breaker. It is a
// plain value.
type message struct {
	target string
	epoch  int64
	kind   string
	hub    string
	// stamp is the sender's wall clock at the change, in µs since the Unix
	// epoch: the start of the propagation lag.
	stamp int64
}

// messageKinds are the kinds a message may have: a change of results, or
// an operator's action.
var messageKinds = map[string]bool{
	"open": true, "close": true,
	"operator-open": true, "operator-close": true, "operator-disable": true, "operator-enable": true,
}

// errBadMessage is a message that is not a change message of the fleet.
var errBadMessage = errors.New("fleet: not a change message")

// parseMessage reads a change message. It never panics, whatever the
// bytes, and refuses anything that is not exactly a message of the fleet.
func parseMessage(s string) (message, error) {
	if len(s) > maxMessageBytes {
		return message{}, errBadMessage
	}
	parts := strings.Split(s, "|")
	if len(parts) != 6 || parts[0] != messageVersion {
		return message{}, errBadMessage
	}
	m := message{target: parts[1], kind: parts[3], hub: parts[4]}
	var err1, err2 error
	m.epoch, err1 = strconv.ParseInt(parts[2], 10, 64)
	m.stamp, err2 = strconv.ParseInt(parts[5], 10, 64)
	if err1 != nil || err2 != nil || m.epoch <= 0 || m.stamp < 0 || !messageKinds[m.kind] ||
		!ValidName(m.target) || !ValidName(m.hub) {
		return message{}, errBadMessage
	}
	return m, nil
}

// format returns m as it travels on Channel. The scripts build the same
// text in Lua; tests use this one.
func (m message) format() string {
	return strings.Join([]string{messageVersion, m.target, strconv.FormatInt(m.epoch, 10), m.kind, m.hub, strconv.FormatInt(m.stamp, 10)}, "|")
}

// ValidName reports whether s can name a hub or a target in the store: 1
// to 64 characters of A-Z a-z 0-9 . _ : -, the rule of a transaction id.
func ValidName(s string) bool {
	return protocol.ValidTxID([]byte(s))
}
