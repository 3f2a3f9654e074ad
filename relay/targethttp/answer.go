package targethttp

import (
	"bytes"
	"net/http"
	"strconv"

	"github.com/valyala/fastjson"

	"github.com/relayhub/relayhub/relay/protocol"
)

// answerParsers hold the JSON parsers of target answers: fastjson parses
// in place, without reflection or allocation, where encoding/json took a
// tenth of a call's CPU.
var answerParsers fastjson.ParserPool

// DecodeAnswer classifies a target's HTTP answer, given its status and body,
// into the response code and message the client gets (docs/PROTOCOL.md,
// "Target protocol"):
//
//   - 200 with a JSON object whose "code" is 0000, Bnnn or Ennn: that code and
//     the object's "message", relayed as they are;
//   - 4xx: E400;
//   - 5xx, a 200 body that is not such JSON, a code of another form, or any
//     other status: E500; a 200 that is not such JSON is in doubt, and its
//     message ends "; outcome unknown".
//
// The returned message is raw (the response writer cleans and caps it) and
// never aliases body. It never panics, whatever the body.
func DecodeAnswer(status int, body []byte) (code string, msg []byte) {
	code, msg, _ = decodeAnswer(status, body)
	return code, msg
}

// decodeAnswer is DecodeAnswer, and reports a 200 whose body is not the
// target protocol: the target took the request, but what it did is unknown.
func decodeAnswer(status int, body []byte) (code string, msg []byte, malformed bool) {
	p := answerParsers.Get()
	defer answerParsers.Put(p)
	a := parseAnswer(p, body)
	switch {
	case status == http.StatusOK:
		if !a.valid || a.code == nil {
			return protocol.CodeTargetFailed, withSuffix(msgNotProtocol, AnswerPartlyRead), true
		}
		if !protocol.ValidTargetCode(a.code) {
			return protocol.CodeTargetFailed, withSuffix(msgBadTargetCode, AnswerPartlyRead), true
		}
		return targetCode(a.code), bytes.Clone(a.message), false
	case status >= 400 && status <= 499:
		return protocol.CodeRefused, statusMessage("target refused the request: HTTP ", status, a.message), false
	case status >= 500 && status <= 599:
		return protocol.CodeTargetFailed, statusMessage("target failed: HTTP ", status, a.message), false
	default:
		return protocol.CodeTargetFailed, statusMessage("target answered unexpected HTTP ", status, nil), false
	}
}

// targetAnswer is what parseAnswer read of a target's JSON answer. Its
// slices point into the parser's memory.
type targetAnswer struct {
	valid   bool   // the body is JSON, and "code" and "message" are strings when present
	code    []byte // nil when absent or null
	message []byte // empty when absent or null
}

// parseAnswer reads body as a target's JSON answer, {"code": "...",
// "message": "..."}. Other members are ignored; a body that is not JSON, a
// JSON value that is not an object, or a "code" or "message" that is
// neither a string nor null is not valid.
func parseAnswer(p *fastjson.Parser, body []byte) targetAnswer {
	v, err := p.ParseBytes(body)
	if err != nil {
		return targetAnswer{}
	}
	obj, err := v.Object()
	if err != nil {
		return targetAnswer{valid: v.Type() == fastjson.TypeNull}
	}
	a := targetAnswer{valid: true}
	var ok bool
	if a.code, ok = stringMember(obj, "code"); !ok {
		return targetAnswer{}
	}
	if a.message, ok = stringMember(obj, "message"); !ok {
		return targetAnswer{}
	}
	return a
}

// stringMember returns the string member key of obj, nil when it is absent
// or null; ok is false when it is of another type.
func stringMember(obj *fastjson.Object, key string) (_ []byte, ok bool) {
	v := obj.Get(key)
	if v == nil || v.Type() == fastjson.TypeNull {
		return nil, true
	}
	b, err := v.StringBytes()
	return b, err == nil
}

// targetCode returns code, valid, as a string: 0000 without allocating.
func targetCode(code []byte) string {
	if string(code) == protocol.CodeOK {
		return protocol.CodeOK
	}
	return string(code)
}

// statusMessage builds "<head><status>" and appends ": <detail>" when the
// target explained itself in a JSON message.
func statusMessage(head string, status int, detail []byte) []byte {
	b := make([]byte, 0, len(head)+3+2+len(detail))
	b = append(b, head...)
	b = strconv.AppendInt(b, int64(status), 10)
	if len(detail) > 0 {
		b = append(b, ": "...)
		b = append(b, detail...)
	}
	return b
}
