package loadgen

import (
	"fmt"
	"strconv"
	"strings"
)

// Placeholders of a payload template.
const (
	placeholderN    = "{n}"    // the request number, 1, 2, 3, ... over the whole run
	placeholderConn = "{conn}" // the connection number, 1 to Config.Conns
)

type segmentKind uint8

const (
	segLiteral segmentKind = iota
	segN
	segConn
)

type segment struct {
	kind segmentKind
	lit  string
}

// Template is a parsed payload template. It is read-only after
// ParseTemplate, so it is safe for concurrent use.
type Template struct {
	segs []segment
}

// ParseTemplate parses a payload template in which {n} stands for the
// request number and {conn} for the connection number. Any other brace is
// literal text. A line break is refused: it would end the request line.
func ParseTemplate(s string) (Template, error) {
	if !ValidPayload(s) {
		return Template{}, fmt.Errorf("payload template %q: holds a line break", s)
	}
	var t Template
	for s != "" {
		i := strings.IndexByte(s, '{')
		if i < 0 {
			t.segs = append(t.segs, segment{kind: segLiteral, lit: s})
			break
		}
		switch rest := s[i:]; {
		case strings.HasPrefix(rest, placeholderN):
			t = t.literal(s[:i])
			t.segs = append(t.segs, segment{kind: segN})
			s = rest[len(placeholderN):]
		case strings.HasPrefix(rest, placeholderConn):
			t = t.literal(s[:i])
			t.segs = append(t.segs, segment{kind: segConn})
			s = rest[len(placeholderConn):]
		default:
			t = t.literal(s[:i+1])
			s = rest[1:]
		}
	}
	return t, nil
}

// literal appends lit, merging it with a literal segment before it.
func (t Template) literal(lit string) Template {
	if lit == "" {
		return t
	}
	if n := len(t.segs); n > 0 && t.segs[n-1].kind == segLiteral {
		t.segs[n-1].lit += lit
		return t
	}
	t.segs = append(t.segs, segment{kind: segLiteral, lit: lit})
	return t
}

// AppendTo appends the payload of request n on connection conn to b.
func (t Template) AppendTo(b []byte, n uint64, conn int) []byte {
	for _, s := range t.segs {
		switch s.kind {
		case segLiteral:
			b = append(b, s.lit...)
		case segN:
			b = strconv.AppendUint(b, n, 10)
		case segConn:
			b = strconv.AppendInt(b, int64(conn), 10)
		}
	}
	return b
}
