package indoubt

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/logtest"
)

func testEntry(txid string) Entry {
	return Entry{
		Time:          time.Date(2026, 12, 1, 17, 30, 0, 123456789, time.UTC),
		Hub:           "hub-a:9200",
		TxID:          txid,
		Target:        "CORE",
		URL:           "http://127.0.0.1:9201",
		Code:          "E901",
		Stage:         "request_sent",
		BytesSent:     123,
		PayloadSHA256: sha256.Sum256([]byte("XFER 1001 1002 2500")),
	}
}

func TestEntryIsTheJournalFormat(t *testing.T) {
	e := testEntry("T1")
	line := string(e.AppendJSON(nil))
	assert.Equal(t, `{"time":"2026-12-01T17:30:00.123Z","hub":"hub-a:9200","txid":"T1","target":"CORE","url":"http://127.0.0.1:9201",`+
		`"code":"E901","stage":"request_sent","bytes_sent":123,"payload_sha256":"`+fmt.Sprintf("%x", e.PayloadSHA256)+`"}`, line)

	t.Run("strings are escaped", func(t *testing.T) {
		e := testEntry("T1")
		e.Hub = "a\"b\\c\nd\x01é\xff"
		var got map[string]any
		require.NoError(t, json.Unmarshal(e.AppendJSON(nil), &got))
		assert.Equal(t, "a\"b\\c\nd\x01é\uFFFD", got["hub"])
	})
	t.Run("time is UTC", func(t *testing.T) {
		e := testEntry("T1")
		e.Time = time.Date(2026, 12, 1, 18, 30, 0, 5e6, time.FixedZone("CET", 3600))
		assert.Contains(t, string(e.AppendJSON(nil)), `"time":"2026-12-01T17:30:00.005Z"`)
	})
}

// resolvedEntry is the line a hub appends when a resend of txid found the
// target had applied it with code.
func resolvedEntry(txid, code string) Entry {
	return Entry{
		Time:          time.Date(2026, 12, 1, 17, 31, 5, 250e6, time.UTC),
		Hub:           "hub-b:9200",
		TxID:          txid,
		Target:        "CORE",
		URL:           "http://127.0.0.1:9201",
		Code:          code,
		Stage:         StageResolvedApplied,
		PayloadSHA256: sha256.Sum256([]byte("XFER 1001 1002 2500")),
	}
}

func TestResolvedEntryRoundTrip(t *testing.T) {
	j := openTest(t, Config{})
	inDoubt, resolved := testEntry("T1"), resolvedEntry("T1", "0000")
	require.NoError(t, j.Append(&inDoubt))
	require.NoError(t, j.Append(&resolved))

	raw, err := os.ReadFile(j.Path())
	require.NoError(t, err)
	assert.Equal(t, string(inDoubt.AppendJSON(nil))+"\n"+
		`{"time":"2026-12-01T17:31:05.250Z","hub":"hub-b:9200","txid":"T1","target":"CORE","url":"http://127.0.0.1:9201",`+
		`"code":"0000","stage":"resolved_applied","bytes_sent":0,"payload_sha256":"`+fmt.Sprintf("%x", resolved.PayloadSHA256)+`","via":"resend"}`+"\n",
		string(raw))
	lines := logtest.FileLines(t, j.Path())
	require.Len(t, lines, 2)
	assert.Equal(t, lines[0]["payload_sha256"], lines[1]["payload_sha256"], "the resolution names the same payload")
}

func openTest(t *testing.T, cfg Config) *Journal {
	t.Helper()
	if cfg.Path == "" {
		cfg.Path = filepath.Join(t.TempDir(), "in-doubt.log")
	}
	cfg.Logger = zerolog.New(zerolog.NewTestWriter(t))
	j, err := Open(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	return j
}

func TestAppendIsInTheFileWhenItReturns(t *testing.T) {
	j := openTest(t, Config{})
	for _, txid := range []string{"T1", "T2"} {
		e := testEntry(txid)
		require.NoError(t, j.Append(&e))
		lines := logtest.FileLines(t, j.Path())
		require.NotEmpty(t, lines)
		assert.Equal(t, txid, lines[len(lines)-1]["txid"], "the line is written before Append returns")
	}
	assert.Equal(t, int64(2), j.syncs.Load(), "each line fsynced before Append returned")
}

func TestAppendAppendsToAnExistingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "in-doubt.log")
	require.NoError(t, os.WriteFile(path, []byte("{\"txid\":\"OLD\"}\n"), 0o640))
	j := openTest(t, Config{Path: path})
	e := testEntry("NEW")
	require.NoError(t, j.Append(&e))
	lines := logtest.FileLines(t, path)
	require.Len(t, lines, 2)
	assert.Equal(t, "OLD", lines[0]["txid"])
	assert.Equal(t, "NEW", lines[1]["txid"])
}

