package relay

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/relay/protocol"
)

func TestSnapshotHoldsTheLastFailedCall(t *testing.T) {
	// Given a target that answers (it fails at most twice in a row below,
	// under the default threshold of 5, so the breaker stays closed),
	core := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	// when it has only succeeded and refused business, no failure is held;
	assert.Equal(t, "T1|0000|got x", c.Exchange("T1|CORE|x").String())
	core.Set(hubtest.AnswerCode("B201", "insufficient funds"))
	assert.Equal(t, "T2|B201|insufficient funds", c.Exchange("T2|CORE|x").String())
	assert.Zero(t, status(t, srv, "CORE").LastFailure)

	// when it fails with a message holding markup and control characters,
	// the failure is held with the message as the client got it;
	before := time.Now()
	core.Set(hubtest.AnswerCode("E500", "<script>alert(1)</script>\r\nT9|0000|forged"))
	assert.Equal(t, "T3|E500|<script>alert(1)</script>  T9|0000|forged", c.Exchange("T3|CORE|x").String())
	lf := status(t, srv, "CORE").LastFailure
	assert.Equal(t, "E500", lf.Code)
	assert.Equal(t, "<script>alert(1)</script>  T9|0000|forged", lf.Message)
	assert.False(t, lf.At.Before(before.Truncate(time.Nanosecond)), "At %v is before the call %v", lf.At, before)
	assert.False(t, lf.At.After(time.Now()))

	// when the same failure comes again, only its time moves;
	first := lf.At
	assert.Contains(t, c.Exchange("T4|CORE|x").String(), "|E500|")
	assert.False(t, status(t, srv, "CORE").LastFailure.At.Before(first))

	// when a success follows, the failure stays; a different failure
	// replaces it.
	core.Set(hubtest.Echo)
	assert.Equal(t, "T5|0000|got x", c.Exchange("T5|CORE|x").String())
	assert.Equal(t, "E500", status(t, srv, "CORE").LastFailure.Code)
	core.Set(hubtest.AnswerStatus(503))
	assert.Contains(t, c.Exchange("T6|CORE|x").String(), "|E500|target failed: HTTP 503")
	assert.Equal(t, "target failed: HTTP 503: injected", status(t, srv, "CORE").LastFailure.Message)
}

func TestLastFailureCutsLongMessages(t *testing.T) {
	var lf lastFailure
	lf.record("E500", []byte(strings.Repeat("é", protocol.MaxMessageBytes)), time.Unix(100, 0))
	got := lf.load()
	assert.LessOrEqual(t, len(got.Message), protocol.MaxMessageBytes)
	assert.Equal(t, strings.Repeat("é", protocol.MaxMessageBytes/2), got.Message)
	assert.Equal(t, time.Unix(100, 0), got.At)
}

// TestRepeatedFailureNoteDoesNotAllocate checks that a target failing the
// same way on every call adds no garbage per call.
func TestRepeatedFailureNoteDoesNotAllocate(t *testing.T) {
	var lf lastFailure
	msg := []byte("target unreachable: connection refused")
	now := time.Unix(100, 0)
	lf.record(protocol.CodeUnreachable, msg, now)
	allocs := testing.AllocsPerRun(100, func() {
		now = now.Add(time.Millisecond)
		lf.record(protocol.CodeUnreachable, msg, now)
	})
	require.Zero(t, allocs)
	assert.Equal(t, now, lf.load().At)
}
