package reconcile

import (
	"encoding/json"
	"time"
	"unicode/utf8"

	"github.com/valyala/fastjson"
)

// fastParsers hold the parsers of fastEntry: a hub's start reads its whole
// journal, a million lines or more, and encoding/json's reflection took
// most of that time.
var fastParsers fastjson.ParserPool

// fastEntry reads line, a journal line as hubs write it, without
// reflection. ok is false for any line it cannot read exactly as
// json.Unmarshal into Entry would (not an object, a member of another
// type, a key json would match case-insensitively or twice, invalid
// UTF-8, an unusual time): parseEntry then reads it the slow way, which
// also says what is wrong.
func fastEntry(line []byte, strs *interner) (e Entry, ok bool) {
	// fastjson takes some JSON that encoding/json refuses (a \0 escape, a
	// raw control character): json.Valid's scan, which allocates nothing,
	// keeps those for json.Unmarshal to refuse.
	if !utf8.Valid(line) || !json.Valid(line) {
		return Entry{}, false
	}
	p := fastParsers.Get()
	defer fastParsers.Put(p)
	v, err := p.ParseBytes(line)
	if err != nil {
		return Entry{}, false
	}
	obj, err := v.Object()
	if err != nil {
		return Entry{}, false
	}
	ok = true
	seen := 0
	obj.Visit(func(key []byte, v *fastjson.Value) {
		if ok {
			ok = e.setMember(key, v, &seen, strs)
		}
	})
	return e, ok
}

// Bits of the members setMember has seen, so that a repeated one falls
// back to encoding/json, which keeps the last.
const (
	seenTime = 1 << iota
	seenFile
	seenLine
	seenHub
	seenTxID
	seenTarget
	seenURL
	seenCode
	seenStage
	seenBytesSent
	seenPayload
	seenVia
)

// setMember sets the member key of e to v; false when the key or its value
// is not one fastEntry can take.
func (e *Entry) setMember(key []byte, v *fastjson.Value, seen *int, strs *interner) bool {
	var bit int
	var dst *string
	repeats := true // a value many lines share: hub, target, url, ...
	switch string(key) {
	case "time":
		bit = seenTime
	case "line", "bytes_sent":
		return e.setNumber(string(key), v, seen)
	case "file":
		bit, dst = seenFile, &e.File
	case "hub":
		bit, dst = seenHub, &e.Hub
	case "txid":
		bit, dst, repeats = seenTxID, &e.TxID, false
	case "target":
		bit, dst = seenTarget, &e.Target
	case "url":
		bit, dst = seenURL, &e.URL
	case "code":
		bit, dst = seenCode, &e.Code
	case "stage":
		bit, dst = seenStage, &e.Stage
	case "payload_sha256":
		bit, dst, repeats = seenPayload, &e.PayloadSHA256, false
	case "via":
		bit, dst = seenVia, &e.Via
	default:
		return false // unknown to Entry, or a case variant json would match
	}
	if *seen&bit != 0 || v.Type() != fastjson.TypeString {
		return false
	}
	*seen |= bit
	s, _ := v.StringBytes()
	switch {
	case dst != nil && repeats:
		*dst = strs.get(s)
		return true
	case dst != nil:
		*dst = string(s)
		return true
	}
	t, err := time.Parse(time.RFC3339Nano, string(s))
	e.Time = t
	return err == nil
}

// setNumber sets line or bytes_sent from v, a whole number.
func (e *Entry) setNumber(key string, v *fastjson.Value, seen *int) bool {
	bit, dst := seenLine, (*int64)(nil)
	if key == "bytes_sent" {
		bit, dst = seenBytesSent, &e.BytesSent
	}
	if *seen&bit != 0 || v.Type() != fastjson.TypeNumber {
		return false
	}
	*seen |= bit
	n, err := v.Int64()
	if err != nil {
		return false
	}
	if dst != nil {
		*dst = n
	} else {
		e.Line = int(n)
	}
	return true
}

// interner hands out one string for each of the values that repeat from
// line to line (a hub's name, a target's, its URL, a stage), so that a
// journal of a million lines does not hold a million copies of them. It
// keeps at most maxInterned. Not safe for concurrent use.
type interner struct {
	m map[string]string
}

// maxInterned bounds an interner: a journal names a few hubs, targets,
// URLs, codes and stages.
const maxInterned = 4096

// get returns b as a string, the one kept when there is one.
func (in *interner) get(b []byte) string {
	if s, ok := in.m[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(in.m) < maxInterned {
		in.m[s] = s
	}
	return s
}