// blockSync makes j's fsyncs wait for release, and reports each one on
// entered.
func blockSync(j *Journal) (entered chan struct{}, release chan struct{}) {
	entered, release = make(chan struct{}, 100), make(chan struct{})
	sync := j.sync
	j.sync = func(f *os.File) error {
		entered <- struct{}{}
		<-release
		return sync(f)
	}
	return entered, release
}

// TestConcurrentAppendsShareAnFsync holds the first fsync while ten more
// callers queue their lines: they go out together, in one write and one
// fsync.
func TestConcurrentAppendsShareAnFsync(t *testing.T) {
	j := openTest(t, Config{})
	entered, release := blockSync(j)

	var wg sync.WaitGroup
	errs := make(chan error, 11)
	appendOne := func(txid string) {
		defer wg.Done()
		e := testEntry(txid)
		errs <- j.Append(&e)
	}
	wg.Add(1)
	go appendOne("FIRST")
	<-entered
	for i := range 10 {
		wg.Add(1)
		go appendOne(fmt.Sprintf("T%d", i))
	}
	require.Eventually(t, func() bool { return len(j.queue) == 10 }, 5*time.Second, time.Millisecond)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Equal(t, int64(2), j.syncs.Load(), "one fsync for the first line, one for the ten queued behind it")
	assert.Len(t, logtest.FileLines(t, j.Path()), 11)
}

func TestAppendUnderConcurrency(t *testing.T) {
	j := openTest(t, Config{})
	const callers, each = 32, 20
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				e := testEntry(fmt.Sprintf("C%d-%d", c, i))
				assert.NoError(t, j.Append(&e))
			}
		}()
	}
	wg.Wait()
	lines := logtest.FileLines(t, j.Path())
	require.Len(t, lines, callers*each, "every line whole, none lost or split")
	seen := make(map[any]bool)
	for _, l := range lines {
		seen[l["txid"]] = true
	}
	assert.Len(t, seen, callers*each)
	assert.LessOrEqual(t, j.syncs.Load(), int64(callers*each))
}

func TestAppendFailures(t *testing.T) {
	t.Run("write error", func(t *testing.T) {
		j := openTest(t, Config{})
		require.NoError(t, j.file.Close())
		e := testEntry("T1")
		assert.ErrorIs(t, j.Append(&e), os.ErrClosed)
	})
	t.Run("fsync error", func(t *testing.T) {
		j := openTest(t, Config{})
		boom := errors.New("disk gone")
		j.sync = func(*os.File) error { return boom }
		e := testEntry("T1")
		assert.ErrorIs(t, j.Append(&e), boom)
	})
	t.Run("queue full", func(t *testing.T) {
		j := openTest(t, Config{QueueSize: 1, WaitTimeout: time.Minute})
		entered, release := blockSync(j)
		defer close(release)
		first, second := make(chan error, 1), make(chan error, 1)
		go func() { e := testEntry("T1"); first <- j.Append(&e) }()
		<-entered
		go func() { e := testEntry("T2"); second <- j.Append(&e) }()
		require.Eventually(t, func() bool { return len(j.queue) == 1 }, 5*time.Second, time.Millisecond)
		e := testEntry("T3")
		assert.ErrorIs(t, j.Append(&e), ErrQueueFull, "never waits for room")
	})
	t.Run("stalled fsync", func(t *testing.T) {
		j := openTest(t, Config{WaitTimeout: 20 * time.Millisecond})
		_, release := blockSync(j)
		defer close(release)
		e := testEntry("T1")
		start := time.Now()
		assert.ErrorIs(t, j.Append(&e), ErrWaitTimeout)
		assert.Less(t, time.Since(start), 5*time.Second)
	})
	t.Run("closed", func(t *testing.T) {
		j := openTest(t, Config{})
		require.NoError(t, j.Close())
		require.NoError(t, j.Close(), "Close is idempotent")
		e := testEntry("T1")
		assert.ErrorIs(t, j.Append(&e), ErrClosed)
	})
}

