package breakerlog

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/relayhub/relayhub/breaker"
)

// ErrMalformed is wrapped by the errors of ParseLine, Read and ReadFile for
// a line that is not exactly in the format AppendLine writes.
var ErrMalformed = errors.New("breakerlog: malformed line")

// ErrBrokenChain is wrapped by the error of CheckChains when a target's
// lines do not form a chain.
var ErrBrokenChain = errors.New("breakerlog: broken chain")

// Entry is one parsed line of the breaker log. It is a plain value, safe to
// copy and to share between goroutines.
type Entry struct {
	// At is the time of the change, in UTC, to the millisecond.
	At time.Time
	// Name is the target's name.
	Name string
	// From and To are the states before and after the change.
	From, To breaker.State
}

// String returns e as a log line, without the newline.
func (e Entry) String() string {
	line := AppendLine(nil, breaker.Transition{Name: e.Name, From: e.From, To: e.To, At: e.At})
	return string(line[:len(line)-1])
}

// ParseLine parses one log line, without its newline. It is strict: the line
// must be exactly what AppendLine would write for the entry it describes,
// so a time in another zone, without exactly three digits of milliseconds,
// an unknown state, a bad name or a wrong number of fields is an error
// wrapping ErrMalformed. It does not judge FROM against TO; CheckChains does.
func ParseLine(line string) (Entry, error) {
	fields := strings.Split(line, "|")
	if len(fields) != 3 {
		return Entry{}, fmt.Errorf("%w %q: want 3 fields separated by '|', got %d", ErrMalformed, line, len(fields))
	}
	at, err := time.Parse(TimeLayout, fields[0])
	if err != nil {
		return Entry{}, fmt.Errorf("%w %q: bad time: %w", ErrMalformed, line, err)
	}
	at = at.UTC()
	// Re-formatting rejects what time.Parse tolerates: an offset other
	// than Z, which would make lines sort and compare wrongly by text.
	if at.Format(TimeLayout) != fields[0] {
		return Entry{}, fmt.Errorf("%w %q: time %q is not UTC with a Z and 3 digits of milliseconds", ErrMalformed, line, fields[0])
	}
	if err := checkName(fields[1]); err != nil {
		return Entry{}, fmt.Errorf("%w %q: %w", ErrMalformed, line, err)
	}
	fromText, toText, ok := strings.Cut(fields[2], "->")
	if !ok {
		return Entry{}, fmt.Errorf("%w %q: want FROM->TO, got %q", ErrMalformed, line, fields[2])
	}
	from, ok := parseState(fromText)
	if !ok {
		return Entry{}, fmt.Errorf("%w %q: unknown state %q", ErrMalformed, line, fromText)
	}
	to, ok := parseState(toText)
	if !ok {
		return Entry{}, fmt.Errorf("%w %q: unknown state %q", ErrMalformed, line, toText)
	}
	return Entry{At: at, Name: fields[1], From: from, To: to}, nil
}

// parseState is the inverse of breaker.State.String for the three states.
func parseState(s string) (breaker.State, bool) {
	for _, st := range []breaker.State{breaker.Closed, breaker.Open, breaker.HalfOpen} {
		if s == st.String() {
			return st, true
		}
	}
	return 0, false
}

// Read parses every line from r. It is strict but for torn writes: a
// line that is the start of a well-formed line cut short, and nothing else,
// is a fragment, left by a write that failed part way (a full disk) or by
// a crash. Fragments are skipped, and their 1-based line numbers returned;
// the hub starts the line after one on a line of its own. A last line
// without a newline is an entry if it is whole, a fragment if it is the
// start of one. Anything else that does not parse, an empty line included,
// is an error that gives its line number and wraps ErrMalformed; so is a
// line that runs a well-formed line on from a fragment, which no hub that
// cuts torn writes off leaves.
func Read(r io.Reader) (entries []Entry, fragments []int, err error) {
	br := bufio.NewReader(r)
	for n := 1; ; n++ {
		line, err := br.ReadString('\n')
		eof := errors.Is(err, io.EOF)
		if err != nil && !eof {
			return entries, fragments, fmt.Errorf("line %d: %w", n, err)
		}
		if eof && line == "" {
			return entries, fragments, nil
		}
		line = strings.TrimSuffix(line, "\n")
		e, perr := ParseLine(line)
		switch {
		case perr == nil:
			entries = append(entries, e)
		case line != "" && isLineStart(line):
			fragments = append(fragments, n)
		case eof:
			return entries, fragments, fmt.Errorf("line %d: %w (no newline at end of file)", n, perr)
		default:
			return entries, fragments, fmt.Errorf("line %d: %w", n, perr)
		}
		if eof {
			return entries, fragments, nil
		}
	}
}

