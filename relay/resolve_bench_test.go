package relay

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay/indoubt"
)

// writeJournal writes a journal of pairs settled transactions (an
// in-doubt line and its resolution each) and open ones still in doubt,
// all of target CORE at url, and returns its path.
func writeJournal(b *testing.B, url string, pairs, open int) string {
	path := filepath.Join(b.TempDir(), "in-doubt.log")
	f, err := os.Create(path)
	require.NoError(b, err)
	w := bufio.NewWriter(f)
	at := time.Now().Add(-time.Hour)
	var line []byte
	put := func(e indoubt.Entry) {
		line = append(e.AppendJSON(line[:0]), '\n')
		_, err := w.Write(line)
		require.NoError(b, err)
	}
	for i := range pairs {
		txid := fmt.Sprintf("S%d", i)
		put(indoubt.Entry{Time: at, Hub: "hub-a", TxID: txid, Target: "CORE", URL: url, Code: "E901", Stage: "request_sent", BytesSent: 200})
		put(indoubt.Entry{Time: at, Hub: "hub-a", TxID: txid, Target: "CORE", URL: url, Code: "0000", Stage: indoubt.StageResolvedApplied, Via: indoubt.ViaLookup})
	}
	for i := range open {
		put(indoubt.Entry{Time: at, Hub: "hub-a", TxID: fmt.Sprintf("O%d", i), Target: "CORE", URL: url, Code: "E901", Stage: "request_sent", BytesSent: 200})
	}
	require.NoError(b, w.Flush())
	require.NoError(b, f.Close())
	return path
}

// BenchmarkTakeUpAtStart times New on a journal of 1 000 000 lines, 10 000
// of them transactions still open, which New takes up, and reports the
// heap they hold once taken up, per open entry.
func BenchmarkTakeUpAtStart(b *testing.B) {
	const url, open = "http://127.0.0.1:9201", 10_000
	path := writeJournal(b, url, (1_000_000-open)/2, open)
	var held float64
	for b.Loop() {
		j, err := indoubt.Open(indoubt.Config{Path: path})
		require.NoError(b, err)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		srv, err := New(Config{Targets: []Target{{Name: "CORE", URL: url, StatusURL: url + "/tx/{txid}"}},
			TargetSettings: TargetSettings{Dedup: true}, InDoubtLog: j})
		require.NoError(b, err)
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		require.Len(b, srv.OpenInDoubt(), open)
		held = float64(after.HeapAlloc-before.HeapAlloc) / open
		require.NoError(b, srv.Close())
		require.NoError(b, j.Close())
		b.StartTimer()
	}
	b.ReportMetric(held, "heap-B/open-entry")
}

// BenchmarkIdleOpenEntries reports the CPU a hub spends a second, and the
// heap it holds, with 10 000 transactions in doubt open at a target whose
// breaker is held open, so that each waits and is looked at again every
// ResolveAfter (5 s).
func BenchmarkIdleOpenEntries(b *testing.B) {
	const url, open = "http://127.0.0.1:9201", 10_000
	path := writeJournal(b, url, 0, open)
	j, err := indoubt.Open(indoubt.Config{Path: path})
	require.NoError(b, err)
	b.Cleanup(func() { _ = j.Close() })
	srv, err := New(Config{Targets: []Target{{Name: "CORE", URL: url, StatusURL: url + "/tx/{txid}"}},
		TargetSettings: TargetSettings{Dedup: true}, InDoubtLog: j})
	require.NoError(b, err)
	b.Cleanup(func() { _ = srv.Close() })
	_, err = srv.ControlBreaker("CORE", ActionOpen)
	require.NoError(b, err)
	require.Len(b, srv.OpenInDoubt(), open)
	var cpu time.Duration
	for b.Loop() {
		start := processCPU(b)
		time.Sleep(time.Second)
		cpu += processCPU(b) - start
	}
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/s")
}

// processCPU is the CPU time the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
