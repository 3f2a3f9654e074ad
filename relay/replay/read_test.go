package replay

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay"
)

// hubPolicy is the policy the hand-written incident was written under.
var hubPolicy = breaker.Policy{FailThreshold: 3, ResetTimeout: time.Second}

func TestMalformedLinesAreCountedAndSkipped(t *testing.T) {
	// Given the incident with bad lines mixed in, and a last line torn by
	// a crash,
	var in []string
	in = append(in, incident[:2]...)
	in = append(in,
		"not json at all",
		"",
		`["an","array"]`,
		`{"time":"2026-11-30T08:00:00.011Z","target":"CORE","breaker":"admitted","start":"2026-11-30T08:00:00.010Z"}`,
		`{"time":"yesterday","target":"CORE","code":"0000"}`,
		`{"time":"2026-11-30T08:00:00.011Z","target":"CORE","code":"0000","breaker":"maybe","start":"2026-11-30T08:00:00.010Z"}`,
		`{"time":"2026-11-30T08:00:00.011Z","target":"CORE","code":"0000","duration_ms":-1}`,
		`{"time":"2026-11-30T08:00:00.011Z","target":"CORE","code":"0000","breaker":"refused"}`,
		`{"time":"2026-11-30T08:00:00.011Z","target":"CORE","code":"0000","breaker":"admitted","start":"2026-11-30T08:00:00.010Z","end":"2026-11-30T08:00:00.009Z"}`,
		`{"time":"2026-11-30T08:00:00.011Z","target":"CORE","code":"0000","probe":"yes"}`,
		`{"time":"2026-11-30T08:00:00.011Z","target":7,"code":"0000"}`,
		`{"time":"2026-11-30T08:00:00.011Z","target":"CORE","code":"0000","x":"`+strings.Repeat("x", maxLineBytes)+`"}`,
	)
	in = append(in, incident[2:]...)
	torn := in[len(in)-1]
	in[len(in)-1] = torn[:len(torn)/2]
	text := strings.Join(in, "\n")

	// when it is replayed,
	rep := run(t, []Source{textSource("access.log", text)}, settings("hub", hubPolicy))

	// then each bad line is counted and listed with its number and why,
	// never a crash, and the good lines replay as if alone (the call of
	// the torn line is lost, which changes no transition).
	reasons := []string{
		"access.log:3: not JSON",
		"access.log:4: not JSON",
		"access.log:5: not a JSON object",
		"access.log:6: no code",
		`access.log:7: time "yesterday": want an RFC 3339 time`,
		`access.log:8: breaker "maybe": want admitted, refused or handed_back`,
		"access.log:9: duration_ms -1: want a number of milliseconds",
		"access.log:10: breaker without start",
		"access.log:11: end before start",
		`access.log:12: probe "yes": want true or false`,
		"access.log:13: target: want a string",
		"access.log:14: longer than 64 KiB",
		"access.log:23: not JSON",
	}
	var got []string
	for _, l := range rep.MalformedLines {
		got = append(got, l.String())
	}
	assert.Equal(t, reasons, got)
	assert.Equal(t, int64(len(reasons)), rep.Malformed)
	assert.Equal(t, int64(len(in)), rep.Lines)
	assert.Equal(t, wantIncident, lines(rep.Sets[0].Transitions))
	assert.Equal(t, int64(len(incident)-1), rep.Requests)
}

func TestMalformedLinesAreListedUpToMaxListed(t *testing.T) {
	bad := make([]string, 50)
	for i := range bad {
		bad[i] = "garbage"
	}
	rep, err := Run(context.Background(), Config{Sets: []Settings{settings("hub", hubPolicy)}, MaxListed: 5},
		[]Source{textSource("x", bad...)})
	require.NoError(t, err)
	assert.Equal(t, int64(50), rep.Malformed)
	assert.Len(t, rep.MalformedLines, 5)
}

// gzipped returns text compressed with gzip.
func gzipped(t testing.TB, text string) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, err := zw.Write([]byte(text))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return b.Bytes()
}

