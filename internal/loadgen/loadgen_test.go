package loadgen

import (
	"context"
	"math"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/fakerelay"
)

// testLoadConfig returns a small closed-loop run against addr; tests adjust
// it. The drain is short because a test that expects a missing answer
// waits it out.
func testLoadConfig(t testing.TB, addr string) Config {
	t.Helper()
	m, err := ParseMix("CORE=100")
	require.NoError(t, err)
	p, err := ParseTemplate("BAL ACC{conn}")
	require.NoError(t, err)
	return Config{
		Addr:     addr,
		Conns:    4,
		Depth:    1,
		Requests: 200,
		Mix:      m,
		Payloads: []Template{p},
		Drain:    300 * time.Millisecond,
		Seed:     1,
	}
}

// newGenerator returns a Generator for cfg, failing the test when New
// refuses it.
func newGenerator(t testing.TB, cfg Config) *Generator {
	t.Helper()
	g, err := New(cfg)
	require.NoError(t, err)
	return g
}

func runTestLoad(t *testing.T, cfg Config) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	res, err := newGenerator(t, cfg).Run(ctx)
	require.NoError(t, err)
	require.NoError(t, ctx.Err(), "the run must end on its own")
	return res
}

func sumCodes(res *Result) int64 {
	var n int64
	for _, m := range res.Codes {
		for _, c := range m {
			n += c
		}
	}
	return n
}

func TestLoadCountsAnswers(t *testing.T) {
	tests := []struct {
		name  string
		conns int
		depth int
	}{
		{"closed loop, one in flight", 4, 1},
		{"pipelined", 4, 8},
		{"one connection, deep", 1, 64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := fakerelay.New(t, fakerelay.Config{})
			cfg := testLoadConfig(t, f.Addr)
			cfg.Conns, cfg.Depth, cfg.Requests = tt.conns, tt.depth, 512

			res := runTestLoad(t, cfg)

			assert.Equal(t, int64(512), res.Sent)
			assert.Equal(t, int64(512), res.Answered)
			assert.Equal(t, int64(512), f.Lines(), "the relay saw every request once")
			assert.Equal(t, int64(512), res.Hist.TotalCount(), "one latency per answer")
			assert.Equal(t, map[string]int64{"0000": 512}, res.Codes[0])
			assert.Zero(t, res.Unmatched+res.Missing+res.Malformed+res.ConnErrors)
			assert.Positive(t, res.Elapsed)
		})
	}
}

func TestLoadMatchesOutOfOrderAnswers(t *testing.T) {
	// Given a relay that answers every 4 requests newest first
	f := fakerelay.New(t, fakerelay.Config{Hold: 4})
	cfg := testLoadConfig(t, f.Addr)
	cfg.Conns, cfg.Depth, cfg.Requests = 1, 4, 400

	// When the load keeps 4 in flight
	res := runTestLoad(t, cfg)

	// Then every answer is matched by TXID, not by position
	assert.Equal(t, int64(100), f.Reordered(), "the relay did answer out of order")
	assert.Equal(t, int64(400), res.Answered)
	assert.Zero(t, res.Unmatched+res.Missing+res.ConnErrors)
}

func TestLoadCountsMissingAnswer(t *testing.T) {
	// Given a relay that never answers its 10th request
	f := fakerelay.New(t, fakerelay.Config{DropNth: 10})
	cfg := testLoadConfig(t, f.Addr)
	cfg.Conns, cfg.Depth, cfg.Requests = 2, 1, 50

	// When a closed loop sends 50 requests
	res := runTestLoad(t, cfg)

	// Then the connection stuck on it stops, the other sends the rest, and
	// the unanswered request is missing after the drain
	assert.Equal(t, int64(50), res.Sent)
	assert.Equal(t, int64(49), res.Answered)
	assert.Equal(t, int64(1), res.Missing)
	assert.Zero(t, res.Unmatched+res.ConnErrors)
	assert.GreaterOrEqual(t, res.Wall, cfg.Drain, "the drain was waited out")
}

