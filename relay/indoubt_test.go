package relay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
	"github.com/relayhub/relayhub/relay/indoubt"
)

// TestACallInDoubtIsJournalledBeforeItsAnswer: a call that times out after
// its request went out is in the journal, in the recent list, in /status's
// count and in the metric by the time its client reads the E901; a call
// that never reached the target (refused) is in none of them.
func TestACallInDoubtIsJournalledBeforeItsAnswer(t *testing.T) {
	core := hubtest.NewTarget(t, nil)
	core.Set(core.BlockThen(hubtest.AnswerCode("0000", "late")))
	t.Cleanup(core.UnblockAll)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadURL := "http://" + closed.Addr().String()
	require.NoError(t, closed.Close())

	path := filepath.Join(t.TempDir(), "in-doubt.log")
	j, err := indoubt.Open(indoubt.Config{Path: path})
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL}, Target{Name: "CLAIM", URL: deadURL})
	cfg.TargetTimeout = 100 * time.Millisecond
	cfg.InDoubtLog, cfg.Metrics, cfg.HubID = j, m, "hub-test"
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	// When CORE takes the request and never answers in time,
	before := time.Now()
	assert.Equal(t, "T1|E901|no answer within target timeout; outcome unknown", c.Exchange("T1|CORE|XFER 1001 1002 2500").String())

	// then the journal already holds its line,
	lines := logtest.FileLines(t, path)
	require.Len(t, lines, 1)
	l := lines[0]
	assert.Equal(t, "hub-test", l["hub"])
	assert.Equal(t, "T1", l["txid"])
	assert.Equal(t, "CORE", l["target"])
	assert.Equal(t, core.URL, l["url"])
	assert.Equal(t, "E901", l["code"])
	assert.Equal(t, "request_sent", l["stage"])
	assert.Greater(t, l["bytes_sent"], float64(len("XFER 1001 1002 2500")))
	sum := sha256.Sum256([]byte("XFER 1001 1002 2500"))
	assert.Equal(t, hex.EncodeToString(sum[:]), l["payload_sha256"])
	at, err := time.Parse(TimeFormat, l["time"].(string))
	require.NoError(t, err)
	assert.WithinRange(t, at, before.Truncate(time.Millisecond), time.Now())
	// and so do the recent list, the status and the metric.
	recent := srv.InDoubt(time.Time{})
	require.Len(t, recent, 1)
	assert.Equal(t, "T1", recent[0].TxID)
	assert.Empty(t, srv.InDoubt(time.Now().Add(time.Second)))
	assert.Equal(t, int64(1), status(t, srv, "CORE").InDoubt)
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, "relay_in_doubt_total", "target", "CORE"))

	// When CLAIM refuses the connection, twice (the one retry),
	assert.Equal(t, "T2|E902|target unreachable: connection refused; not sent", c.Exchange("T2|CLAIM|SUBMIT P1 100").String())

	// then nothing is in doubt there.
	assert.Len(t, logtest.FileLines(t, path), 1)
	assert.Len(t, srv.InDoubt(time.Time{}), 1)
	assert.Zero(t, status(t, srv, "CLAIM").InDoubt)
	assert.Zero(t, hubtest.MetricValue(t, reg, "relay_in_doubt_total", "target", "CLAIM"))
	assert.Zero(t, hubtest.MetricValue(t, reg, "relay_in_doubt_log_errors_total"))
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, "relay_target_retries_total", "target", "CLAIM"))
	assert.Zero(t, hubtest.MetricValue(t, reg, "relay_target_retries_total", "target", "CORE"))
}

// TestAJournalThatFailsStillAnswers closes the journal under the hub: the
// call in doubt is answered all the same, and the failure counted.
func TestAJournalThatFailsStillAnswers(t *testing.T) {
	core := hubtest.NewTarget(t, nil)
	core.Set(core.BlockThen(hubtest.AnswerCode("0000", "late")))
	t.Cleanup(core.UnblockAll)
	j, err := indoubt.Open(indoubt.Config{Path: filepath.Join(t.TempDir(), "in-doubt.log")})
	require.NoError(t, err)
	require.NoError(t, j.Close())
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	cfg.TargetTimeout = 50 * time.Millisecond
	cfg.InDoubtLog, cfg.Metrics = j, m
	srv, addr := startServer(t, cfg)

	assert.Equal(t, "T1|E901|no answer within target timeout; outcome unknown", hubtest.Dial(t, addr).Exchange("T1|CORE|x").String())
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, "relay_in_doubt_log_errors_total"))
	assert.Len(t, srv.InDoubt(time.Time{}), 1, "still listed")
}

// TestARefusedConnectIsTriedOnceMore has the hub's first connect to CORE
// refused: the transaction is sent once more, on a new connection, and
// reaches the target exactly once.
func TestARefusedConnectIsTriedOnceMore(t *testing.T) {
	core := hubtest.NewTarget(t, hubtest.AnswerCode("0000", "balance=100000"))
	var dials atomic.Int32
	var d net.Dialer
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	cfg.DialTarget = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dials.Add(1) == 1 {
			return nil, &net.OpError{Op: "dial", Net: network, Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
		}
		return d.DialContext(ctx, network, addr)
	}
	srv, addr := startServer(t, cfg)

	assert.Equal(t, "T1|0000|balance=100000", hubtest.Dial(t, addr).Exchange("T1|CORE|BAL 1001").String())
	assert.Equal(t, int32(2), dials.Load())
	assert.Equal(t, 1, core.Calls())
	assert.Zero(t, status(t, srv, "CORE").InDoubt)
}

// TestHubIDDefaultsToTheListener checks the hub's name in its records
// without HubID: HOSTNAME:PORT of its listener.
func TestHubIDDefaultsToTheListener(t *testing.T) {
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	srv, addr := startServer(t, cfg)
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	hubtest.Eventually(t, func() bool { return srv.inDoubt.hubID.Load() != nil }, "Serve names the hub")
	assert.Regexp(t, `^[A-Za-z0-9._:-]+:`+port+`$`, *srv.inDoubt.hubID.Load())
}
