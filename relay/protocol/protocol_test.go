package protocol

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseRequest(t *testing.T) {
	long64 := strings.Repeat("a", 64)
	tests := []struct {
		name    string
		line    string
		want    Request
		errTxID string // "" when the error's TXID must be unreadable
		errMsg  string // "" when no error is expected
	}{
		{name: "simple", line: "TX1|CORE|BAL 1", want: req("TX1", "CORE", "BAL 1")},
		{name: "payload with pipes", line: "TX1|CORE|a|b||c|", want: req("TX1", "CORE", "a|b||c|")},
		{name: "empty payload", line: "TX1|CLAIM|", want: req("TX1", "CLAIM", "")},
		{name: "txid of 64", line: long64 + "|CORE|x", want: req(long64, "CORE", "x")},
		{name: "txid alphabet", line: "AZaz09._:-|CORE|x", want: req("AZaz09._:-", "CORE", "x")},
		{name: "payload with control bytes", line: "T|CORE|\x00\t\xff", want: req("T", "CORE", "\x00\t\xff")},
		{name: "target any bytes", line: "T|co re|x", want: req("T", "co re", "x")},

		{name: "empty line", line: "", errMsg: MsgMissingFields},
		{name: "no pipe", line: "TX1", errMsg: MsgMissingFields},
		{name: "one pipe", line: "TX1|CORE", errTxID: "TX1", errMsg: MsgMissingFields},
		{name: "one pipe bad txid", line: "T X|CORE", errMsg: MsgBadTxID},
		{name: "empty txid", line: "|CORE|x", errMsg: MsgBadTxID},
		{name: "txid of 65", line: long64 + "a|CORE|x", errMsg: MsgBadTxID},
		{name: "txid with space", line: "TX 1|CORE|x", errMsg: MsgBadTxID},
		{name: "txid with slash", line: "TX/1|CORE|x", errMsg: MsgBadTxID},
		{name: "txid with utf8", line: "TXé|CORE|x", errMsg: MsgBadTxID},
		{name: "txid with cr", line: "TX\r|CORE|x", errMsg: MsgBadTxID},
		{name: "empty target", line: "TX1||x", errTxID: "TX1", errMsg: MsgEmptyTarget},
		{name: "only pipes", line: "||", errMsg: MsgBadTxID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRequest([]byte(tt.line))
			if tt.errMsg == "" {
				require.NoError(t, err)
				assert.Equal(t, string(tt.want.TxID), string(got.TxID))
				assert.Equal(t, string(tt.want.Target), string(got.Target))
				assert.Equal(t, string(tt.want.Payload), string(got.Payload))
				return
			}
			var pe *ProtocolError
			require.True(t, errors.As(err, &pe), "want *ProtocolError, got %v", err)
			assert.Equal(t, CodeMalformed, pe.Code)
			assert.Equal(t, tt.errMsg, pe.Message)
			assert.Equal(t, tt.errTxID, pe.TxID)
			assert.Equal(t, Request{}, got)
		})
	}
}

func req(txid, target, payload string) Request {
	return Request{TxID: []byte(txid), Target: []byte(target), Payload: []byte(payload)}
}

func TestParseRequestDoesNotAllocate(t *testing.T) {
	line := []byte("TX-000123|CORE|XFER 1001 1002 2500")
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := ParseRequest(line); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs)
}

func TestProtocolErrorMessage(t *testing.T) {
	_, err := ParseRequest([]byte("TX1|CORE"))
	assert.EqualError(t, err, "relay: protocol: TX1: E900 "+MsgMissingFields)
	_, err = ParseRequest([]byte("nonsense"))
	assert.EqualError(t, err, "relay: protocol: -: E900 "+MsgMissingFields)
}

func TestLeadingTxID(t *testing.T) {
	tests := []struct {
		name  string
		start string
		want  string
	}{
		{name: "valid", start: "TX1|CORE|xxxxxxxx", want: "TX1"},
		{name: "64 chars", start: strings.Repeat("z", 64) + "|", want: strings.Repeat("z", 64)},
		{name: "65 chars", start: strings.Repeat("z", 65) + "|", want: ""},
		{name: "no pipe", start: strings.Repeat("z", 300), want: ""},
		{name: "bad char", start: "T X|CORE", want: ""},
		{name: "empty", start: "", want: ""},
		{name: "pipe first", start: "|CORE|x", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, string(LeadingTxID([]byte(tt.start))))
		})
	}
}