// lineTimeShape is the shape of a line's time field: '0' stands for any
// digit.
const lineTimeShape = "0000-00-00T00:00:00.000Z"

// isLineStart reports whether s is the start of a well-formed line, cut
// short: what a torn write leaves.
func isLineStart(s string) bool {
	for i := 0; i < len(s) && i < len(lineTimeShape); i++ {
		if c := lineTimeShape[i]; c == '0' && (s[i] < '0' || s[i] > '9') || c != '0' && s[i] != c {
			return false
		}
	}
	if len(s) <= len(lineTimeShape) {
		return true
	}
	if _, err := time.Parse(TimeLayout, s[:len(lineTimeShape)]); err != nil || s[len(lineTimeShape)] != '|' {
		return false
	}
	name, change, ok := strings.Cut(s[len(lineTimeShape)+1:], "|")
	if !ok {
		return name == "" || checkName(name) == nil
	}
	if checkName(name) != nil {
		return false
	}
	for _, from := range []breaker.State{breaker.Closed, breaker.Open, breaker.HalfOpen} {
		for _, to := range []breaker.State{breaker.Closed, breaker.Open, breaker.HalfOpen} {
			if whole := from.String() + "->" + to.String(); len(change) < len(whole) && strings.HasPrefix(whole, change) {
				return true
			}
		}
	}
	return false
}

// ReadFile reads and parses the log at path, as Read does. Errors name the
// path.
func ReadFile(path string) (entries []Entry, fragments []int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("breaker log %q: %w", path, err)
	}
	defer f.Close()
	entries, fragments, err = Read(f)
	if err != nil {
		return entries, fragments, fmt.Errorf("breaker log %q: %w", path, err)
	}
	return entries, fragments, nil
}

// CheckChains verifies, for each target separately, that its entries form a
// chain in order: the first starts from CLOSED, each starts from the state
// the previous one ended in, and none goes from a state to itself. The
// error, wrapping ErrBrokenChain, describes the first break; positions are
// 1-based, so they are line numbers for the entries of a whole file that
// had no fragment.
//
// It checks only the chain, not which changes the breaker may make (manual
// control may, say, close an open breaker) nor the order of times. Each run
// of the relay starts every breaker CLOSED, so a file appended to by a run
// that stopped with a target OPEN or HALF_OPEN and then by the next run
// fails the check; check such a file run by run.
func CheckChains(entries []Entry) error {
	type last struct {
		to   breaker.State
		line int
	}
	seen := make(map[string]last)
	for i, e := range entries {
		n := i + 1
		if e.From == e.To {
			return fmt.Errorf("%w: line %d (%s): %s goes from %s to itself", ErrBrokenChain, n, e, e.Name, e.From)
		}
		prev, ok := seen[e.Name]
		switch {
		case !ok && e.From != breaker.Closed:
			return fmt.Errorf("%w: line %d (%s): first change of %s starts from %s, want %s",
				ErrBrokenChain, n, e, e.Name, e.From, breaker.Closed)
		case ok && e.From != prev.to:
			return fmt.Errorf("%w: line %d (%s): %s starts from %s but line %d left it %s",
				ErrBrokenChain, n, e, e.Name, e.From, prev.line, prev.to)
		}
		seen[e.Name] = last{to: e.To, line: n}
	}
	return nil
}
