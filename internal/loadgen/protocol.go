package loadgen

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Protocol is what a load run speaks on its connections. Besides the
// hub's own line protocol, a Generator can drive two reference servers with
// the same connections, depth, pacing and histogram, so a benchmark
// compares servers rather than load generators: redis answering inline
// PING, and a target (a fixture) spoken to directly over HTTP/1.1
// keep-alive.
type Protocol uint8

const (
	// ProtocolRelay is the hub's line protocol; answers are matched by TXID
	// and may come back in any order.
	ProtocolRelay Protocol = iota
	// ProtocolRedisPing sends the inline command PING; redis answers in
	// order, +PONG, so answers are matched to requests by position.
	ProtocolRedisPing
	// ProtocolHTTP posts each payload to /tx as the hub does (docs/PROTOCOL.md, "Target protocol"), with
	// requests pipelined when the depth is above 1; HTTP/1.1 answers in
	// order, so they are matched by position.
	ProtocolHTTP
)

// protocolNames are the names of the protocols, in Protocol order.
var protocolNames = [...]string{"relay", "redis-ping", "http"}

// String returns the protocol's name, as ParseProtocol reads it.
func (p Protocol) String() string { return protocolNames[p] }

// ParseProtocol reads a protocol's name: relay, redis-ping or http, in any
// case.
func ParseProtocol(s string) (Protocol, error) {
	for i, n := range protocolNames {
		if strings.EqualFold(s, n) {
			return Protocol(i), nil
		}
	}
	return 0, fmt.Errorf("protocol %q: want one of %s", s, strings.Join(protocolNames[:], ", "))
}

// inOrder reports whether the server answers requests in the order they
// were sent, which is how its answers are matched.
func (p Protocol) inOrder() bool { return p != ProtocolRelay }

// pingRequest is the whole request of ProtocolRedisPing: an inline command.
const pingRequest = "PING\r\n"

// parseRedisReply reads the answer code of a one-line redis reply: the word
// after '+' of a status reply ("+PONG" gives PONG) or after '-' of an error
// reply ("-ERR unknown command" gives ERR). ok is false for anything else,
// such as a bulk reply, which PING never gets.
func parseRedisReply(line []byte) (code []byte, ok bool) {
	line = bytes.TrimSuffix(line, []byte{'\n'})
	line = bytes.TrimSuffix(line, []byte{'\r'})
	if len(line) < 2 || (line[0] != '+' && line[0] != '-') {
		return nil, false
	}
	word := line[1:]
	if i := bytes.IndexByte(word, ' '); i >= 0 {
		word = word[:i]
	}
	return word, len(word) > 0
}

// appendHTTPRequest appends a keep-alive POST of payload to /tx on host, in
// the shape the hub sends its targets (docs/PROTOCOL.md, "Target protocol"), to b.
func appendHTTPRequest(b []byte, host string, txid, payload []byte) []byte {
	b = append(b, "POST /tx HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\nX-Tx-Id: "...)
	b = append(b, txid...)
	b = append(b, "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(payload)), 10)
	b = append(b, "\r\n\r\n"...)
	return append(b, payload...)
}

// httpAnswerCode returns the code a target's HTTP answer stands for: for a
// 200 the "code" of its JSON body when it is four characters long, as a
// healthy target sends (docs/PROTOCOL.md, "Target protocol"); otherwise "HTTP" and the status, such as
// HTTP500, or HTTP200 for a body without a code. It scans for the field
// rather than decoding the body, so the generator spends little of the
// machine on it.
func httpAnswerCode(status int, body []byte) []byte {
	if status == http.StatusOK {
		if code, ok := jsonCodeField(body); ok {
			return code
		}
	}
	return strconv.AppendInt([]byte("HTTP"), int64(status), 10)
}

// jsonCodeField finds "code":"xxxx" in a compact or spaced JSON object and
// returns xxxx when it is four characters without escapes.
func jsonCodeField(body []byte) ([]byte, bool) {
	const key = `"code"`
	i := bytes.Index(body, []byte(key))
	if i < 0 {
		return nil, false
	}
	rest := bytes.TrimLeft(body[i+len(key):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return nil, false
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	if len(rest) < 6 || rest[0] != '"' || rest[5] != '"' {
		return nil, false
	}
	code := rest[1:5]
	if bytes.IndexByte(code, '\\') >= 0 {
		return nil, false
	}
	return code, true
}