func TestOpenFailsOnAPathItCannotWrite(t *testing.T) {
	_, err := Open(Config{Path: filepath.Join(t.TempDir(), "no", "such", "dir", "in-doubt.log")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "in-doubt.log")
}

func TestRing(t *testing.T) {
	r := NewRing(3)
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	txids := func(es []Entry) []string {
		out := []string{}
		for _, e := range es {
			out = append(out, e.TxID)
		}
		return out
	}
	assert.Empty(t, r.Since(time.Time{}))
	for i := range 5 {
		e := testEntry(fmt.Sprintf("T%d", i))
		e.Time = base.Add(time.Duration(i) * time.Second)
		r.Add(e)
	}
	assert.Equal(t, []string{"T2", "T3", "T4"}, txids(r.Since(time.Time{})), "the last three, oldest first")
	assert.Equal(t, []string{"T3", "T4"}, txids(r.Since(base.Add(3*time.Second))), "since is inclusive")
	assert.Empty(t, r.Since(base.Add(time.Hour)))
}

func ExampleJournal() {
	dir, _ := os.MkdirTemp("", "indoubt")
	defer os.RemoveAll(dir)
	j, err := Open(Config{Path: filepath.Join(dir, "in-doubt.log")})
	if err != nil {
		panic(err)
	}
	e := Entry{Time: time.Date(2026, 12, 1, 17, 30, 0, 0, time.UTC), Hub: "hub-a", TxID: "T1", Target: "CORE",
		URL: "http://127.0.0.1:9201", Code: "E901", Stage: "request_sent", BytesSent: 120,
		PayloadSHA256: sha256.Sum256([]byte("BAL 1001"))}
	if err := j.Append(&e); err != nil {
		panic(err)
	}
	_ = j.Close()
	b, _ := os.ReadFile(filepath.Join(dir, "in-doubt.log"))
	fmt.Print(string(b))
	// Output:
	// {"time":"2026-12-01T17:30:00.000Z","hub":"hub-a","txid":"T1","target":"CORE","url":"http://127.0.0.1:9201","code":"E901","stage":"request_sent","bytes_sent":120,"payload_sha256":"14d5894f9127a9a4b636a8421550e2bc2730ee0201eafa02d9aa63be1d8241fc"}
}

func BenchmarkAppend(b *testing.B) {
	for _, callers := range []int{1, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			j, err := Open(Config{Path: filepath.Join(b.TempDir(), "in-doubt.log")})
			require.NoError(b, err)
			defer j.Close()
			b.SetParallelism((callers + 1) / 2) // × GOMAXPROCS; exact when it is 2
			if callers == 1 {
				b.SetParallelism(1)
			}
			b.ReportAllocs()
			b.ResetTimer()
			start := j.syncs.Load()
			if callers == 1 {
				e := testEntry("T1")
				for b.Loop() {
					if err := j.Append(&e); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				b.RunParallel(func(pb *testing.PB) {
					e := testEntry("T1")
					for pb.Next() {
						if err := j.Append(&e); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
			b.ReportMetric(float64(b.N)/float64(max(j.syncs.Load()-start, 1)), "lines/fsync")
		})
	}
}

// TestAppendDoesNotAllocate checks that an append, its line written and
// fsynced, allocates nothing once its pooled buffers are warm: the line's
// buffer, its queue entry and its timer are reused.
func TestAppendDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	j := openTest(t, Config{})
	e := testEntry("T1")
	require.NoError(t, j.Append(&e))
	var failed error
	allocs := testing.AllocsPerRun(50, func() {
		if err := j.Append(&e); err != nil {
			failed = err
		}
	})
	require.NoError(t, failed)
	assert.Zero(t, allocs)
}

func TestSecondOpenOfAJournalIsLocked(t *testing.T) {
	j := openTest(t, Config{})
	_, err := Open(Config{Path: j.Path()})
	require.ErrorIs(t, err, ErrLocked)
	assert.ErrorContains(t, err, j.Path())
	assert.ErrorContains(t, err, "another relay holds it")

	require.NoError(t, j.Close())
	again, err := Open(Config{Path: j.Path()})
	require.NoError(t, err, "Close releases the lock")
	require.NoError(t, again.Close())
}

// TestReopenUnderConcurrentAppends renames the journal and reopens it
// twice while 16 goroutines append: every line is whole in exactly one of
// the three files, and the lines appended after each Reopen returned are
// in the new file.
func TestReopenUnderConcurrentAppends(t *testing.T) {
	const callers, perPhase, rotations = 16, 30, 2
	j := openTest(t, Config{})
	appendPhase := func(phase int) {
		t.Helper()
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				for i := range perPhase {
					e := testEntry(fmt.Sprintf("P%d-C%d-%d", phase, c, i))
					assert.NoError(t, j.Append(&e))
				}
			})
		}
		// Rotate while the phase's appends are under way.
		if phase < rotations {
			require.NoError(t, os.Rename(j.Path(), fmt.Sprintf("%s.%d", j.Path(), phase)))
			require.NoError(t, j.Reopen())
		}
		wg.Wait()
	}
	for phase := range rotations + 1 {
		appendPhase(phase)
	}
	last := testEntry("LAST")
	require.NoError(t, j.Append(&last))

	seen := make(map[string]string) // txid → file
	files := []string{j.Path() + ".0", j.Path() + ".1", j.Path()}
	for _, path := range files {
		for _, l := range logtest.FileLines(t, path) {
			txid := l["txid"].(string)
			if prev, ok := seen[txid]; ok {
				t.Errorf("%s in %s and in %s", txid, prev, path)
			}
			seen[txid] = path
		}
	}
	assert.Len(t, seen, (rotations+1)*callers*perPhase+1, "every line in one of the files")
	assert.Equal(t, j.Path(), seen["LAST"], "after the Reopens, lines go to the new file")
	for i := range callers {
		assert.NotEqual(t, files[0], seen[fmt.Sprintf("P2-C%d-0", i)], "a line appended after a Reopen returned is not in the first file")
	}

	_, err := Open(Config{Path: j.Path()})
	assert.ErrorIs(t, err, ErrLocked, "the lock moved to the new file")
	old, err := Open(Config{Path: files[0]})
	require.NoError(t, err, "the renamed file is free")
	require.NoError(t, old.Close())
}

