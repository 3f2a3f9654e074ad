package relay

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay/protocol"
)

// fakeSink is an answerSink that keeps the answers it is given, as
// response lines, and whether each was to be flushed.
type fakeSink struct {
	mu      sync.Mutex
	lines   []string
	flushed []bool
}

func (f *fakeSink) answer(txid []byte, code string, msg []byte, flush bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lines = append(f.lines, string(protocol.AppendResponse(nil, txid, code, msg)))
	f.flushed = append(f.flushed, flush)
}

func (f *fakeSink) answerText(txid []byte, code, msg string, flush bool) {
	f.answer(txid, code, []byte(msg), flush)
}

func (f *fakeSink) answerRetry(txid []byte, seconds int64, flush bool) {
	f.answer(txid, protocol.CodeCircuitOpen, protocol.AppendRetryHint(nil, seconds), flush)
}

func (f *fakeSink) answerTail(txid []byte, tail protocol.Tail, flush bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lines = append(f.lines, string(tail.AppendAnswer(nil, txid)))
	f.flushed = append(f.flushed, flush)
}

func (f *fakeSink) got() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.lines...)
}

// sinkAdmitter returns an admitter of srv that answers into a fakeSink:
// no connection, no socket.
func sinkAdmitter(srv *Server) (*admitter, *fakeSink) {
	sink := new(fakeSink)
	return &admitter{srv: srv, sink: sink}, sink
}

func request(txid, target, payload string) protocol.Request {
	return protocol.Request{TxID: []byte(txid), Target: []byte(target), Payload: []byte(payload)}
}

func TestAdmitterRefusesWithoutASocket(t *testing.T) {
	t.Run("unknown target E903", func(t *testing.T) {
		// Given an admitter with a fake sink.
		cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
		srv := openCoreServer(t, cfg)
		a, sink := sinkAdmitter(srv)

		// When a request names a target the hub does not have.
		started := a.admit(request("A", "NOPE", "BAL 1"))

		// Then it is answered E903 on the read loop's buffer, and holds nothing.
		assert.False(t, started)
		assert.Equal(t, []string{"A|E903|" + protocol.MsgUnknownTarget + "\n"}, sink.got())
		assert.Equal(t, []bool{false}, sink.flushed)
		assert.Zero(t, srv.serving.activeCalls.Load())
	})
	t.Run("breaker open E904", func(t *testing.T) {
		// Given CORE's breaker open for an hour.
		cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
		srv := openCoreServer(t, cfg)
		a, sink := sinkAdmitter(srv)

		// When a request for CORE is admitted.
		started := a.admit(request("B", "core", "BAL 1"))

		// Then the breaker refuses it with its retry hint.
		assert.False(t, started)
		assert.Equal(t, []string{"B|E904|circuit open; retry after 3600s\n"}, sink.got())
		assert.Zero(t, srv.serving.activeCalls.Load())
	})
	t.Run("bulkhead full E905", func(t *testing.T) {
		// Given CORE's only slot taken.
		cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
		cfg.MaxInflight = 1
		srv, err := New(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, srv.Close()) })
		rt := srv.table.lookup([]byte("CORE"))
		require.True(t, rt.bulkhead.TryAcquire())
		t.Cleanup(rt.bulkhead.Release)
		a, sink := sinkAdmitter(srv)

		// When a request for CORE is admitted.
		started := a.admit(request("C", "CORE", "BAL 1"))

		// Then it is answered E905 and its ticket went back: the breaker
		// counted neither a success nor a failure.
		assert.False(t, started)
		assert.Equal(t, []string{"C|E905|" + protocol.MsgBulkheadFull + "\n"}, sink.got())
		snap := rt.breaker.Snapshot()
		assert.Equal(t, breaker.Closed, snap.State)
		assert.Zero(t, snap.ConsecutiveFailures)
		assert.Equal(t, 1, rt.bulkhead.InFlight(), "only the test's own slot")
		assert.Zero(t, srv.serving.activeCalls.Load())
	})
}

func TestAdmitterStartsACallThatAnswersThroughTheSink(t *testing.T) {
	// Given a target nobody listens on.
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	srv, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, srv.Close()) })
	a, sink := sinkAdmitter(srv)

	// When a request for it is admitted.
	started := a.admit(request("D", "CORE", "BAL 1"))
	a.calls.Wait()

	// Then a call started, answered once, flushed, through the sink, and
	// handed back its slot and its hold.
	require.True(t, started)
	got := sink.got()
	require.Len(t, got, 1)
	assert.Regexp(t, `^D\|E90\d\|`, got[0])
	assert.Equal(t, []bool{true}, sink.flushed)
	assert.Zero(t, srv.table.lookup([]byte("CORE")).bulkhead.InFlight())
	assert.Zero(t, srv.serving.activeCalls.Load())
}