func TestLoadCountsUnmatchedAndMalformed(t *testing.T) {
	f := fakerelay.New(t, fakerelay.Config{BogusAfterNth: 5, GarbageAfterNth: 7})
	cfg := testLoadConfig(t, f.Addr)
	cfg.Conns, cfg.Depth, cfg.Requests = 2, 2, 100

	res := runTestLoad(t, cfg)

	assert.Equal(t, int64(100), res.Answered)
	assert.Equal(t, int64(1), res.Unmatched)
	assert.Equal(t, int64(1), res.Malformed)
	assert.Zero(t, res.Missing+res.ConnErrors)
}

func TestLoadCountsAnswerForAnotherConnectionAsUnmatched(t *testing.T) {
	// Given a relay that answers every request with the TXID L99-1, which no
	// connection of a 1-connection run has sent
	f := fakerelay.New(t, fakerelay.Config{AnswerTxID: "L99-1"})
	cfg := testLoadConfig(t, f.Addr)
	cfg.Conns, cfg.Depth, cfg.Requests = 1, 4, 4
	cfg.Drain = 50 * time.Millisecond

	res := runTestLoad(t, cfg)

	assert.Equal(t, int64(4), res.Unmatched)
	assert.Equal(t, int64(4), res.Missing)
	assert.Zero(t, res.Answered)
}

func TestLoadCountsConnectionClosedByHub(t *testing.T) {
	// Given a relay that hangs up after answering 5 lines
	f := fakerelay.New(t, fakerelay.Config{CloseAfter: 5})
	cfg := testLoadConfig(t, f.Addr)
	cfg.Conns, cfg.Depth, cfg.Requests = 1, 1, 20

	res := runTestLoad(t, cfg)

	assert.Equal(t, int64(5), res.Answered)
	assert.Equal(t, int64(1), res.ConnErrors)
	assert.Equal(t, res.Sent-res.Answered, res.Missing, "whatever was sent after the close is missing")
	require.Len(t, res.ErrorSamples, 1)
	assert.Contains(t, res.ErrorSamples[0], "conn 1:")
}

func TestLoadNoConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	_, err = newGenerator(t, testLoadConfig(t, addr)).Run(t.Context())
	require.ErrorIs(t, err, ErrDialAll)
	assert.Contains(t, err.Error(), addr)
}

func TestLoadDuration(t *testing.T) {
	f := fakerelay.New(t, fakerelay.Config{})
	cfg := testLoadConfig(t, f.Addr)
	cfg.Requests, cfg.Duration = 0, 200*time.Millisecond
	cfg.Drain = 10 * time.Second // long enough that a needless drain wait cannot hide in noise

	res := runTestLoad(t, cfg)

	assert.Positive(t, res.Answered)
	assert.Equal(t, res.Sent, res.Answered)
	assert.GreaterOrEqual(t, res.Wall, cfg.Duration)
	assert.Less(t, res.Wall, cfg.Duration+cfg.Drain, "no drain wait when everything was answered")
	assert.Zero(t, res.Missing+res.Unmatched+res.ConnErrors)
}

func TestLoadDurationEndsWhileHubIsSilent(t *testing.T) {
	// Given a relay that reads but never answers
	f := fakerelay.New(t, fakerelay.Config{Silent: true})
	cfg := testLoadConfig(t, f.Addr)
	cfg.Conns, cfg.Depth, cfg.Requests, cfg.Duration = 2, 3, 0, 100*time.Millisecond
	cfg.Drain = 100 * time.Millisecond

	// When the duration ends with every writer waiting for a free slot
	res := runTestLoad(t, cfg)

	// Then the run still ends, and everything sent is missing
	assert.Equal(t, int64(6), res.Sent)
	assert.Equal(t, int64(6), res.Missing)
	assert.Zero(t, res.Answered)
}

