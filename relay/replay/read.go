package replay

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/valyala/fastjson"
)

// Source is one access log to replay: a file, possibly gzipped, or
// standard input. It is a plain value.
type Source struct {
	// Name names the source in messages: its path, or "-" for standard
	// input.
	Name string
	// Open opens the source for reading from its start. Run calls it once;
	// OrderSources once more for each source.
	Open func() (io.ReadCloser, error)
	// Size is how many bytes the source holds as stored (compressed, for a
	// gzipped file), for the progress line; zero when unknown.
	Size int64
}

// Stdin is the name of the Source that reads standard input.
const Stdin = "-"

// FileSource returns the Source of the file at path, or of standard input
// when path is Stdin. It fails when the file cannot be opened.
func FileSource(path string) (Source, error) {
	if path == Stdin {
		return Source{Name: Stdin, Open: func() (io.ReadCloser, error) { return io.NopCloser(os.Stdin), nil }}, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return Source{}, err
	}
	st, err := f.Stat()
	f.Close()
	if err != nil {
		return Source{}, err
	}
	if st.IsDir() {
		return Source{}, fmt.Errorf("%s: is a directory", path)
	}
	return Source{Name: path, Size: st.Size(), Open: func() (io.ReadCloser, error) { return os.Open(path) }}, nil
}

// OrderSources returns the sources sorted by the time of their first line
// that has one, so that rotated logs replay oldest first however they are
// named (a shell's access.log* gives the newest, access.log, first). A
// source without such a line within its first firstTimeLines lines keeps
// its place relative to the others without one, after them. The sources
// are each opened and closed once; standard input cannot be, so sources
// that include it are returned as they are.
func OrderSources(sources []Source) ([]Source, error) {
	if slices.ContainsFunc(sources, func(s Source) bool { return s.Name == Stdin }) {
		return sources, nil
	}
	type keyed struct {
		src   Source
		first int64
		found bool
	}
	ks := make([]keyed, len(sources))
	for i, s := range sources {
		first, found, err := firstTime(s)
		if err != nil {
			return nil, err
		}
		ks[i] = keyed{s, first, found}
	}
	slices.SortStableFunc(ks, func(a, b keyed) int {
		switch {
		case a.found != b.found:
			if a.found {
				return -1
			}
			return 1
		case a.first < b.first:
			return -1
		case a.first > b.first:
			return 1
		}
		return 0
	})
	out := make([]Source, len(ks))
	for i, k := range ks {
		out[i] = k.src
	}
	return out, nil
}

// firstTimeLines is how many lines OrderSources reads of a source, at most,
// looking for its first time.
const firstTimeLines = 1000

// firstTime returns the time of the first line of s that has one.
func firstTime(s Source) (int64, bool, error) {
	lr, err := openLines(s)
	if err != nil {
		return 0, false, err
	}
	defer lr.close()
	var p lineParser
	for range firstTimeLines {
		line, tooLong, err := lr.next()
		if line == nil && !tooLong {
			return 0, false, nil
		}
		if !tooLong {
			if rec, perr := p.parse(line); perr == nil && rec.time != 0 {
				return rec.time, true, nil
			}
		}
		if err != nil {
			return 0, false, nil
		}
	}
	return 0, false, nil
}

// maxLineBytes is the longest access log line read; a longer one is
// skipped as malformed. The hub's lines are a few hundred bytes.
const maxLineBytes = 64 << 10

// lineReader reads one source line by line, through gzip when the source
// starts with gzip's magic bytes, counting its lines and the bytes read of
// it as stored. It is used by one goroutine.
type lineReader struct {
	name   string
	src    io.ReadCloser
	stored *countingReader
	br     *bufio.Reader
	lines  int64 // lines returned so far: the number of the last one
	broken error // why nothing can be read, when the start of the source said so
}

// countingReader counts the bytes read through it. Not safe for
// concurrent use.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// gzipMagic starts every gzip stream.
var gzipMagic = []byte{0x1f, 0x8b}

func openLines(s Source) (*lineReader, error) {
	src, err := s.Open()
	if err != nil {
		return nil, err
	}
	stored := &countingReader{r: src}
	br := bufio.NewReaderSize(stored, maxLineBytes)
	lr := &lineReader{name: s.Name, src: src, stored: stored, br: br}
	if magic, _ := br.Peek(len(gzipMagic)); bytes.Equal(magic, gzipMagic) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			// Reported as the source's read error, like a gzip stream
			// cut short: the replay goes on with the next source.
			lr.broken = fmt.Errorf("starts as gzip but is not: %w", err)
			return lr, nil
		}
		lr.br = bufio.NewReaderSize(zr, maxLineBytes)
	}
	return lr, nil
}

