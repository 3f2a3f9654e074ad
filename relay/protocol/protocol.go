// Package protocol is the hub's client line protocol as pure functions on
// byte slices: request lines parsed (ParseRequest), response lines written
// (AppendResponse) and read back by clients (ParseResponse), and the
// response codes and the hub's own answer messages that both the hub and
// its target client speak. Nothing here
// touches a connection, so the fuzzers hit it directly. The wire format is
// in docs/PROTOCOL.md, "Client protocol" and "Response codes".
//
// Typical use:
//
//	req, err := protocol.ParseRequest(line)
//	if pe := (*protocol.ProtocolError)(nil); errors.As(err, &pe) {
//		out = protocol.AppendResponse(out, pe.TxID, pe.Code, pe.Message)
//		return
//	}
//	out = protocol.AppendResponse(out, req.TxID, protocol.CodeUnknownTarget, protocol.MsgUnknownTarget)
package protocol

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Response codes of the client protocol (docs/PROTOCOL.md, "Response codes"). Codes a target sends in
// its own answers (0000, Bnnn, Ennn) are relayed as they are and need no
// constant.
const (
	CodeOK             = "0000" // the target processed the transaction
	CodeRefused        = "E400" // the target refused the request (HTTP 4xx)
	CodeTargetFailed   = "E500" // HTTP 5xx, an answer off the target protocol, or the target's own E500
	CodeMalformed      = "E900" // the request line is malformed
	CodeTimeout        = "E901" // no answer from the target in time
	CodeUnreachable    = "E902" // transport failure talking to the target
	CodeUnknownTarget  = "E903" // no such target
	CodeCircuitOpen    = "E904" // the target's breaker refused the call
	CodeBulkheadFull   = "E905" // the target's bulkhead is full
	CodeUnavailable    = "E906" // shutting down or over the connection limit
	CodeInternal       = "E907" // a bug caught at run time
	CodeNotAllowed     = "E908" // the client's certificate does not allow it this target
	CodeTxIDReused     = "E909" // the TXID is remembered with another payload (the duplicate-TXID shield)
	CodeReversed       = "E910" // the transaction in doubt was reversed at the target (the duplicate-TXID shield)
	NoTxID             = "-"    // the TXID of an answer to a line whose TXID could not be read
	MaxTxIDLen         = 64     // the longest TXID
	responseSeparator  = '|'
	responseTerminator = '\n'
)

// MaxMessageBytes caps the MESSAGE of a response line. A target's message
// longer than this is cut (at a UTF-8 boundary) so one chatty target cannot
// make the hub write unbounded lines.
const MaxMessageBytes = 512

// Request is one parsed request line. Its fields are sub-slices of the line
// passed to ParseRequest: they are valid only as long as that line's bytes
// are, and a Request that must outlive them has to be copied. Like the line
// it points into, it may be read from many goroutines but not changed.
type Request struct {
	// TxID is the client's transaction id: 1 to 64 characters of
	// A-Z a-z 0-9 . _ : -.
	TxID []byte
	// Target is the target name as the client wrote it (matched
	// case-insensitively later). Never empty.
	Target []byte
	// Payload is everything after the second '|', byte for byte. It may
	// contain '|' and may be empty.
	Payload []byte
}

// ProtocolError reports a request line the hub cannot accept. It carries what
// the answer needs: the TXID when one could be read, the code and the
// message. It is an immutable value, safe for concurrent use.
type ProtocolError struct {
	// TxID is the line's TXID when it could be read, else empty (the answer
	// then uses "-").
	TxID string
	// Code is the response code, E900 for every malformed line.
	Code string
	// Message is the response message.
	Message string
}

// Error implements error.
func (e *ProtocolError) Error() string {
	txid := e.TxID
	if txid == "" {
		txid = NoTxID
	}
	return "relay: protocol: " + txid + ": " + e.Code + " " + e.Message
}

