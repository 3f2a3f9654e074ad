package replay

import (
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay"
)

// benchPolicy is the hub's policy in the generated logs: slow calls and
// backoff on, as a hub tuned for its incidents runs.
var benchPolicy = breaker.Policy{FailThreshold: 5, ResetTimeout: 2 * time.Second, SlowCall: 250 * time.Millisecond, MaxResetTimeout: 16 * time.Second}

// writeGenerated writes a generated log of n lines to a file of dir,
// gzipped when zip is set, and returns its path.
func writeGenerated(tb testing.TB, dir string, n int, zip bool) string {
	path := filepath.Join(dir, "access.log")
	if zip {
		path += ".gz"
	}
	f, err := os.Create(path)
	require.NoError(tb, err)
	var w io.Writer = f
	var zw *gzip.Writer
	if zip {
		zw = gzip.NewWriter(f)
		w = zw
	}
	g := &genLog{Policy: relay.TargetSettings{Policy: benchPolicy}, Every: time.Millisecond, Phases: steadyIncident, Lines: n, Seed: 1}
	_, err = io.Copy(w, g)
	require.NoError(tb, err)
	if zw != nil {
		require.NoError(tb, zw.Close())
	}
	require.NoError(tb, f.Close())
	return path
}

// BenchmarkReplayMillionLines replays a generated access log of a million
// lines (a hub at 800 requests a second through repeated incidents, about
// 21 minutes of traffic) from a file, as relayctl replay does: reading,
// parsing, reordering and the breakers, with one set of settings or two.
func BenchmarkReplayMillionLines(b *testing.B) {
	const n = 1_000_000
	for _, bc := range []struct {
		name string
		zip  bool
		sets []Settings
	}{
		{"plain", false, []Settings{settings("replay", benchPolicy)}},
		{"gzip", true, []Settings{settings("replay", benchPolicy)}},
		{"compare", false, []Settings{settings("replay", benchPolicy), settings("compare", breaker.Policy{FailThreshold: 3})}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			path := writeGenerated(b, b.TempDir(), n, bc.zip)
			src, err := FileSource(path)
			require.NoError(b, err)
			b.SetBytes(src.Size)
			var lines int64
			for b.Loop() {
				rep, err := Run(context.Background(), Config{Sets: bc.sets}, []Source{src})
				require.NoError(b, err)
				lines += rep.Lines
			}
			b.ReportMetric(float64(lines)/b.Elapsed().Seconds(), "lines/s")
		})
	}
}

func TestMemoryIsFlatInTheLogsSize(t *testing.T) {
	if testing.Short() {
		t.Skip("replays 220000 lines")
	}
	// The heap in use, after a collection, at every progress call of a
	// replay of a generated log of n lines, read as it is generated.
	peak := func(n int) uint64 {
		var most uint64
		var ms runtime.MemStats
		g := &genLog{Policy: relay.TargetSettings{Policy: benchPolicy}, Every: time.Millisecond, Phases: steadyIncident, Lines: n, Seed: 1}
		_, err := Run(context.Background(), Config{
			Sets:             []Settings{settings("replay", benchPolicy)},
			ReorderWindow:    5 * time.Second,
			ProgressInterval: time.Nanosecond,
			Progress: func(Progress) {
				runtime.GC()
				runtime.ReadMemStats(&ms)
				most = max(most, ms.HeapAlloc)
			},
		}, []Source{readerSource("gen", g)})
		require.NoError(t, err)
		return most
	}
	small, large := peak(20_000), peak(200_000)
	t.Logf("peak heap: %d KiB for 20000 lines, %d KiB for 200000", small>>10, large>>10)
	// Ten times the lines: the reorder window holds the same 5 s of
	// traffic, so the heap stays where it was.
	assert.Less(t, large, small+small/2+(1<<20))
}