func TestParseFailureCode(t *testing.T) {
	const (
		wantEnnn = `want E400, E500, E901, E902, or a target's own code from E000 to E899`
		hubRange = `E900 to E999 are the hub's own codes`
	)
	tests := []struct {
		in, want, err string
	}{
		{in: "E500", want: "E500"},
		{in: "E400", want: "E400"},
		{in: "E901", want: "E901"},
		{in: "E902", want: "E902"},
		{in: " e902 ", want: "E902"},
		{in: "E000", want: "E000"},
		{in: "E610", want: "E610"},
		{in: "E899", want: "E899"},
		{in: "E900", err: hubRange},
		{in: "E903", err: hubRange},
		{in: "E904", err: hubRange},
		{in: "E907", err: hubRange},
		{in: "E908", err: hubRange},
		{in: "E999", err: hubRange},
		{in: "0000", err: wantEnnn},
		{in: "B201", err: wantEnnn},
		{in: "E5OO", err: wantEnnn},
		{in: "E50", err: wantEnnn},
		{in: "E5000", err: wantEnnn},
		{in: "", err: wantEnnn},
		{in: "X1", err: wantEnnn},
	}
	for _, tt := range tests {
		t.Run(cmp.Or(tt.in, "empty"), func(t *testing.T) {
			got, err := ParseFailureCode(tt.in)
			if tt.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.err)
				assert.Contains(t, err.Error(), `failure code "`+tt.in+`"`, "the error quotes the code as given")
				assert.Contains(t, err.Error(), wantEnnn, "the error names the accepted codes")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestAppendResponse(t *testing.T) {
	tests := []struct {
		name string
		txid string
		code string
		msg  string
		want string
	}{
		{name: "plain", txid: "TX1", code: "0000", msg: "balance=99500", want: "TX1|0000|balance=99500\n"},
		{name: "no txid", txid: "", code: "E900", msg: "line too long", want: "-|E900|line too long\n"},
		{name: "empty message", txid: "T", code: "B201", msg: "", want: "T|B201|\n"},
		{name: "injected line", txid: "T", code: "0000", msg: "ok\r\nT2|0000|forged", want: "T|0000|ok  T2|0000|forged\n"},
		{name: "control bytes", txid: "T", code: "0000", msg: "a\x00b\tc\x1fd\x7fe", want: "T|0000|a b c d e\n"},
		{name: "pipes kept", txid: "T", code: "0000", msg: "a|b", want: "T|0000|a|b\n"},
		{name: "utf8 kept", txid: "T", code: "B201", msg: "solde insuffisant: 5 €", want: "T|B201|solde insuffisant: 5 €\n"},
		{name: "dirty txid and code", txid: "T\n", code: "E\r00", msg: "m", want: "T |E 00|m\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendResponse([]byte("prefix:"), []byte(tt.txid), tt.code, []byte(tt.msg))
			assert.Equal(t, "prefix:"+tt.want, string(got))
		})
	}
}

func TestAppendResponseTailAfterAValidTxIDIsTheResponse(t *testing.T) {
	for _, msg := range []string{"circuit open; retry after 7s", "", "a\r\nb\x00", strings.Repeat("€", MaxMessageBytes)} {
		txid := []byte("TX-1._:z")
		require.True(t, ValidTxID(txid))
		tail := AppendResponseTail(nil, CodeCircuitOpen, msg)
		assert.Equal(t, string(AppendResponse(nil, txid, CodeCircuitOpen, msg)), string(append(txid, tail...)))
	}
}

func TestAppendResponseCapsMessage(t *testing.T) {
	t.Run("ascii", func(t *testing.T) {
		got := AppendResponse(nil, []byte("T"), "E500", bytes.Repeat([]byte("x"), 10000))
		assert.Equal(t, "T|E500|"+strings.Repeat("x", MaxMessageBytes)+"\n", string(got))
	})
	t.Run("cut at a rune boundary", func(t *testing.T) {
		// 511 ASCII bytes then a 3-byte rune: the rune would end past the
		// cap, so it is dropped whole.
		msg := strings.Repeat("x", MaxMessageBytes-1) + "€€"
		got := AppendResponse(nil, []byte("T"), "E500", []byte(msg))
		body := strings.TrimSuffix(strings.TrimPrefix(string(got), "T|E500|"), "\n")
		assert.Equal(t, strings.Repeat("x", MaxMessageBytes-1), body)
		assert.True(t, utf8.ValidString(body))
	})
	t.Run("invalid utf8 cut at the cap", func(t *testing.T) {
		msg := bytes.Repeat([]byte{0x80}, 1000)
		got := AppendResponse(nil, []byte("T"), "E500", msg)
		assert.Len(t, got, len("T|E500|")+MaxMessageBytes+1)
	})
}

func TestAppendResponseDoesNotAllocate(t *testing.T) {
	buf := make([]byte, 0, 256)
	txid, msg := []byte("TX-000123"), []byte("balance=99500")
	allocs := testing.AllocsPerRun(100, func() {
		buf = AppendResponse(buf[:0], txid, "0000", msg)
	})
	assert.Zero(t, allocs)
}

func TestParseResponse(t *testing.T) {
	tests := []struct {
		name            string
		line            string
		txid, code, msg string
		wantErr         bool
	}{
		{name: "plain", line: "T1|0000|balance=99500\n", txid: "T1", code: "0000", msg: "balance=99500"},
		{name: "crlf", line: "T1|B201|insufficient funds\r\n", txid: "T1", code: "B201", msg: "insufficient funds"},
		{name: "no line ending", line: "T1|E904|circuit open; retry after 7s", txid: "T1", code: "E904", msg: "circuit open; retry after 7s"},
		{name: "message holds separators", line: "T1|0000|a|b|c\n", txid: "T1", code: "0000", msg: "a|b|c"},
		{name: "message holds empty fields", line: "T1|0000|a||c|\n", txid: "T1", code: "0000", msg: "a||c|"},
		{name: "empty message", line: "T1|0000|\n", txid: "T1", code: "0000", msg: ""},
		{name: "unreadable txid", line: "-|E900|line too long\n", txid: "-", code: "E900", msg: "line too long"},
		{name: "shape only", line: "T X|nope|m\n", txid: "T X", code: "nope", msg: "m"},
		{name: "only the last ending dropped", line: "T1|0000|x\n\n", txid: "T1", code: "0000", msg: "x\n"},
		{name: "lone cr dropped", line: "T1|0000|x\r", txid: "T1", code: "0000", msg: "x"},

		{name: "one separator", line: "T1|0000\n", wantErr: true},
		{name: "no separator", line: "garbage\n", wantErr: true},
		{name: "empty txid", line: "|0000|ok\n", wantErr: true},
		{name: "empty code", line: "T1||ok\n", wantErr: true},
		{name: "only separators", line: "||", wantErr: true},
		{name: "blank", line: "\n", wantErr: true},
		{name: "empty", line: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseResponse([]byte(tt.line))
			if tt.wantErr {
				require.ErrorIs(t, err, ErrMalformedResponse)
				assert.Equal(t, Response{}, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.txid, string(got.TxID))
			assert.Equal(t, tt.code, string(got.Code))
			assert.Equal(t, tt.msg, string(got.Message))
		})
	}
}

func TestParseResponseReadsWhatAppendResponseWrites(t *testing.T) {
	tests := []struct {
		name                    string
		txid, code, msg         string
		wantTxID, wantCode, out string
	}{
		{name: "plain", txid: "TX1", code: CodeOK, msg: "balance=99500", wantTxID: "TX1", wantCode: CodeOK, out: "balance=99500"},
		{name: "no txid", txid: "", code: CodeMalformed, msg: MsgLineTooLong, wantTxID: NoTxID, wantCode: CodeMalformed, out: MsgLineTooLong},
		{name: "pipes in message", txid: "T", code: CodeOK, msg: "a|b", wantTxID: "T", wantCode: CodeOK, out: "a|b"},
		{name: "injected line", txid: "T", code: CodeOK, msg: "ok\r\nT2|0000|forged", wantTxID: "T", wantCode: CodeOK, out: "ok  T2|0000|forged"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseResponse(AppendResponse(nil, tt.txid, tt.code, tt.msg))
			require.NoError(t, err)
			assert.Equal(t, tt.wantTxID, string(got.TxID))
			assert.Equal(t, tt.wantCode, string(got.Code))
			assert.Equal(t, tt.out, string(got.Message))
		})
	}
}

func TestParseResponseDoesNotAllocate(t *testing.T) {
	good, bad := []byte("L12-345678|0000|balance=99500\n"), []byte("garbage\n")
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := ParseResponse(good); err != nil {
			t.Fatal(err)
		}
		if _, err := ParseResponse(bad); err == nil {
			t.Fatal("garbage accepted")
		}
	})
	assert.Zero(t, allocs)
}

