package relay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
)

func TestAccessLogRecordsEveryAnswer(t *testing.T) {
	// Given an access log and a target that fails on "fail".
	core := hubtest.NewTarget(t, func(w http.ResponseWriter, r *http.Request, p []byte) {
		if string(p) == "fail" {
			hubtest.AnswerStatus(500)(w, r, p)
			return
		}
		hubtest.Echo(w, r, p)
	})
	var out logtest.Buffer
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	cfg.AccessLog = &out
	cfg.FailThreshold = 1
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	// When lines of every kind are answered,
	for _, line := range []string{"T1|core|hello", "T2|NOPE|xy", "junk", "T3|CORE|fail", "T4|CORE|late"} {
		c.Exchange(line)
	}
	// then Shutdown writes out the whole log, one line per answer, in order.
	c.Conn().Close()
	ctx, cancel := context.WithTimeout(context.Background(), hubtest.IOTimeout)
	defer cancel()
	require.NoError(t, srv.Shutdown(ctx))

	lines := out.Lines(t)
	require.Len(t, lines, 5)
	want := []map[string]any{
		{"txid": "T1", "target": "CORE", "code": "0000", "bytes": 5.0},
		{"txid": "T2", "target": "NOPE", "code": "E903", "bytes": 2.0, "duration_ms": 0.0},
		{"txid": "-", "code": "E900", "bytes": 0.0, "duration_ms": 0.0},
		{"txid": "T3", "target": "CORE", "code": "E500", "bytes": 4.0},
		{"txid": "T4", "target": "CORE", "code": "E904", "bytes": 4.0, "duration_ms": 0.0},
	}
	for i, l := range lines {
		assert.Subset(t, l, want[i], "line %d", i)
		assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`, l["time"])
	}
	assert.NotContains(t, lines[2], "target")
	assert.Greater(t, lines[0]["duration_ms"], 0.0, "a call has its duration")
	assert.Greater(t, lines[3]["duration_ms"], 0.0)
}

// gateWriter blocks every Write until release is closed, after telling
// entered about the first. Safe for concurrent use.
type gateWriter struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
	out     logtest.Buffer
}

func (g *gateWriter) Write(p []byte) (int, error) {
	g.once.Do(func() { close(g.entered) })
	<-g.release
	return g.out.Write(p)
}

func TestAccessLogDropsRatherThanBlockAnswers(t *testing.T) {
	// Given an access log of queue 4 whose writer is stuck in a write.
	gate := &gateWriter{entered: make(chan struct{}), release: make(chan struct{})}
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.AccessLog, cfg.AccessLogQueue = gate, 4
	reg := withMetrics(t, &cfg)
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	c.Exchange("first|NOPE|x")
	select {
	case <-gate.entered:
	case <-time.After(hubtest.IOTimeout):
		t.Fatal("the writer never wrote")
	}

	// When 100 more lines are answered,
	const n = 100
	lines := make([]string, n)
	for i := range lines {
		lines[i] = fmt.Sprintf("D%d|NOPE|x", i)
	}
	c.Send(lines...)
	for range n {
		c.ReadResponse()
	}

	// then every answer came at once, 4 lines wait in the queue and the
	// other 96 were dropped and counted;
	assert.Equal(t, float64(n-4), hubtest.MetricValue(t, reg, metricAccessLogDropped))

	// and once the writer is free, Close writes the rest.
	close(gate.release)
	require.NoError(t, srv.Close())
	assert.Len(t, gate.out.Lines(t), 5)
}

// flakyWriter fails while failing is set. Safe for concurrent use.
type flakyWriter struct {
	failing atomic.Bool
	out     logtest.Buffer
}

func (f *flakyWriter) Write(p []byte) (int, error) {
	if f.failing.Load() {
		return 0, errors.New("disk full")
	}
	return f.out.Write(p)
}

func TestAccessLogWriteErrorsAreCountedAndLoggedOnce(t *testing.T) {
	var logs logtest.Buffer
	w := &flakyWriter{}
	w.failing.Store(true)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.AccessLog = w
	cfg.Logger = zerolog.New(&logs)
	reg := withMetrics(t, &cfg)
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	// While the writer fails, lines are lost, counted, and logged once.
	c.Exchange("lost1|NOPE|x")
	hubtest.Eventually(t, func() bool { return hubtest.MetricValue(t, reg, metricAccessLogDropped) == 1 }, "first lost line not counted")
	c.Exchange("lost2|NOPE|x")
	hubtest.Eventually(t, func() bool { return hubtest.MetricValue(t, reg, metricAccessLogDropped) == 2 }, "second lost line not counted")
	assert.Len(t, withMessage(logs.Lines(t), "access log write failed; lines are dropped until a write succeeds"), 1)

	// Once it works again, the log resumes.
	w.failing.Store(false)
	c.Exchange("kept|NOPE|x")
	require.NoError(t, srv.Close())
	lines := w.out.Lines(t)
	require.Len(t, lines, 1)
	assert.Equal(t, "kept", lines[0]["txid"])
	assert.Len(t, withMessage(logs.Lines(t), "access log writes succeed again"), 1)
}

func TestAccessLogSaysWhatTheBreakerDid(t *testing.T) {
	// Given a breaker that opens on one failure, a bulkhead of one, and a
	// target whose calls take 7 ms on the breakers' fake clock: it fails
	// "fail" and holds "hold" until released.
	var core *hubtest.Target
	cfg, clk := testConfig(t)
	core = hubtest.NewTarget(t, func(w http.ResponseWriter, r *http.Request, p []byte) {
		clk.Advance(7 * time.Millisecond)
		switch string(p) {
		case "fail":
			hubtest.AnswerStatus(500)(w, r, p)
		case "hold":
			core.BlockThen(hubtest.Echo)(w, r, p)
		default:
			hubtest.Echo(w, r, p)
		}
	})
	cfg.Targets = []Target{{Name: "CORE", URL: core.URL}}
	var out logtest.Buffer
	cfg.AccessLog = &out
	cfg.FailThreshold, cfg.ResetTimeout, cfg.MaxInflight = 1, 10*time.Second, 1
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	t0 := clk.Now()

	// When a call succeeds, one fails and opens the breaker, one is refused,
	// the reset timeout passes and the probe closes the breaker, a call is
	// held while another finds the bulkhead full, and a line names no
	// target,
	c.Exchange("ok|CORE|x")
	c.Exchange("bad|CORE|fail")
	clk.Advance(time.Second)
	c.Exchange("no|CORE|x")
	clk.Advance(10 * time.Second)
	c.Exchange("probe|CORE|x")
	c.Send("held|CORE|hold")
	core.WaitEntered(t, 1)
	c.Exchange("full|CORE|x")
	core.UnblockAll()
	c.ReadResponse()
	c.Exchange("lost|NOPE|x")
	require.NoError(t, srv.Close())

	// then each line says what the breaker did and when, on its clock, to
	// the nanosecond; a line that reached no breaker says nothing of it.
	stamp := func(d time.Duration) string { return t0.Add(d).UTC().Format(StampFormat) }
	lines := out.Lines(t)
	require.Len(t, lines, 7)
	want := []map[string]any{
		{"txid": "ok", "code": "0000", "breaker": "admitted", "start": stamp(0), "end": stamp(7 * time.Millisecond)},
		{"txid": "bad", "code": "E500", "breaker": "admitted", "start": stamp(7 * time.Millisecond), "end": stamp(14 * time.Millisecond)},
		{"txid": "no", "code": "E904", "breaker": "refused", "start": stamp(1014 * time.Millisecond)},
		{"txid": "probe", "code": "0000", "breaker": "admitted", "probe": true, "start": stamp(11014 * time.Millisecond), "end": stamp(11021 * time.Millisecond)},
		{"txid": "full", "code": "E905", "breaker": "handed_back", "start": stamp(11028 * time.Millisecond)},
		{"txid": "held", "code": "0000", "breaker": "admitted", "start": stamp(11021 * time.Millisecond)},
		{"txid": "lost", "code": "E903"},
	}
	for i, l := range lines {
		assert.Subset(t, l, want[i], "line %d", i)
	}
	for _, i := range []int{2, 4, 6} {
		assert.NotContains(t, lines[i], "end", "line %d: no result went to the breaker", i)
	}
	for _, i := range []int{0, 1, 2, 4, 5, 6} {
		assert.NotContains(t, lines[i], "probe", "line %d", i)
	}
	assert.NotContains(t, lines[6], "breaker")
	assert.NotContains(t, lines[6], "start")
}

func TestAccessLogDurationIsToTheNanosecond(t *testing.T) {
	// duration_ms keeps every nanosecond of the duration the breaker was
	// given, so a replay's slow-call policy judges exactly the same value.
	var out logtest.Buffer
	a := newAccessLog(&out, 4, nil, zerolog.Nop(), nil)
	done := make(chan struct{})
	go func() { a.writeLoop(); close(done) }()
	took := 1843217 * time.Nanosecond
	a.record(accessNote{txid: []byte("T1"), target: []byte("CORE"), code: "0000", took: took})
	a.close()
	<-done
	lines := out.Lines(t)
	require.Len(t, lines, 1)
	ms, ok := lines[0]["duration_ms"].(float64)
	require.True(t, ok)
	assert.Equal(t, took, time.Duration(math.Round(ms*float64(time.Millisecond))))
}
