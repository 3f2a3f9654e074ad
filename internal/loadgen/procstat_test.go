package loadgen

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseStatCPU(t *testing.T) {
	tests := []struct {
		name    string
		stat    string
		want    time.Duration
		wantErr string
	}{
		{
			name: "plain command",
			stat: "4242 (relay) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 75 0 0 20 0 9 0 100 0 0",
			want: 3250 * time.Millisecond, // (250 + 75) ticks of 10ms
		},
		{
			name: "command with spaces and parentheses",
			stat: "7 (a) b (c) R 1 7 7 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 5 0 0",
			want: 30 * time.Millisecond,
		},
		{name: "no command", stat: "4242 relay S 1", wantErr: "no command name"},
		{name: "cut short", stat: "1 (x) S 1 2 3", wantErr: "too few fields"},
		{name: "not a number", stat: "1 (x) S 1 1 1 0 -1 0 0 0 0 0 x 2 0", wantErr: "field 14"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStatCPU([]byte(tt.stat))
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseVmRSS(t *testing.T) {
	tests := []struct {
		name    string
		status  string
		want    int64
		wantErr string
	}{
		{"status file", "Name:\trelay\nVmPeak:\t  900 kB\nVmRSS:\t   12345 kB\nThreads:\t9\n", 12345, ""},
		{"no VmRSS", "Name:\tkthreadd\nThreads:\t1\n", 0, "no VmRSS"},
		{"odd unit", "VmRSS:\t12 MB\n", 0, "VmRSS line"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseVmRSS([]byte(tt.status))
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseMachineBusy(t *testing.T) {
	// user 100, nice 1, system 50, idle 9000, iowait 20, irq 2, softirq 30,
	// steal 7: busy is everything but idle and iowait.
	got, err := parseMachineBusy([]byte("cpu  100 1 50 9000 20 2 30 7 0 0\ncpu0 50 0 25 4500 10 1 15 3 0 0\n"))
	require.NoError(t, err)
	assert.Equal(t, 1900*time.Millisecond, got)

	_, err = parseMachineBusy([]byte("intr 1 2 3\n"))
	assert.ErrorContains(t, err, "no cpu line")
}

func TestProcessReadingsOfThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc on this system")
	}
	rss, err := processRSS(os.Getpid())
	require.NoError(t, err)
	assert.Positive(t, rss, "a running Go test has resident memory")

	m, err := startCPUMeter([]int{os.Getpid()})
	require.NoError(t, err)
	use, err := m.stop()
	require.NoError(t, err)
	require.Len(t, use, 1)
	assert.Equal(t, os.Getpid(), use[0].PID)
	assert.GreaterOrEqual(t, use[0].CPU, time.Duration(0))
}

func TestProcessReadingsOfMissingProcess(t *testing.T) {
	// Pid numbers stop well below this (pid_max is at most 2^22).
	const nobody = 1 << 30
	_, err := startCPUMeter([]int{nobody})
	assert.ErrorContains(t, err, "cpu time of pid 1073741824")
	_, err = processRSS(nobody)
	assert.ErrorContains(t, err, "rss of pid 1073741824")
}

func TestNewCPUSummary(t *testing.T) {
	s := newCPUSummary(42, 1500*time.Millisecond, 300_000, 5*time.Second)
	assert.Equal(t, 42, s.PID)
	assert.InDelta(t, 1.5, s.Seconds, 1e-9)
	assert.InDelta(t, 5.0, s.PerAnswer, 1e-9, "1.5s over 300000 answers is 5µs each")
	assert.InDelta(t, 0.3, s.Utilisation, 1e-9)

	assert.Equal(t, CPUSummary{PID: 1}, newCPUSummary(1, 0, 0, 0), "no answers, no division by zero")
}