func ExampleParseResponse() {
	r, err := ParseResponse([]byte("TX1|B201|insufficient funds\n"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s %s %q\n", r.TxID, r.Code, r.Message)
	_, err = ParseResponse([]byte("TX1|0000\n"))
	fmt.Println(errors.Is(err, ErrMalformedResponse))
	// Output:
	// TX1 B201 "insufficient funds"
	// true
}

// FuzzParseRequest checks that ParseRequest never panics, that what it
// accepts is a valid TXID, a non-empty target and the exact rest of the line,
// and that what it refuses carries a readable TXID only when it is valid.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		"TX1|CORE|BAL 1", "TX1|CORE|", "TX1|CORE", "|CORE|x", "TX1||x", "", "||",
		"a|b|c|d|e", strings.Repeat("a", 65) + "|CORE|x", "T\x00|CORE|x", "T|\xff|\xfe",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := ParseRequest(line)
		if err != nil {
			var pe *ProtocolError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not a *ProtocolError", err)
			}
			if pe.Code != CodeMalformed {
				t.Fatalf("code %q, want E900", pe.Code)
			}
			if pe.TxID != "" && !ValidTxID([]byte(pe.TxID)) {
				t.Fatalf("refused line reports invalid TXID %q", pe.TxID)
			}
			out := AppendResponse(nil, []byte(pe.TxID), pe.Code, []byte(pe.Message))
			checkOneLine(t, out)
			return
		}
		if !ValidTxID(r.TxID) {
			t.Fatalf("accepted invalid TXID %q", r.TxID)
		}
		if len(r.Target) == 0 || bytes.IndexByte(r.Target, '|') >= 0 {
			t.Fatalf("accepted target %q", r.Target)
		}
		rebuilt := string(r.TxID) + "|" + string(r.Target) + "|" + string(r.Payload)
		if rebuilt != string(line) {
			t.Fatalf("fields %q do not rebuild line %q", rebuilt, line)
		}
	})
}

