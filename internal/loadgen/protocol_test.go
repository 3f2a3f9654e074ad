package loadgen

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sourcegraph/conc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/fixtures"
	"github.com/relayhub/relayhub/internal/testutil/fakerelay"
)

func TestParseWire(t *testing.T) {
	tests := []struct {
		in      string
		want    Protocol
		wantErr bool
	}{
		{"relay", ProtocolRelay, false},
		{"redis-ping", ProtocolRedisPing, false},
		{"HTTP", ProtocolHTTP, false},
		{"redis", 0, true},
		{"", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseProtocol(tt.in)
			if tt.wantErr {
				assert.ErrorContains(t, err, "want one of relay, redis-ping, http")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.want != ProtocolRelay, got.inOrder())
		})
	}
}

func TestParseRedisReply(t *testing.T) {
	tests := []struct {
		name   string
		line   string
		want   string
		wantOK bool
	}{
		{"status reply", "+PONG\r\n", "PONG", true},
		{"error reply", "-ERR unknown command 'X'\r\n", "ERR", true},
		{"without line ending", "+OK", "OK", true},
		{"bulk reply", "$4\r\n", "", false},
		{"bare plus", "+\r\n", "", false},
		{"empty", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseRedisReply([]byte(tt.line))
			assert.Equal(t, tt.wantOK, ok)
			assert.Equal(t, tt.want, string(got))
		})
	}
}

func TestAppendHTTPRequestIsWhatTheHubSends(t *testing.T) {
	b := appendHTTPRequest(nil, "127.0.0.1:9201", []byte("L3-17"), []byte("XFER A|B 10"))

	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b)))
	require.NoError(t, err)
	assert.Equal(t, http.MethodPost, req.Method)
	assert.Equal(t, "/tx", req.URL.Path)
	assert.Equal(t, "127.0.0.1:9201", req.Host)
	assert.Equal(t, "L3-17", req.Header.Get("X-Tx-Id"))
	assert.Equal(t, "text/plain; charset=utf-8", req.Header.Get("Content-Type"))
	assert.False(t, req.Close, "keep-alive")
	body := new(bytes.Buffer)
	_, err = body.ReadFrom(req.Body)
	require.NoError(t, err)
	assert.Equal(t, "XFER A|B 10", body.String())
}

func TestHTTPAnswerCode(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		want   string
	}{
		{"success", 200, `{"code":"0000","message":"balance=99500"}`, "0000"},
		{"business rejection, spaced", 200, `{ "code" : "B201", "message": "insufficient funds" }`, "B201"},
		{"code after message", 200, `{"message":"x","code":"E500"}`, "E500"},
		{"no code", 200, `{"message":"x"}`, "HTTP200"},
		{"code not a string", 200, `{"code":0}`, "HTTP200"},
		{"code of another length", 200, `{"code":"00000"}`, "HTTP200"},
		{"escaped code", 200, `{"code":"\u0030000"}`, "HTTP200"},
		{"server error", 500, `{"code":"E500","message":"boom"}`, "HTTP500"},
		{"not JSON", 404, "not found", "HTTP404"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, string(httpAnswerCode(tt.status, []byte(tt.body))))
		})
	}
}

// fakeRedis answers every inline PING with +PONG, in order, as redis does,
// and anything else with an error reply. It is safe for concurrent use.
type fakeRedis struct {
	ln    net.Listener
	pings atomic.Int64
	wg    conc.WaitGroup
}