// Messages of the answers the hub gives without a target's word. Fixed
// strings, so the common refusals answer without formatting.
const (
	MsgInternal      = "internal error; the target may or may not have processed the request"
	MsgTooManyConns  = "too many connections"
	MsgShuttingDown  = "shutting down"
	MsgUnknownTarget = "unknown target"
	MsgBulkheadFull  = "target busy: too many calls in flight"
	MsgHeldOpen      = "circuit open; held open by operator"
	MsgNotAllowed    = "client not allowed to use this target"
	MsgTxIDReused    = "TXID reused with a different payload"
	// MsgStillUnknown answers, with E901, a resend of a transaction in
	// doubt whose outcome the hub could not learn; no call was made.
	MsgStillUnknown = "outcome still unknown; do not resend yet"
	// MsgShieldFull answers, with E906, a new TXID to a shielded target
	// while the shield is full of calls it may not forget; no call was
	// made.
	MsgShieldFull = "shield full of calls in doubt; not sent"
	// MsgReversed answers, with E910, a resend of a transaction in doubt
	// that the hub reversed at the target; no call was made.
	MsgReversed        = "transaction reversed; resend under a new TXID"
	msgCircuitOpenHead = "circuit open; retry after "
)

// AppendRetryHint appends the E904 message "circuit open; retry after Ns",
// N being secs.
func AppendRetryHint(dst []byte, secs int64) []byte {
	dst = append(dst, msgCircuitOpenHead...)
	dst = appendSeconds(dst, secs)
	return append(dst, 's')
}

// Messages of E900 answers. They are fixed strings so an answer to a bad line
// never echoes attacker-chosen bytes other than a valid TXID.
const (
	MsgMissingFields = "malformed line: want TXID|TARGET|PAYLOAD"
	MsgBadTxID       = "malformed line: TXID must be 1 to 64 of A-Z a-z 0-9 . _ : -"
	MsgEmptyTarget   = "malformed line: empty TARGET"
	MsgLineTooLong   = "line too long"
)

// ParseRequest parses one request line, without its line terminator (the
// caller drops the '\n' and a '\r' before it). It does not allocate on
// success: the Request's fields are sub-slices of line. A line it rejects
// gets a *ProtocolError whose TxID is set when the line starts with a valid
// TXID followed by '|'.
func ParseRequest(line []byte) (Request, error) {
	i := bytes.IndexByte(line, '|')
	if i < 0 {
		return Request{}, &ProtocolError{Code: CodeMalformed, Message: MsgMissingFields}
	}
	txid := line[:i]
	if !ValidTxID(txid) {
		return Request{}, &ProtocolError{Code: CodeMalformed, Message: MsgBadTxID}
	}
	rest := line[i+1:]
	j := bytes.IndexByte(rest, '|')
	if j < 0 {
		return Request{}, &ProtocolError{TxID: string(txid), Code: CodeMalformed, Message: MsgMissingFields}
	}
	if j == 0 {
		return Request{}, &ProtocolError{TxID: string(txid), Code: CodeMalformed, Message: MsgEmptyTarget}
	}
	return Request{TxID: txid, Target: rest[:j], Payload: rest[j+1:]}, nil
}

// LeadingTxID returns the TXID at the start of a line (the bytes before the
// first '|') when it is valid, else nil. The connection loop uses it to
// answer an over-long line with its TXID from the part it did read.
func LeadingTxID(start []byte) []byte {
	n := len(start)
	if n > MaxTxIDLen+1 {
		n = MaxTxIDLen + 1
	}
	i := bytes.IndexByte(start[:n], '|')
	if i < 0 || !ValidTxID(start[:i]) {
		return nil
	}
	return start[:i]
}

// ValidTxID reports whether b is a well-formed TXID: 1 to 64 characters of
// A-Z a-z 0-9 . _ : -.
func ValidTxID(b []byte) bool {
	if len(b) == 0 || len(b) > MaxTxIDLen {
		return false
	}
	for _, c := range b {
		if !txidByte[c] {
			return false
		}
	}
	return true
}