func TestLoadCancelStopsSending(t *testing.T) {
	f := fakerelay.New(t, fakerelay.Config{})
	cfg := testLoadConfig(t, f.Addr)
	cfg.Requests, cfg.Duration = 0, time.Hour
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	g := newGenerator(t, cfg)
	done := make(chan struct{})
	var res *Result
	var err error
	go func() {
		defer close(done)
		res, err = g.Run(ctx)
	}()
	// Cancel once the run is under way: it must end long before its hour,
	// with everything sent answered.
	for deadline := time.Now().Add(10 * time.Second); f.Lines() < 100; {
		require.True(t, time.Now().Before(deadline), "the run did not start")
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the run did not stop after cancel")
	}
	require.NoError(t, err)
	assert.Positive(t, res.Answered)
	assert.Equal(t, res.Sent, res.Answered)
	assert.Zero(t, res.Missing)
}

func TestLoadMixSendsEachTargetItsPayload(t *testing.T) {
	f := fakerelay.New(t, fakerelay.Config{Code: func(target string) string {
		if target == "CLAIM" {
			return "B204"
		}
		return "0000"
	}})
	cfg := testLoadConfig(t, f.Addr)
	m, err := ParseMix("CORE=3,CLAIM=1")
	require.NoError(t, err)
	cfg.Mix = m
	cfg.Payloads = []Template{cfg.Payloads[0], cfg.Payloads[0]}
	cfg.Requests = 2000

	res := runTestLoad(t, cfg)

	require.Len(t, res.Codes, 2)
	core, claim := res.Codes[0]["0000"], res.Codes[1]["B204"]
	assert.Equal(t, int64(2000), core+claim)
	assert.Equal(t, int64(2000), sumCodes(res), "no other code was counted")
	assert.InDelta(t, 0.75, float64(core)/2000, 0.05)
}

func TestLoadFixedRate(t *testing.T) {
	f := fakerelay.New(t, fakerelay.Config{})
	cfg := testLoadConfig(t, f.Addr)
	cfg.Rate, cfg.Depth, cfg.Requests = 2000, RateDepth, 100

	res := runTestLoad(t, cfg)

	assert.Equal(t, int64(100), res.Answered)
	// Request n is due at n/2000 s, so the last one (n = 99) cannot go out
	// before 49.5ms.
	assert.GreaterOrEqual(t, res.Elapsed, 49*time.Millisecond)
	assert.Zero(t, res.Missing+res.Unmatched+res.ConnErrors)
}

func TestLoadFixedRateMeasuresFromScheduledTime(t *testing.T) {
	// Given a rate of 1e6/s on one connection with one request in flight,
	// so the 2000 requests are all due within 2ms but each waits for the
	// previous answer: the writer falls far behind its schedule
	f := fakerelay.New(t, fakerelay.Config{})
	cfg := testLoadConfig(t, f.Addr)
	cfg.Conns, cfg.Rate, cfg.Depth, cfg.Requests = 1, 1e6, 1, 2000

	res := runTestLoad(t, cfg)

	// Then the latency of the last request runs from when it was due
	// (1.999ms), not from when it could be written, so the backlog shows
	require.Equal(t, int64(2000), res.Answered)
	lastDue := 1999 * time.Microsecond
	require.Greater(t, res.Elapsed, 2*lastDue, "the round trips took longer than the schedule")
	maxLatency := time.Duration(res.Hist.Max()) * time.Microsecond
	assert.GreaterOrEqual(t, maxLatency, (res.Elapsed-lastDue)*99/100)
}

func TestLoadRingSkipsSlotOfSlowRequest(t *testing.T) {
	// Given one request that is never answered while 500 more go through a
	// ring of 4 slots (depth 2), the stuck slot is skipped, never reused.
	f := fakerelay.New(t, fakerelay.Config{DropNth: 1})
	cfg := testLoadConfig(t, f.Addr)
	cfg.Conns, cfg.Depth, cfg.Requests = 1, 2, 501
	cfg.Drain = 50 * time.Millisecond

	res := runTestLoad(t, cfg)

	assert.Equal(t, int64(500), res.Answered)
	assert.Equal(t, int64(1), res.Missing)
	assert.Zero(t, res.Unmatched)
}