// FuzzParseResponse checks that ParseResponse never panics, and that what
// it accepts is a non-empty TXID and CODE without '|' and a message that,
// joined to them, rebuild the line less its ending.
func FuzzParseResponse(f *testing.F) {
	for _, s := range []string{
		"T1|0000|ok\n", "T1|B201|no\r\n", "T1|0000|a|b|c", "-|E900|line too long\n",
		"T1|0000\n", "|0000|x", "T1||x", "", "\n", "\r\n", "||", "T|C|\r\r\n", "T|C|\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := ParseResponse(line)
		if err != nil {
			if !errors.Is(err, ErrMalformedResponse) {
				t.Fatalf("error %v is not ErrMalformedResponse", err)
			}
			return
		}
		for _, field := range [][]byte{r.TxID, r.Code} {
			if len(field) == 0 || bytes.IndexByte(field, '|') >= 0 {
				t.Fatalf("accepted TXID %q, code %q", r.TxID, r.Code)
			}
		}
		rebuilt := string(r.TxID) + "|" + string(r.Code) + "|" + string(r.Message)
		body := strings.TrimSuffix(strings.TrimSuffix(string(line), "\n"), "\r")
		if rebuilt != body {
			t.Fatalf("fields %q do not rebuild line %q", rebuilt, line)
		}
	})
}

