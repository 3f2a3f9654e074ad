// Package reconcile settles in-doubt transactions: calls the hub gave up on
// (E901, E902, E500) after the request may have reached the target. It
// reads the hub's in-doubt journal and asks each target, by
// GET {url}/tx/{txid}, whether it applied the transaction, so an operator
// knows which ones were booked and which were not before anyone retries.
// A transaction the journal itself shows resolved (a hub asked the target
// when the client resent it, and the target had applied it) is settled
// from that line, without a look-up.
//
// Typical use:
//
//	f, err := os.Open("in-doubt.log")
//	if err != nil {
//		return err
//	}
//	defer f.Close()
//	entries, bad, err := reconcile.ReadJournal(f)
//	if err != nil {
//		return err
//	}
//	results := reconcile.New(reconcile.Config{}).Check(ctx, entries)
//	sum := reconcile.Summarize(results, bad)
//	if sum.Unknown > 0 || sum.BadLines > 0 {
//		// someone must look at these by hand
//	}
package reconcile

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"time"

	"github.com/relayhub/relayhub/relay/indoubt"
)

// MaxLineBytes bounds one journal line; a longer one is a bad line. The
// hub's lines are a few hundred bytes.
const MaxLineBytes = 64 << 10

// Stages of a call in the journal: how far it got before its outcome
// became unknown; or, for the resolution stages (the writer's constants,
// package indoubt), how a hub or an operator settled it, or that a hub
// gave up (StageUnresolvedExpired).
const (
	StageRequestPartlySent  = "request_partly_sent"
	StageRequestSent        = "request_sent"
	StageAnswerPartlyRead   = "answer_partly_read"
	StageResolvedApplied    = indoubt.StageResolvedApplied
	StageResolvedNotApplied = indoubt.StageResolvedNotApplied
	StageResolvedReversed   = indoubt.StageResolvedReversed
	StageUnresolvedExpired  = indoubt.StageUnresolvedExpired
)

// Entry is one line of the in-doubt journal: one call whose request may
// have reached the target and whose answer never came, or, with a
// resolution stage (indoubt.IsResolution), its settlement or expiry.
// Fields the journal may gain later are ignored. A plain value.
type Entry struct {
	// File is the journal file the entry was read from, when the journal
	// was read from more than one file (rotated journals); empty otherwise.
	File string `json:"file,omitempty"`
	// Line is the entry's line number in the journal, from 1.
	Line int `json:"line"`
	// Time is when the outcome became unknown, or when it was resolved.
	Time time.Time `json:"time"`
	// Hub is the id of the hub that made the call, or that resolved it.
	Hub string `json:"hub"`
	// TxID is the client's transaction id.
	TxID string `json:"txid"`
	// Target is the target's canonical name.
	Target string `json:"target"`
	// URL is the target's base URL as the hub had it configured.
	URL string `json:"url"`
	// Code is what the client was answered: E901, E902 or E500. For a
	// resolution, the code the target recorded for the transaction.
	Code string `json:"code"`
	// Stage is how far the call got, one of the Stage constants.
	Stage string `json:"stage"`
	// BytesSent is how many request bytes were written to the target.
	BytesSent int64 `json:"bytes_sent"`
	// PayloadSHA256 is the hex SHA-256 of the payload.
	PayloadSHA256 string `json:"payload_sha256"`
	// Via is how a resolution was learnt (indoubt.ViaResend, ...). A
	// resolved_applied line written before the field existed reads as
	// indoubt.ViaResend; empty on in-doubt lines.
	Via string `json:"via,omitempty"`
}

// BadLine is a journal line that could not be read as an entry. A plain
// value.
type BadLine struct {
	// File is the journal file, as Entry.File.
	File  string `json:"file,omitempty"`
	Line  int    `json:"line"`
	Error string `json:"error"`
	// Fragment reports that the line is the start of an entry cut short:
	// a write torn by a full disk or a crash, skipped. Summary counts it
	// apart from the bad lines.
	Fragment bool `json:"fragment,omitempty"`
}

// gzipMagic starts every gzip stream.
var gzipMagic = []byte{0x1f, 0x8b}

// ReadJournal reads the in-doubt journal from r, through gzip when r starts
// as a gzip stream does (a journal logrotate compressed). Blank lines are
// skipped; a line that is not a JSON object with a txid, a target and an
// http or https url — truncated, edited — is returned in bad with its line
// number, and so is a resolution without a code; reading goes on. Stages
// are not checked: a line of a stage this reader does not know is taken
// for a call in doubt, which at worst asks its target once more. err is
// only a read error of r, or of its gzip stream (one cut short, or not
// gzip after all).
//
// A fragment, JSON that ends before its object does (a write torn by a
// full disk or a crash, wherever it is in the file), is returned in bad
// with Fragment set, and so is one that an older hub ran the next entry
// on from: that entry is read all the same. The hub counted the failed
// write. A last line without a newline that is a whole entry is an entry.
func ReadJournal(r io.Reader) (entries []Entry, bad []BadLine, err error) {
	err = scanJournal(r, func(e Entry) { entries = append(entries, e) }, func(b BadLine) { bad = append(bad, b) })
	return entries, bad, err
}