func BenchmarkLoad(b *testing.B) {
	for _, depth := range []int{1, 16} {
		b.Run("depth="+strconv.Itoa(depth), func(b *testing.B) {
			f := fakerelay.New(b, fakerelay.Config{})
			cfg := testLoadConfig(b, f.Addr)
			cfg.Conns, cfg.Depth, cfg.Requests = 16, depth, uint64(b.N)
			g := newGenerator(b, cfg)
			b.ReportAllocs()
			b.ResetTimer()
			res, err := g.Run(b.Context())
			b.StopTimer()
			require.NoError(b, err)
			require.Equal(b, int64(b.N), res.Answered)
			b.ReportMetric(float64(res.Answered)/res.Elapsed.Seconds(), "answers/s")
		})
	}
}

func TestNewFillsDefaults(t *testing.T) {
	cfg := testLoadConfig(t, "127.0.0.1:9200")
	cfg.Conns, cfg.Depth, cfg.DialTimeout = 0, 0, 0

	g := newGenerator(t, cfg)

	assert.Equal(t, 1, g.cfg.Conns)
	assert.Equal(t, 1, g.cfg.Depth)
	assert.Equal(t, 5*time.Second, g.cfg.DialTimeout)
	assert.Equal(t, [][]byte{[]byte("|CORE|")}, g.targets)
}

func TestNewKeepsItsOwnCopy(t *testing.T) {
	cfg := testLoadConfig(t, "127.0.0.1:9200")
	cfg.ServerPIDs = []int{42}
	g := newGenerator(t, cfg)

	cfg.ServerPIDs[0] = 43
	cfg.Payloads[0] = Template{}

	assert.Equal(t, []int{42}, g.cfg.ServerPIDs)
	assert.Equal(t, "BAL ACC7", string(g.cfg.Payloads[0].AppendTo(nil, 1, 7)))
}

func TestNewRejects(t *testing.T) {
	tests := []struct {
		name    string
		change  func(*Config)
		wantErr string
	}{
		{"too many connections", func(c *Config) { c.Conns = MaxConns + 1 }, "Conns 10001"},
		{"negative depth", func(c *Config) { c.Depth = -1 }, "Depth -1"},
		{"neither requests nor duration", func(c *Config) { c.Requests, c.Duration = 0, 0 }, "Duration 0s"},
		{"rate not a number", func(c *Config) { c.Rate = math.NaN() }, "Rate NaN"},
		{"rate too high", func(c *Config) { c.Rate = 2 * MaxRate }, "Rate 2e+09"},
		{"negative drain", func(c *Config) { c.Drain = -time.Second }, "Drain -1s"},
		{"negative dial timeout", func(c *Config) { c.DialTimeout = -time.Second }, "DialTimeout -1s"},
		{"unknown protocol", func(c *Config) { c.Protocol = 7 }, "Protocol 7"},
		{"no mix", func(c *Config) { c.Mix, c.Payloads = Mix{}, nil }, "one payload template per target"},
		{"a payload short", func(c *Config) { c.Payloads = nil }, "one payload template per target"},
		{"not a process id", func(c *Config) { c.ServerPIDs = []int{0} }, "ServerPIDs: 0"},
		{"a watch without phases", func(c *Config) { c.Watch = func(context.Context) (float64, error) { return 0, nil } }, "a Watch needs Phases"},
		{"an empty phase", func(c *Config) { c.Phases = []Phase{{Name: "cut"}} }, `phase "cut": Duration 0s`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testLoadConfig(t, "127.0.0.1:9200")
			tt.change(&cfg)

			_, err := New(cfg)

			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}