// MatchesTarget reports whether name, a target as a client wrote it,
// names the target whose canonical name is canonical (upper case, as
// CanonicalTarget gives it). Only ASCII letters match in either case:
// Unicode case folding would route "ſK" (U+017F) to SK, past any filter in
// front of the hub that compares bytes.
func MatchesTarget[A, B ~string | ~[]byte](canonical A, name B) bool {
	if len(canonical) != len(name) {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c != canonical[i] && upperASCII(c) != canonical[i] {
			return false
		}
	}
	return true
}

// CanonicalTarget returns a target's name in upper case, ASCII letters
// only, so that a name outside the alphabet never becomes one inside it.
func CanonicalTarget(name string) string {
	for i := 0; i < len(name); i++ {
		if c := name[i]; c != upperASCII(c) {
			b := []byte(name)
			for j := i; j < len(b); j++ {
				b[j] = upperASCII(b[j])
			}
			return string(b)
		}
	}
	return name
}

func upperASCII(c byte) byte {
	if 'a' <= c && c <= 'z' {
		return c - 'a' + 'A'
	}
	return c
}

// txidByte is the TXID alphabet as a lookup table, so validating a TXID is
// one load per byte.
var txidByte = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "._:-" {
		t[c] = true
	}
	return t
}()

// AppendResponse appends the response line TXID|CODE|MESSAGE\n to dst and
// returns the extended slice. An empty txid is written as "-". Control
// characters (bytes below 0x20 and 0x7f) in any field become spaces, so the
// result always holds exactly one '\n', at its end, whatever a target put
// in its message; the message is cut to MaxMessageBytes. The TXID and the
// message may be strings (fixed messages, ProtocolError) or byte slices (a
// request's TXID, a target's message), so neither needs a conversion that
// allocates.
func AppendResponse[T, M ~string | ~[]byte](dst []byte, txid T, code string, msg M) []byte {
	if len(txid) == 0 {
		dst = append(dst, NoTxID...)
	} else {
		dst = appendClean(dst, txid)
	}
	return AppendResponseTail(dst, code, msg)
}

// AppendResponseTail appends what AppendResponse writes after the TXID,
// "|CODE|MESSAGE\n", cleaned and cut alike. A TXID that ParseRequest
// accepted needs no cleaning, so a hub answering a run of requests alike
// (refusals) builds the tail once and writes each answer as the request's
// TXID followed by it: the same bytes as AppendResponse.
func AppendResponseTail[M ~string | ~[]byte](dst []byte, code string, msg M) []byte {
	dst = append(dst, responseSeparator)
	dst = appendClean(dst, code)
	dst = append(dst, responseSeparator)
	dst = AppendMessage(dst, msg)
	return append(dst, responseTerminator)
}

// AppendMessage appends msg as AppendResponse writes a MESSAGE: control
// characters become spaces and it is cut to MaxMessageBytes, at a UTF-8
// boundary. Pages and logs that show a target's message use it, so they show
// what the client got.
func AppendMessage[M ~string | ~[]byte](dst []byte, msg M) []byte {
	return appendClean(dst, truncateUTF8(msg, MaxMessageBytes))
}

// truncateUTF8 cuts b to at most n bytes without splitting a UTF-8 sequence
// (when b is valid UTF-8 there); bytes that are not UTF-8 are cut at n.
func truncateUTF8[B ~string | ~[]byte](b B, n int) B {
	if len(b) <= n {
		return b
	}
	cut := n
	for k := 0; k < utf8.UTFMax && cut > 0 && !utf8.RuneStart(b[cut]); k++ {
		cut--
	}
	if !utf8.RuneStart(b[cut]) {
		cut = n
	}
	return b[:cut]
}