func TestReopen(t *testing.T) {
	t.Run("nothing renamed", func(t *testing.T) {
		j := openTest(t, Config{})
		e := testEntry("T1")
		require.NoError(t, j.Append(&e))
		require.NoError(t, j.Reopen())
		e = testEntry("T2")
		require.NoError(t, j.Append(&e))
		assert.Len(t, logtest.FileLines(t, j.Path()), 2)
		_, err := Open(Config{Path: j.Path()})
		assert.ErrorIs(t, err, ErrLocked, "still held")
	})
	t.Run("the new file held by another", func(t *testing.T) {
		j := openTest(t, Config{})
		require.NoError(t, os.Rename(j.Path(), j.Path()+".1"))
		other, err := Open(Config{Path: j.Path()})
		require.NoError(t, err)
		t.Cleanup(func() { _ = other.Close() })
		err = j.Reopen()
		require.ErrorIs(t, err, ErrLocked)
		assert.ErrorContains(t, err, j.Path())
		e := testEntry("T1")
		require.NoError(t, j.Append(&e))
		assert.Len(t, logtest.FileLines(t, j.Path()+".1"), 1, "the journal goes on in the file it had")
	})
	t.Run("after close", func(t *testing.T) {
		j := openTest(t, Config{})
		require.NoError(t, j.Close())
		require.NoError(t, os.Rename(j.Path(), j.Path()+".1"))
		assert.ErrorIs(t, j.Reopen(), os.ErrClosed)
		again, err := Open(Config{Path: j.Path()})
		require.NoError(t, err, "a closed journal's Reopen holds no file")
		require.NoError(t, again.Close())
	})
}

func TestResolutionLinesSayVia(t *testing.T) {
	tests := []struct {
		name, stage, via, want string
	}{
		{"applied on resend, written before via existed", StageResolvedApplied, "", `"via":"resend"`},
		{"applied by a look-up", StageResolvedApplied, ViaLookup, `"via":"lookup"`},
		{"not applied", StageResolvedNotApplied, ViaLookup, `"via":"lookup"`},
		{"reversed", StageResolvedReversed, ViaReversal, `"via":"reversal"`},
		{"expired", StageUnresolvedExpired, ViaLookup, `"via":"lookup"`},
		{"settled by an operator", StageResolvedNotApplied, ViaOperator, `"via":"operator"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := resolvedEntry("T1", "0000")
			e.Stage, e.Via = tt.stage, tt.via
			line := e.AppendJSON(nil)
			var got map[string]any
			require.NoError(t, json.Unmarshal(line, &got))
			assert.Contains(t, string(line), tt.want)
			assert.Equal(t, tt.stage, got["stage"])
		})
	}
	t.Run("an in-doubt line has no via", func(t *testing.T) {
		e := testEntry("T1")
		e.Via = ViaLookup
		assert.NotContains(t, string(e.AppendJSON(nil)), "via")
	})
}