func (r *lineReader) close() { r.src.Close() }

// next returns the next line without its line terminator, valid until the
// next call. tooLong reports a line longer than maxLineBytes, whose bytes
// are not returned. A last line without a newline is returned like any
// other. At the end of the source it returns a nil line and tooLong false,
// with a nil error at a clean end and the read error otherwise (a truncated
// gzip stream: io.ErrUnexpectedEOF); a line may come with the error that
// ended it.
func (r *lineReader) next() (line []byte, tooLong bool, err error) {
	if r.broken != nil {
		return nil, false, r.broken
	}
	chunk, err := r.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		for errors.Is(err, bufio.ErrBufferFull) {
			_, err = r.br.ReadSlice('\n')
		}
		r.lines++
		return nil, true, eofIsNil(err)
	}
	if len(chunk) == 0 {
		return nil, false, eofIsNil(err)
	}
	r.lines++
	chunk = bytes.TrimSuffix(chunk, []byte{'\n'})
	return bytes.TrimSuffix(chunk, []byte{'\r'}), false, eofIsNil(err)
}

// eofIsNil turns the end of a source into no error.
func eofIsNil(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// The breaker field's values (relay's breakerUseNames).
const (
	useNone       = iota // the line has no breaker field
	useAdmitted          // "admitted"
	useRefused           // "refused"
	useHandedBack        // "handed_back"
)

// record is one access log line, parsed. Its byte slices point into the
// parser's memory and are valid until the next parse; it belongs to the
// parser's goroutine.
type record struct {
	time        int64 // unix nanoseconds; the "time" field
	start, end  int64 // unix nanoseconds; zero when absent
	took        time.Duration
	target      []byte
	fallbackFor []byte
	code        []byte
	use         int
	probe       bool
	synthetic   bool // the hub's own probe, not a client's request
}

// fieldOf returns where the value of key goes in r: the field of a time
// or the field of a string, or neither.
func (r *record) fieldOf(key []byte) (*int64, *[]byte) {
	switch string(key) {
	case "time":
		return &r.time, nil
	case "start":
		return &r.start, nil
	case "end":
		return &r.end, nil
	case "target":
		return nil, &r.target
	case "fallback_for":
		return nil, &r.fallbackFor
	case "code":
		return nil, &r.code
	}
	return nil, nil
}

// lineParser parses access log lines. Not safe for concurrent use.
type lineParser struct {
	p   fastjson.Parser
	rec record
	err error
	// visit is p.field bound once, so that parsing a line does not
	// allocate a closure.
	visit func(key []byte, v *fastjson.Value)
}

// parse parses one line. The error says what is wrong with it.
func (p *lineParser) parse(line []byte) (*record, error) {
	v, err := p.p.ParseBytes(line)
	if err != nil {
		return nil, errors.New("not JSON")
	}
	obj, err := v.Object()
	if err != nil {
		return nil, errors.New("not a JSON object")
	}
	p.rec, p.err = record{}, nil
	if p.visit == nil {
		p.visit = p.field
	}
	obj.Visit(p.visit)
	if p.err != nil {
		return nil, p.err
	}
	rec := &p.rec
	switch {
	case rec.code == nil:
		return nil, errors.New("no code")
	case rec.time == 0:
		return nil, errors.New("no time")
	case rec.use != useNone && rec.target == nil:
		return nil, errors.New("breaker without target")
	case rec.use != useNone && rec.start == 0:
		return nil, errors.New("breaker without start")
	case rec.end != 0 && rec.end < rec.start:
		return nil, errors.New("end before start")
	}
	return rec, nil
}

// field reads one field of a line into p.rec; unknown fields are skipped.
func (p *lineParser) field(key []byte, v *fastjson.Value) {
	if p.err != nil {
		return
	}
	switch stamp, str := p.rec.fieldOf(key); {
	case stamp != nil:
		*stamp = p.stamp(key, v)
	case str != nil:
		*str = p.str(key, v)
	}
	switch string(key) {
	case "duration_ms":
		ms, err := v.Float64()
		if err != nil || !(ms >= 0) || ms > maxDurationMs {
			p.err = fmt.Errorf("duration_ms %s: want a number of milliseconds", v)
			return
		}
		p.rec.took = time.Duration(ms*float64(time.Millisecond) + 0.5)
	case "breaker":
		switch s := p.str(key, v); string(s) {
		case "admitted":
			p.rec.use = useAdmitted
		case "refused":
			p.rec.use = useRefused
		case "handed_back":
			p.rec.use = useHandedBack
		default:
			if p.err == nil {
				p.err = fmt.Errorf("breaker %q: want admitted, refused or handed_back", s)
			}
		}
	case "probe":
		b, err := v.Bool()
		if err != nil {
			p.err = fmt.Errorf("probe %s: want true or false", v)
		}
		p.rec.probe = b
	case "synthetic":
		b, err := v.Bool()
		if err != nil {
			p.err = fmt.Errorf("synthetic %s: want true or false", v)
		}
		p.rec.synthetic = b
	}
}

// maxDurationMs is the longest duration_ms read: a year, far beyond any
// target timeout, and well inside a time.Duration.
const maxDurationMs = 365 * 24 * 3600 * 1000

// str returns a string field's bytes, or nil and an error in p.err.
func (p *lineParser) str(key []byte, v *fastjson.Value) []byte {
	b, err := v.StringBytes()
	if err != nil {
		p.err = fmt.Errorf("%s: want a string", key)
	}
	return b
}

// stamp returns a time field in unix nanoseconds, or zero and an error in
// p.err.
func (p *lineParser) stamp(key []byte, v *fastjson.Value) int64 {
	b := p.str(key, v)
	if p.err != nil {
		return 0
	}
	ns, ok := parseStamp(b)
	if !ok {
		p.err = fmt.Errorf("%s %q: want an RFC 3339 time", key, b)
	}
	return ns
}

// parseStamp reads an RFC 3339 time and returns it in unix nanoseconds. The
// hub's form, UTC with a Z and up to nine digits of fraction, is read
// without time.Parse, which would cost more than the rest of a line; any
// other offset goes through time.Parse. A time that is zero in unix
// nanoseconds (1970-01-01T00:00:00Z) is refused with the malformed ones,
// as zero marks an absent field.
func parseStamp(b []byte) (int64, bool) {
	if ns, ok := parseUTCStamp(b); ok {
		return ns, ns != 0
	}
	t, err := time.Parse(time.RFC3339Nano, string(b))
	if err != nil || t.Year() < 1970 || t.Year() > 2200 {
		return 0, false
	}
	ns := t.UnixNano()
	return ns, ns != 0
}

// parseUTCStamp is parseStamp's fast path: YYYY-MM-DDTHH:MM:SS[.F]Z, with
// one to nine digits of fraction F, years 1970 to 2200.
func parseUTCStamp(b []byte) (int64, bool) {
	if len(b) < 20 || b[4] != '-' || b[7] != '-' || b[10] != 'T' || b[13] != ':' || b[16] != ':' || b[len(b)-1] != 'Z' {
		return 0, false
	}
	year, ok1 := digits(b[0:4])
	month, ok2 := digits(b[5:7])
	day, ok3 := digits(b[8:10])
	hour, ok4 := digits(b[11:13])
	minute, ok5 := digits(b[14:16])
	sec, ok6 := digits(b[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) ||
		year < 1970 || year > 2200 || month < 1 || month > 12 || day < 1 ||
		day > daysIn(month, year) || hour > 23 || minute > 59 || sec > 59 {
		return 0, false
	}
	var frac int64
	if rest := b[19 : len(b)-1]; len(rest) > 0 {
		if len(rest) < 2 || len(rest) > 10 || rest[0] != '.' {
			return 0, false
		}
		f, ok := digits(rest[1:])
		if !ok {
			return 0, false
		}
		for range 10 - len(rest) {
			f *= 10
		}
		frac = f
	}
	days := daysFromCivil(year, month, day)
	return ((days*24+hour)*60+minute)*60*int64(time.Second) + sec*int64(time.Second) + frac, true
}

// digits reads a run of ASCII digits.
func digits(b []byte) (int64, bool) {
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// daysIn returns the number of days of month in year.
func daysIn(month, year int64) int64 {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// daysFromCivil returns the number of days from 1970-01-01 to the given
// date of the proleptic Gregorian calendar (Howard Hinnant's algorithm).
func daysFromCivil(y, m, d int64) int64 {
	if m <= 2 {
		y--
	}
	era := y / 400
	yoe := y - era*400
	mp := (m + 9) % 12
	doy := (153*mp+2)/5 + d - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

// LineError is a line of a source that was skipped, and why. It is a plain
// value.
type LineError struct {
	Source string `json:"source"`
	Line   int64  `json:"line"`
	Reason string `json:"reason"`
}

// String returns "SOURCE:LINE: REASON".
func (e LineError) String() string {
	return e.Source + ":" + strconv.FormatInt(e.Line, 10) + ": " + e.Reason
}