func newFakeRedis(t *testing.T) *fakeRedis {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &fakeRedis{ln: ln}
	f.wg.Go(func() {
		var conns conc.WaitGroup
		defer conns.Wait()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Go(func() { f.serve(nc) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		f.wg.Wait()
	})
	return f
}

func (f *fakeRedis) serve(nc net.Conn) {
	defer nc.Close()
	br, bw := bufio.NewReader(nc), bufio.NewWriter(nc)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		if strings.TrimRight(line, "\r\n") == "PING" {
			f.pings.Add(1)
			_, _ = bw.WriteString("+PONG\r\n")
		} else {
			_, _ = bw.WriteString("-ERR unknown command\r\n")
		}
		if br.Buffered() == 0 && bw.Flush() != nil {
			return
		}
	}
}

func TestLoadRedisPing(t *testing.T) {
	for _, depth := range []int{1, 16} {
		t.Run("depth "+strconv.Itoa(depth), func(t *testing.T) {
			f := newFakeRedis(t)
			cfg := testLoadConfig(t, f.ln.Addr().String())
			cfg.Protocol, cfg.Conns, cfg.Depth, cfg.Requests = ProtocolRedisPing, 4, depth, 1000

			res := runTestLoad(t, cfg)

			assert.Equal(t, int64(1000), f.pings.Load(), "every request was an inline PING")
			assert.Equal(t, int64(1000), res.Answered)
			assert.Equal(t, map[string]int64{"PONG": 1000}, res.Codes[0])
			assert.Equal(t, int64(1000), res.Hist.TotalCount())
			assert.Zero(t, res.Unmatched+res.Missing+res.Malformed+res.ConnErrors)
		})
	}
}

func TestLoadHTTPStraightToFixture(t *testing.T) {
	fx, err := fixtures.New(fixtures.Config{Name: "CORE", Kind: fixtures.KindCore})
	require.NoError(t, err)
	ts := httptest.NewUnstartedServer(fx)
	var conns atomic.Int64
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	ts.Start()
	t.Cleanup(ts.Close)
	m, err := ParseMix("CORE=1,BAD=1")
	require.NoError(t, err)
	good, err := ParseTemplate("BAL ACC{conn}")
	require.NoError(t, err)
	bad, err := ParseTemplate("NOPE {n}")
	require.NoError(t, err)

	cfg := testLoadConfig(t, strings.TrimPrefix(ts.URL, "http://"))
	cfg.Protocol, cfg.Conns, cfg.Depth, cfg.Requests = ProtocolHTTP, 4, 2, 600
	cfg.Mix, cfg.Payloads = m, []Template{good, bad}

	res := runTestLoad(t, cfg)

	assert.Equal(t, int64(600), res.Answered)
	assert.Equal(t, int64(600), fx.Stats().Calls)
	assert.Equal(t, int64(4), conns.Load(), "one keep-alive connection per load connection")
	require.Len(t, res.Codes, 2)
	assert.Equal(t, []string{"0000"}, keys(res.Codes[0]))
	assert.Equal(t, []string{"B204"}, keys(res.Codes[1]), "the payload picked by the mix went out")
	assert.Zero(t, res.Unmatched+res.Missing+res.Malformed+res.ConnErrors)
}

func TestLoadHTTPCountsConnectionClosedByTarget(t *testing.T) {
	// Given a target that closes the connection after every answer
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Connection", "close")
		_, _ = w.Write([]byte(`{"code":"0000","message":"ok"}`))
	}))
	t.Cleanup(ts.Close)
	cfg := testLoadConfig(t, strings.TrimPrefix(ts.URL, "http://"))
	cfg.Protocol, cfg.Conns, cfg.Depth, cfg.Requests = ProtocolHTTP, 1, 1, 5

	res := runTestLoad(t, cfg)

	// Then the first answer counts and the closed connection is an error:
	// a close seen between answers, or a reset when the next request was
	// already on its way
	assert.Equal(t, int64(1), res.Answered)
	assert.Equal(t, int64(1), res.ConnErrors)
	require.NotEmpty(t, res.ErrorSamples)
	assert.Regexp(t, `^conn 1: (connection closed by the target|.*connection reset by peer)$`, res.ErrorSamples[0])
}

func TestReadCapped(t *testing.T) {
	got, err := readCapped(strings.NewReader("0123456789"), nil, 10)
	require.NoError(t, err)
	assert.Equal(t, "0123456789", string(got))

	_, err = readCapped(strings.NewReader("0123456789A"), nil, 10)
	assert.ErrorContains(t, err, "over 10 bytes")

	boom := errors.New("boom")
	_, err = readCapped(errReader{boom}, nil, 10)
	assert.ErrorIs(t, err, boom)
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

func keys(m map[string]int64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestLoadMeasuresServerCPU(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc on this system")
	}
	f := fakerelay.New(t, fakerelay.Config{})

	t.Run("a running server", func(t *testing.T) {
		// The fake relay runs in this process, so its pid is ours.
		cfg := testLoadConfig(t, f.Addr)
		cfg.ServerPIDs = []int{os.Getpid()}

		res := runTestLoad(t, cfg)

		require.Len(t, res.ServerCPU, 1)
		assert.Equal(t, os.Getpid(), res.ServerCPU[0].PID)
		assert.Empty(t, res.ErrorSamples)
		assert.Positive(t, res.MeterWall, "the machine's CPU time was read too")
	})
	t.Run("a server that does not exist", func(t *testing.T) {
		cfg := testLoadConfig(t, f.Addr)
		cfg.ServerPIDs = []int{1 << 30}

		_, err := newGenerator(t, cfg).Run(t.Context())

		assert.ErrorContains(t, err, "cpu time of pid 1073741824")
	})
}

func TestLoadKeepsLatencyOfProcessedTransactionsApart(t *testing.T) {
	// Given a hub that processes CORE (0000) and refuses CLAIM (E905)
	f := fakerelay.New(t, fakerelay.Config{Code: func(target string) string {
		if target == "CLAIM" {
			return "E905"
		}
		return "0000"
	}})
	cfg := testLoadConfig(t, f.Addr)
	m, err := ParseMix("CORE=1,CLAIM=1")
	require.NoError(t, err)
	cfg.Mix, cfg.Payloads, cfg.Requests = m, []Template{cfg.Payloads[0], cfg.Payloads[0]}, 1000

	res := runTestLoad(t, cfg)

	// Then every answer is in Hist and only the processed ones in OKHist
	assert.Equal(t, int64(1000), res.Hist.TotalCount())
	assert.Equal(t, res.Codes[0]["0000"], res.OKHist.TotalCount())
	assert.Positive(t, res.Codes[1]["E905"])
	sum := newGenerator(t, cfg).Summary(res)
	assert.Equal(t, res.Codes[0]["0000"], sum.OKAnswered)
}