func TestGzipAndSeveralFilesInTheOrderOfTheirTimes(t *testing.T) {
	// Given the incident rotated into three files, the oldest gzipped, and
	// named so that the shell lists the newest first,
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, data, 0o600))
		return path
	}
	text := func(ls []string) string { return strings.Join(ls, "\n") + "\n" }
	paths := []string{
		write("access.log", []byte(text(incident[8:]))),
		write("access.log.1", []byte(text(incident[4:8]))),
		write("access.log.2.gz", gzipped(t, text(incident[:4]))),
	}
	var sources []Source
	for _, p := range paths {
		src, err := FileSource(p)
		require.NoError(t, err)
		sources = append(sources, src)
	}

	// when they are ordered and replayed,
	ordered, err := OrderSources(sources)
	require.NoError(t, err)
	rep := run(t, ordered, settings("hub", hubPolicy))

	// then they replay oldest first, as one log.
	assert.Equal(t, []string{paths[2], paths[1], paths[0]}, []string{rep.Sources[0].Name, rep.Sources[1].Name, rep.Sources[2].Name})
	assert.Equal(t, wantIncident, lines(rep.Sets[0].Transitions))
	assert.Zero(t, rep.Malformed)
}

func TestATruncatedGzipFileIsReportedAndTheRestReplayed(t *testing.T) {
	// Given a gzipped log cut off in the middle, then a plain one,
	all := gzipped(t, strings.Join(incident[:8], "\n")+"\n")
	cut := all[:len(all)*2/3]
	src := Source{Name: "old.gz", Open: func() (_ io.ReadCloser, _ error) { return io.NopCloser(bytes.NewReader(cut)), nil }}

	// when both are replayed,
	rep := run(t, []Source{src, textSource("new", incident[8:]...)}, settings("hub", hubPolicy))

	// then the first is reported as cut short after the lines it gave,
	// and the replay goes on.
	require.Len(t, rep.Sources, 2)
	assert.Equal(t, "unexpected EOF", rep.Sources[0].Error)
	assert.Less(t, rep.Sources[0].Lines, int64(8))
	assert.Empty(t, rep.Sources[1].Error)
	assert.Equal(t, int64(len(incident)-8), rep.Sources[1].Lines)
}

func TestLinesLaterThanTheReorderWindowAreSkipped(t *testing.T) {
	// Given a line whose call started 6 s before one replayed already,
	in := append([]string{}, incident...)
	in = append(in, callLine("CORE", 9000, 1, "0000", false), callLine("CORE", 12000, 1, "0000", false),
		callLine("CORE", 3000, 1, "0000", false))

	// when the reorder window is 1 s, it is skipped and listed;
	rep, err := Run(context.Background(), Config{Sets: []Settings{settings("hub", hubPolicy)}, ReorderWindow: time.Second},
		[]Source{textSource("access.log", in...)})
	require.NoError(t, err)
	assert.Equal(t, int64(1), rep.Late)
	require.Len(t, rep.LateLines, 1)
	assert.Equal(t, int64(len(in)), rep.LateLines[0].Line)

	// with the default window of a minute it is replayed in its place.
	rep = run(t, []Source{textSource("access.log", in...)}, settings("hub", hubPolicy))
	assert.Zero(t, rep.Late)
	assert.Equal(t, int64(len(in)), rep.Requests)
}

func TestLinesOfAnOlderHubReplayApproximately(t *testing.T) {
	// Given the incident as a hub without breaker fields wrote it: the
	// time of each answer to the millisecond, and durations,
	var old []string
	for _, l := range incident {
		rec, err := new(lineParser).parse([]byte(l))
		require.NoError(t, err)
		old = append(old, `{"time":"`+time.Unix(0, max(rec.end, rec.start)).UTC().Format(relay.TimeFormat)+
			`","txid":"T","target":"CORE","code":"`+string(rec.code)+`","duration_ms":`+
			strconvFloat(rec.took)+`,"bytes":1}`)
	}
	old = append(old, `{"time":"2026-11-30T08:00:03.000Z","txid":"-","code":"E900","duration_ms":0,"bytes":0}`)

	// when it is replayed, it gives the same transitions here, where no
	// two moments share a millisecond, and says it was approximate.
	rep := run(t, []Source{textSource("old", old...)}, settings("hub", hubPolicy))
	assert.Equal(t, wantIncident, lines(rep.Sets[0].Transitions))
	assert.Equal(t, int64(len(incident)), rep.Approximate)
	assert.Equal(t, int64(1), rep.NoBreaker)
	assert.Zero(t, rep.Logged[0].Probes, "an older log does not say which call probed")
}

