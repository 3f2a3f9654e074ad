package loadgen

import (
	"bytes"
	"strconv"
)

// ValidTarget reports whether s can travel as the TARGET field of a request
// line: not empty, and free of the field separator, spaces and control
// characters. Whether the hub knows the target is for the hub to answer.
func ValidTarget(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '|' || c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

// ValidPayload reports whether s can travel as the PAYLOAD field: anything
// but a line break, which would end the request line early.
func ValidPayload(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' || s[i] == '\r' {
			return false
		}
	}
	return true
}

// CodeSucceeded reports whether an answer code means the target processed
// the transaction: 0000, or a business rejection Bnnn relayed from a healthy
// target.
func CodeSucceeded(code []byte) bool {
	if string(code) == "0000" {
		return true
	}
	return len(code) == 4 && code[0] == 'B' && isDigit(code[1]) && isDigit(code[2]) && isDigit(code[3])
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// appendLoadTxID appends the TXID of a load request, L<conn>-<seq>, to b.
// Both numbers are decimal, so the id stays within the TXID alphabet and
// parseLoadTxID can read it back without allocating.
func appendLoadTxID(b []byte, conn int, seq uint64) []byte {
	b = append(b, 'L')
	b = strconv.AppendInt(b, int64(conn), 10)
	b = append(b, '-')
	return strconv.AppendUint(b, seq, 10)
}

// parseLoadTxID reads back a TXID made by appendLoadTxID. ok is false for
// anything else, including numbers with leading zeros, which
// appendLoadTxID never writes, so every accepted id maps to one request.
func parseLoadTxID(txid []byte) (conn int, seq uint64, ok bool) {
	if len(txid) < 4 || txid[0] != 'L' {
		return 0, 0, false
	}
	dash := bytes.IndexByte(txid, '-')
	if dash < 0 {
		return 0, 0, false
	}
	c, ok := parseDecimal(txid[1:dash])
	if !ok || c > 1<<31 {
		return 0, 0, false
	}
	s, ok := parseDecimal(txid[dash+1:])
	if !ok {
		return 0, 0, false
	}
	return int(c), s, true
}

// parseDecimal parses a canonical unsigned decimal: digits only, no leading
// zero unless the number is 0, at most 19 digits so it cannot overflow.
func parseDecimal(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 19 || (len(b) > 1 && b[0] == '0') {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if !isDigit(c) {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}