// FuzzResponseRoundTrip checks that ParseResponse reads back what
// AppendResponse writes: the TXID ("-" for none) and code cleaned of
// control characters, and the message as AppendMessage writes it.
func FuzzResponseRoundTrip(f *testing.F) {
	f.Add([]byte("TX1"), "0000", []byte("balance=99500"))
	f.Add([]byte(""), "E900", []byte("line too long"))
	f.Add([]byte("T"), "B201", []byte("a|b\r\nT2|0000|forged"))
	f.Add([]byte("T\n"), "E\r00", []byte("\x00\x7f"))
	f.Add([]byte("T"), "E500", bytes.Repeat([]byte("€"), MaxMessageBytes))
	f.Fuzz(func(t *testing.T, txid []byte, code string, msg []byte) {
		if code == "" || bytes.IndexByte(txid, '|') >= 0 || strings.IndexByte(code, '|') >= 0 {
			t.Skip("a TXID or CODE holding '|', or an empty CODE, cannot be read back")
		}
		out := AppendResponse(nil, txid, code, msg)
		checkOneLine(t, out)
		r, err := ParseResponse(out)
		if err != nil {
			t.Fatalf("ParseResponse(%q): %v", out, err)
		}
		wantTxID := string(appendClean(nil, txid))
		if len(txid) == 0 {
			wantTxID = NoTxID
		}
		if string(r.TxID) != wantTxID {
			t.Fatalf("TXID %q, want %q", r.TxID, wantTxID)
		}
		if want := string(appendClean(nil, code)); string(r.Code) != want {
			t.Fatalf("code %q, want %q", r.Code, want)
		}
		if want := string(AppendMessage(nil, msg)); string(r.Message) != want {
			t.Fatalf("message %q, want %q", r.Message, want)
		}
	})
}

// checkOneLine fails unless out is exactly one line: one '\n', at its end,
// with no '\r' anywhere.
func checkOneLine(t *testing.T, out []byte) {
	t.Helper()
	if bytes.Count(out, []byte{'\n'}) != 1 || out[len(out)-1] != '\n' || bytes.IndexByte(out, '\r') >= 0 {
		t.Fatalf("answer %q is not exactly one line", out)
	}
}

func BenchmarkParseRequest(b *testing.B) {
	line := []byte("TX-000123|CORE|XFER 1001 1002 2500")
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		if _, err := ParseRequest(line); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendResponse(b *testing.B) {
	buf := make([]byte, 0, 256)
	txid, msg := []byte("TX-000123"), []byte("balance=99500")
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendResponse(buf[:0], txid, "0000", msg)
	}
}

func BenchmarkParseResponse(b *testing.B) {
	line := []byte("TX-000123|0000|balance=99500\n")
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		if _, err := ParseResponse(line); err != nil {
			b.Fatal(err)
		}
	}
}

func TestMatchesTarget(t *testing.T) {
	tests := []struct {
		canonical, name string
		want            bool
	}{
		{"CORE", "CORE", true}, {"CORE", "core", true}, {"CORE", "cOrE", true},
		{"CORE", "COR", false}, {"CORE", "COREX", false}, {"CORE", "C0RE", false},
		{"SK", "\u017fK", false}, // LATIN SMALL LETTER LONG S folds to S in Unicode, not in ASCII
		{"SK", "S\u212a", false}, // KELVIN SIGN folds to K in Unicode, not in ASCII
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, MatchesTarget(tt.canonical, tt.name), tt.name)
		assert.Equal(t, tt.want, MatchesTarget([]byte(tt.canonical), []byte(tt.name)), tt.name)
	}
	assert.Equal(t, "SK", CanonicalTarget("sk"))
	assert.Equal(t, "\u017fK", CanonicalTarget("\u017fk"), "only ASCII letters change case")
	assert.Equal(t, "CORE.2:A_B-C", CanonicalTarget("core.2:a_b-c"))
}

// TestReversedAnswer: a resend of a reversed transaction is answered
// E910 in exactly the documented form, and E910, the hub's own code, is no
// failure code.
func TestReversedAnswer(t *testing.T) {
	assert.Equal(t, "W2|E910|transaction reversed; resend under a new TXID\n",
		string(AppendResponse(nil, "W2", CodeReversed, MsgReversed)))
	_, err := ParseFailureCode(CodeReversed)
	assert.Error(t, err)
}