func strconvFloat(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', -1, 64)
}

func TestParseStamp(t *testing.T) {
	for in, ok := range map[string]bool{
		"2026-11-30T08:01:25.383118002Z":  true,
		"2026-11-30T08:01:25.383Z":        true,
		"2026-11-30T08:01:25Z":            true,
		"2028-02-29T23:59:59.9Z":          true,
		"2026-11-30T09:01:25.383+01:00":   true,
		"2026-11-30T08:01:25.1234567890Z": true,
		"2026-11-30T08:01:25.12aZ":        false,
		"2026-02-29T08:01:25Z":            false,
		"2026-11-30T24:01:25Z":            false,
		"2026-11-30T08:01:25.Z":           false,
		"2026-11-30 08:01:25Z":            false,
		"1969-12-31T23:59:59Z":            false,
		"1970-01-01T00:00:00Z":            false,
		"":                                false,
	} {
		ns, got := parseStamp([]byte(in))
		if !assert.Equal(t, ok, got, in) || !ok {
			continue
		}
		want, err := time.Parse(time.RFC3339Nano, in)
		require.NoError(t, err)
		assert.Equal(t, want.UnixNano(), ns, in)
	}
}

func FuzzParseStamp(f *testing.F) {
	f.Add("2026-11-30T08:01:25.383118002Z")
	f.Add("2000-02-29T00:00:00.5Z")
	f.Add("2100-12-31T23:59:59Z")
	f.Fuzz(func(t *testing.T, s string) {
		ns, ok := parseUTCStamp([]byte(s))
		if !ok {
			return
		}
		want, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatalf("%q read as %d, but time.Parse refuses it: %v", s, ns, err)
		}
		if want.UnixNano() != ns {
			t.Fatalf("%q read as %d, time.Parse says %d", s, ns, want.UnixNano())
		}
	})
}

func FuzzReplay(f *testing.F) {
	// Whatever the bytes, a replay counts what it cannot read and never
	// fails or panics: access logs get torn, truncated and edited.
	f.Add([]byte(strings.Join(incident, "\n")))
	f.Add([]byte(strings.Join(incident[:5], "\n") + "\n" + incident[5][:40]))
	f.Add(gzipped(f, strings.Join(incident, "\n")))
	f.Add([]byte(`{"time":"2026-11-30T08:00:00.011Z","target":"CORE","fallback_for":"CORE_DR","code":"E905","breaker":"handed_back","probe":true,"start":"2026-11-30T08:00:00.010Z"}`))
	f.Add([]byte(`{"time":"2026-11-30T08:00:00.011Z","target":"CORE","code":"0000","duration_ms":1e300}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		src := Source{Name: "fuzz", Open: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }}
		set := settings("fuzz", breaker.Policy{FailThreshold: 2, ResetTimeout: time.Millisecond, SlowCall: time.Millisecond})
		set.Targets = []relay.Target{{Name: "CORE", Fallback: "CORE_DR"}}
		rep, err := Run(context.Background(), Config{Sets: []Settings{set, settings("other", breaker.Policy{})}}, []Source{src})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Requests+rep.NoBreaker+rep.Malformed+rep.Late > rep.Lines {
			t.Fatalf("more lines counted than read: %+v", rep)
		}
		if err := rep.WriteText(io.Discard, ""); err != nil {
			t.Fatal(err)
		}
	})
}

func TestASourceThatIsNotGzipIsReportedAndTheRestReplayed(t *testing.T) {
	// Given a file that starts with gzip's magic bytes but is not gzip,
	bad := Source{Name: "bad.gz", Open: func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader([]byte("\x1f\x8b not gzip at all\n"))), nil
	}}
	// when it is replayed before a good one, it is reported and skipped.
	rep := run(t, []Source{bad, textSource("good", incident...)}, settings("hub", hubPolicy))
	require.Len(t, rep.Sources, 2)
	assert.Contains(t, rep.Sources[0].Error, "starts as gzip but is not: gzip: invalid header")
	assert.Zero(t, rep.Sources[0].Lines)
	assert.Equal(t, wantIncident, lines(rep.Sets[0].Transitions))
}