// scanJournal reads the journal from r as ReadJournal does, handing each
// entry to entry and each bad line to badLine, in journal order, keeping
// nothing itself.
func scanJournal(r io.Reader, entry func(Entry), badLine func(BadLine)) error {
	br := bufio.NewReaderSize(r, 64<<10)
	if magic, _ := br.Peek(len(gzipMagic)); bytes.Equal(magic, gzipMagic) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("starts as gzip but is not: %w", err)
		}
		defer zr.Close()
		br = bufio.NewReaderSize(zr, 64<<10)
	}
	var buf []byte
	strs := interner{m: make(map[string]string)}
	for n := 1; ; n++ {
		line, tooLong, err := readLine(br, buf[:0])
		buf = line
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read journal line %d: %w", n, err)
		}
		if errors.Is(err, io.EOF) && len(line) == 0 && !tooLong {
			return nil
		}
		switch {
		case tooLong:
			badLine(BadLine{Line: n, Error: fmt.Sprintf("longer than %d bytes", MaxLineBytes)})
		case len(bytes.TrimSpace(line)) == 0:
		default:
			e, found, fragment, perr := parseLine(line, &strs)
			if fragment {
				badLine(BadLine{Line: n, Error: "the start of an entry cut short (a torn write), skipped", Fragment: true})
			}
			if perr != nil {
				badLine(BadLine{Line: n, Error: perr.Error()})
			}
			if found {
				e.Line = n
				entry(e)
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
	}
}

// readLine reads one line without its newline into line, which it
// appends to, keeping at most MaxLineBytes of it; tooLong reports that
// more was discarded. err is io.EOF at the end of input, with the last
// line's bytes when it had no newline.
func readLine(br *bufio.Reader, line []byte) (_ []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > MaxLineBytes+1 { // +1: the newline
			tooLong = true
		} else {
			line = append(line, chunk...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if tooLong {
			line = nil
		}
		return bytes.TrimSuffix(line, []byte("\n")), tooLong, err
	}
}

// entryStart is how every line the hub writes starts. Inside a JSON
// string a quote is escaped, so it appears nowhere else in a line.
var entryStart = []byte(`{"time":"`)

// parseLine reads one journal line: an entry (found), a fragment, or an
// entry run on from a fragment (both). err is for a line that is neither.
func parseLine(line []byte, strs *interner) (e Entry, found, fragment bool, err error) {
	e, err = parseEntry(line, strs)
	if err == nil {
		return e, true, false, nil
	}
	if cutShort(line) {
		return Entry{}, false, true, nil
	}
	if i := bytes.LastIndex(line, entryStart); i > 0 && cutShort(line[:i]) {
		if e, err := parseEntry(line[i:], strs); err == nil {
			return e, true, true, nil
		}
	}
	return Entry{}, false, false, err
}

// cutShort reports whether line is JSON that ends before the value it
// starts: the first part of a line whose write was torn.
func cutShort(line []byte) bool {
	var v json.RawMessage
	return errors.Is(json.NewDecoder(bytes.NewReader(line)).Decode(&v), io.ErrUnexpectedEOF)
}

// parseEntry reads one journal line; strs keeps the strings that repeat
// from line to line.
func parseEntry(line []byte, strs *interner) (Entry, error) {
	e, ok := fastEntry(line, strs)
	if !ok {
		e = Entry{}
		if err := json.Unmarshal(line, &e); err != nil {
			return Entry{}, fmt.Errorf("not a journal entry: %w", err)
		}
	}
	switch {
	case e.TxID == "":
		return Entry{}, errors.New("no txid")
	case e.Target == "":
		return Entry{}, errors.New("no target")
	case e.URL == "":
		return Entry{}, errors.New("no url")
	case e.Stage == StageResolvedApplied && e.Code == "":
		return Entry{}, errors.New("resolved_applied with no code")
	}
	if e.Stage == StageResolvedApplied && e.Via == "" {
		e.Via = indoubt.ViaResend
	}
	u, err := url.Parse(e.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Entry{}, fmt.Errorf("url %q: want http://host:port or https://host:port", e.URL)
	}
	return e, nil
}