// Response is one parsed response line, TXID|CODE|MESSAGE. Its fields are
// sub-slices of the line passed to ParseResponse: they are valid only as
// long as that line's bytes are, and a Response that must outlive them has
// to be copied. Like the line it points into, it may be read from many
// goroutines but not changed.
type Response struct {
	// TxID is the TXID the answer is for, as written: the request's, or "-"
	// when the hub could not read one. Never empty.
	TxID []byte
	// Code is the response code, as written. Never empty.
	Code []byte
	// Message is everything after the second '|', without the line ending.
	// It may contain '|' and may be empty.
	Message []byte
}

// ErrMalformedResponse is returned by ParseResponse for a line that is not
// TXID|CODE|MESSAGE: fewer than two '|', or an empty TXID or CODE.
var ErrMalformedResponse = errors.New("relay: protocol: malformed response line: want TXID|CODE|MESSAGE")

// ParseResponse parses one response line, the client's side of
// AppendResponse. The line may end in its '\n', or "\r\n", or in neither;
// the ending is not part of the message. It checks the shape only, not the
// TXID alphabet or the code set (ValidTxID, ValidTargetCode), so a client
// can tell a line it cannot read from an answer it did not expect. It does
// not allocate: the Response's fields are sub-slices of line, and a line it
// rejects gets ErrMalformedResponse.
func ParseResponse(line []byte) (Response, error) {
	line = bytes.TrimSuffix(line, []byte{responseTerminator})
	line = bytes.TrimSuffix(line, []byte{'\r'})
	i := bytes.IndexByte(line, responseSeparator)
	if i <= 0 {
		return Response{}, ErrMalformedResponse
	}
	rest := line[i+1:]
	j := bytes.IndexByte(rest, responseSeparator)
	if j <= 0 {
		return Response{}, ErrMalformedResponse
	}
	return Response{TxID: line[:i], Code: rest[:j], Message: rest[j+1:]}, nil
}

// ValidTargetCode reports whether code is one a target may send: 0000, Bnnn
// or Ennn with n a decimal digit.
func ValidTargetCode[T ~string | ~[]byte](code T) bool {
	if len(code) != 4 {
		return false
	}
	if string(code) == CodeOK {
		return true
	}
	if code[0] != 'B' && code[0] != 'E' {
		return false
	}
	for i := 1; i < 4; i++ {
		if code[i] < '0' || code[i] > '9' {
			return false
		}
	}
	return true
}

// DefaultFailureCodes are the codes that count as breaker failures when none
// are configured: the target failed, did not answer in time, or could not be
// reached.
var DefaultFailureCodes = [...]string{CodeTargetFailed, CodeTimeout, CodeUnreachable}

// ParseFailureCode checks one failure code (--failure-codes, or a settings
// file's failure_codes) and returns it in canonical form (upper case, spaces
// trimmed). A failure code must be one a target call can end with: E400,
// E500, E901, E902, or a code a target defines itself, Ennn below E900. The
// E9xx range belongs to the hub: E900 and E903 to E910 are answers it gives
// without calling a target, and the rest are reserved for it, so naming any
// of them is refused as a mistake rather than silently never matching.
// 0000 and Bnnn mean the target is healthy and are refused too.
func ParseFailureCode(s string) (string, error) {
	code := strings.ToUpper(strings.TrimSpace(s))
	if len(code) != 4 || code[0] != 'E' || !ValidTargetCode(code) {
		return "", fmt.Errorf("failure code %q: want %s", s, acceptedFailureCodes)
	}
	if code[1] == '9' && code != CodeTimeout && code != CodeUnreachable {
		return "", fmt.Errorf("failure code %q: E900 to E999 are the hub's own codes, and of those only E901 and E902 end a call; want %s", s, acceptedFailureCodes)
	}
	return code, nil
}

// acceptedFailureCodes names what ParseFailureCode accepts, for its errors.
const acceptedFailureCodes = "E400, E500, E901, E902, or a target's own code from E000 to E899"
